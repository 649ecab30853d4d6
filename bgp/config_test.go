package bgp

import (
	"bytes"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func validConfig() Config {
	return Config{
		ASN:        65010,
		RouterID:   netip.MustParseAddr("198.18.0.10"),
		ListenPort: 179,
		Peers: []Peer{
			{Address: netip.MustParseAddr("198.18.0.1"), ASN: 65000},
			{Address: netip.MustParseAddr("2001:db8::1"), ASN: 65010, Port: 1179, Passive: true},
		},
	}
}

func TestConfigValidate(t *testing.T) {
	addr := netip.MustParseAddr
	tests := []struct {
		name string
		mod  func(*Config)
		want []string // substrings of the error, one per problem; none = valid
	}{
		{"valid", func(*Config) {}, nil},
		{"valid no peers no listener", func(c *Config) { c.Peers, c.ListenPort = nil, 0 }, nil},
		{"valid next hops", func(c *Config) { c.NextHop, c.NextHop6 = addr("198.18.0.10"), addr("2001:db8::10") }, nil},
		{"valid timers", func(c *Config) { c.HoldTime, c.ConnectRetry, c.WithdrawGrace = 3*time.Second, time.Second, 0 }, nil},
		{"no asn", func(c *Config) { c.ASN = 0 }, []string{"asn: missing"}},
		{"as_trans", func(c *Config) { c.ASN = 23456 }, []string{"asn: 23456 is AS_TRANS"}},
		{"no router id", func(c *Config) { c.RouterID = netip.Addr{} }, []string{"router_id: missing"}},
		{"v6 router id", func(c *Config) { c.RouterID = addr("2001:db8::1") }, []string{"router_id: 2001:db8::1 is not an IPv4"}},
		{"zero router id", func(c *Config) { c.RouterID = addr("0.0.0.0") }, []string{"router_id: 0.0.0.0"}},
		{"listen port", func(c *Config) { c.ListenPort = 70000 }, []string{"listen_port: 70000"}},
		{"listen addresses without port", func(c *Config) {
			c.ListenPort, c.Peers = 0, nil
			c.ListenAddresses = []netip.Addr{addr("198.18.0.10")}
		}, []string{"listen_addresses: set without a listen_port"}},
		{"listen address twice", func(c *Config) { c.ListenAddresses = []netip.Addr{addr("198.18.0.10"), addr("198.18.0.10")} },
			[]string{"listen_addresses[1]: 198.18.0.10 listed twice"}},
		{"hold time short", func(c *Config) { c.HoldTime = 2 * time.Second }, []string{"hold_time: 2s"}},
		{"hold time fraction", func(c *Config) { c.HoldTime = 3500 * time.Millisecond }, []string{"hold_time: 3.5s"}},
		{"connect retry", func(c *Config) { c.ConnectRetry = 500 * time.Millisecond }, []string{"connect_retry: 500ms"}},
		{"grace", func(c *Config) { c.WithdrawGrace = -time.Second }, []string{"withdraw_grace: -1s is negative"}},
		{"next hop v6", func(c *Config) { c.NextHop = addr("2001:db8::10") }, []string{"next_hop: 2001:db8::10 is not a unicast IPv4"}},
		{"next hop6 v4", func(c *Config) { c.NextHop6 = addr("198.18.0.10") }, []string{"next_hop6: 198.18.0.10 is not a global unicast IPv6"}},
		{"next hop6 link-local", func(c *Config) { c.NextHop6 = addr("fe80::1") }, []string{"next_hop6: fe80::1"}},
		{"next hop6 mapped", func(c *Config) { c.NextHop6 = addr("::ffff:198.18.0.10") }, []string{"next_hop6: ::ffff:198.18.0.10"}},
		{"peer without address", func(c *Config) { c.Peers[0].Address = netip.Addr{} }, []string{"peers[0].address: missing"}},
		{"peer duplicate", func(c *Config) { c.Peers[1].Address = c.Peers[0].Address },
			[]string{"peers[1].address: 198.18.0.1 is also peers[0]"}},
		{"peer mapped", func(c *Config) { c.Peers[0].Address = addr("::ffff:198.18.0.1") }, []string{"peers[0].address: ::ffff:198.18.0.1"}},
		{"valid link-local peer with a zone", func(c *Config) {
			c.Peers[1].Address, c.NextHop6 = addr("fe80::1%eth0"), addr("2001:db8::10")
		}, nil},
		{"valid link-local peers on two links", func(c *Config) {
			c.Peers[0].Address, c.Peers[1].Address, c.NextHop6 = addr("fe80::1%eth0"), addr("fe80::1%eth1"), addr("2001:db8::10")
		}, nil},
		{"link-local peer without a zone", func(c *Config) { c.Peers[1].Address = addr("fe80::1") },
			[]string{"peers[1].address: fe80::1 is link-local: give the interface the peer is on as its zone, e.g. fe80::1%eth0 (without one no session can be dialled or accepted)"}},
		{"link-local peer without a zone, with next hop6", func(c *Config) { c.Peers[0].Address, c.NextHop6 = addr("fe80::2"), addr("2001:db8::10") },
			[]string{"peers[0].address: fe80::2 is link-local: give the interface the peer is on as its zone, e.g. fe80::2%eth0"}},
		{"zone on a global peer", func(c *Config) { c.Peers[1].Address, c.NextHop6 = addr("2001:db8::1%eth0"), addr("2001:db8::10") },
			[]string{"peers[1].address: 2001:db8::1%eth0: only a link-local (fe80::/10) address may have a zone"}},
		{"zone an index", func(c *Config) { c.Peers[1].Address, c.NextHop6 = addr("fe80::1%2"), addr("2001:db8::10") },
			[]string{`peers[1].address: fe80::1%2: the zone "2" is not an interface name`}},
		{"zone too long", func(c *Config) {
			c.Peers[1].Address, c.NextHop6 = addr("fe80::1%eth0123456789abcd"), addr("2001:db8::10")
		},
			[]string{`the zone "eth0123456789abcd" is not an interface name`}},
		{"zone with a slash", func(c *Config) { c.Peers[1].Address, c.NextHop6 = addr("fe80::1%a/b"), addr("2001:db8::10") },
			[]string{`the zone "a/b" is not an interface name`}},
		{"zoned peer without next hop6", func(c *Config) { c.Peers[1].Address = addr("fe80::1%eth0") },
			[]string{"peers[1].address: fe80::1%eth0: a link-local peer needs next_hop6 (next-hop self would announce no usable next hop over a link-local session)"}},
		{"zoned peer with a password", func(c *Config) {
			c.Peers[1].Address, c.Peers[1].Password, c.NextHop6 = addr("fe80::1%eth0"), "x", addr("2001:db8::10")
		}, []string{"peers[1].password: TCP-MD5 is not supported with a link-local peer (fe80::1%eth0)"}},
		{"peer multicast", func(c *Config) { c.Peers[0].Address = addr("224.0.0.1") }, []string{"peers[0].address: 224.0.0.1 is not a unicast"}},
		{"peer asn", func(c *Config) { c.Peers[0].ASN = 0 }, []string{"peers[0].asn: missing"}},
		{"passive without listener", func(c *Config) { c.ListenPort = 0 }, []string{"peers[1].passive: a passive peer needs a listen_port"}},
		{"several at once", func(c *Config) { c.ASN, c.RouterID = 0, netip.Addr{} }, []string{"asn: missing", "router_id: missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mod(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				require.NoError(t, err)
				_, err := New(c)
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Len(t, strings.Split(err.Error(), "\n"), len(tt.want), "one line per problem: %v", err)
			_, err = New(c)
			require.ErrorIs(t, err, ErrInvalidConfig)
		})
	}
}

func TestHostPrefix(t *testing.T) {
	for in, want := range map[string]string{
		"198.18.100.1":          "198.18.100.1/32",
		"2001:db8::1":           "2001:db8::1/128",
		"::ffff:198.18.100.1":   "198.18.100.1/32",
		"2001:db8:100::ab:cdef": "2001:db8:100::ab:cdef/128",
	} {
		p := HostPrefix(netip.MustParseAddr(in))
		assert.Equal(t, want, p.String())
		assert.NoError(t, checkPrefix(p))
	}
}

func TestSpecFor(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:db8::1")
	p4, p6 := netip.MustParsePrefix("198.18.100.1/32"), netip.MustParsePrefix("2001:db8:100::1/128")
	tests := []struct {
		name             string
		peer             netip.Addr
		nextHop, hop6    string
		ipv4, ipv6       bool
		carries4, carry6 bool
	}{
		{"v4 session, self", v4, "", "", true, false, true, false},
		{"v4 session, NextHop6", v4, "", "2001:db8::10", true, true, true, true},
		{"v6 session, self", v6, "", "", false, true, false, true},
		{"v6 session, NextHop", v6, "198.18.0.10", "", true, true, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{ASN: 65010, RouterID: v4}
			if tt.nextHop != "" {
				c.NextHop = netip.MustParseAddr(tt.nextHop)
			}
			if tt.hop6 != "" {
				c.NextHop6 = netip.MustParseAddr(tt.hop6)
			}
			c = c.withDefaults()
			s := specFor(c, Peer{Address: tt.peer, ASN: 65000})
			assert.Equal(t, tt.ipv4, s.ipv4)
			assert.Equal(t, tt.ipv6, s.ipv6)
			assert.Equal(t, tt.carries4, s.carries(p4))
			assert.Equal(t, tt.carry6, s.carries(p6))
			assert.Equal(t, uint16(179), s.Port)

			ap := s.apiPeer()
			assert.Equal(t, tt.peer.String(), ap.GetConf().GetNeighborAddress())
			assert.Equal(t, uint64(90), ap.GetTimers().GetConfig().GetHoldTime())
			assert.Equal(t, uint64(30), ap.GetTimers().GetConfig().GetKeepaliveInterval())
			assert.Equal(t, uint64(5), ap.GetTimers().GetConfig().GetConnectRetry())
			var fams []api.Family_Afi
			for _, af := range ap.GetAfiSafis() {
				fams = append(fams, af.GetConfig().GetFamily().GetAfi())
			}
			var want []api.Family_Afi
			if tt.ipv4 {
				want = append(want, api.Family_AFI_IP)
			}
			if tt.ipv6 {
				want = append(want, api.Family_AFI_IP6)
			}
			assert.Equal(t, want, fams)
		})
	}
}

func TestAPIPath(t *testing.T) {
	tests := []struct {
		prefix, nextHop string
		wantHop         string
		wantAfi         api.Family_Afi
	}{
		{"198.18.100.1/32", "", "0.0.0.0", api.Family_AFI_IP},
		{"198.18.100.1/32", "198.18.0.10", "198.18.0.10", api.Family_AFI_IP},
		{"198.18.100.0/24", "", "0.0.0.0", api.Family_AFI_IP},
		{"2001:db8:100::1/128", "", "::", api.Family_AFI_IP6},
		{"2001:db8:100::1/128", "2001:db8::10", "2001:db8::10", api.Family_AFI_IP6},
	}
	for _, tt := range tests {
		t.Run(tt.prefix+" via "+tt.wantHop, func(t *testing.T) {
			p := netip.MustParsePrefix(tt.prefix)
			var nh netip.Addr
			if tt.nextHop != "" {
				nh = netip.MustParseAddr(tt.nextHop)
			}
			path, err := apiPath(p, nh)
			require.NoError(t, err)
			assert.Equal(t, tt.wantAfi, path.GetFamily().GetAfi())
			assert.Equal(t, api.Family_SAFI_UNICAST, path.GetFamily().GetSafi())
			var nlri api.IPAddressPrefix
			require.NoError(t, path.GetNlri().UnmarshalTo(&nlri))
			assert.Equal(t, p.Addr().String(), nlri.GetPrefix())
			assert.Equal(t, uint32(p.Bits()), nlri.GetPrefixLen())
			require.Len(t, path.GetPattrs(), 2)
			var origin api.OriginAttribute
			require.NoError(t, path.GetPattrs()[0].UnmarshalTo(&origin))
			assert.Equal(t, uint32(0), origin.GetOrigin(), "origin IGP")
			assert.Equal(t, netip.MustParseAddr(tt.wantHop), pathNextHop(t, path))
		})
	}
}

func TestSessionStateString(t *testing.T) {
	assert.Equal(t, "established", StateEstablished.String())
	assert.Equal(t, "openconfirm", StateOpenConfirm.String())
	assert.Equal(t, "idle", StateIdle.String())
	assert.Equal(t, "unknown", SessionState(200).String())
	// The values are GoBGP's.
	assert.Equal(t, int32(StateEstablished), int32(api.PeerState_ESTABLISHED))
	assert.Equal(t, int32(StateOpenSent), int32(api.PeerState_OPENSENT))
	assert.Equal(t, int32(StateIdle), int32(api.PeerState_IDLE))
}

func TestSlogLogger(t *testing.T) {
	var buf bytes.Buffer
	h := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	l := newSlogLogger(slog.New(h))

	assert.Equal(t, gobgplog.InfoLevel, l.GetLevel(), "handler at Info")
	l.Info("Peer Up", gobgplog.Fields{"Topic": "Peer", "Key": "198.18.0.1", "State": "BGP_FSM_OPENCONFIRM"})
	l.Debug("dropped", gobgplog.Fields{"Topic": "Peer"})
	l.Warn("careful", nil)
	l.Error("broken", gobgplog.Fields{"Err": "boom"})
	assert.Equal(t,
		"level=INFO msg=\"Peer Up\" Key=198.18.0.1 State=BGP_FSM_OPENCONFIRM Topic=Peer\n"+
			"level=WARN msg=careful\n"+
			"level=ERROR msg=broken Err=boom\n",
		buf.String())

	buf.Reset()
	l.SetLevel(gobgplog.WarnLevel)
	assert.Equal(t, gobgplog.WarnLevel, l.GetLevel())
	l.Info("dropped", nil)
	l.Warn("kept", nil)
	assert.Equal(t, "level=WARN msg=kept\n", buf.String())
	l.SetLevel(gobgplog.FatalLevel)
	assert.Equal(t, gobgplog.FatalLevel, l.GetLevel())

	debug := newSlogLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	assert.Equal(t, gobgplog.DebugLevel, debug.GetLevel())
	trace := newSlogLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: levelTrace})))
	assert.Equal(t, gobgplog.TraceLevel, trace.GetLevel())

	buf.Reset()
	assert.PanicsWithValue(t, "gobgp: code logic bug map[Key:x]", func() { l.Panic("code logic bug", gobgplog.Fields{"Key": "x"}) })
	assert.Panics(t, func() { l.Fatal("unknown msg type", nil) })
	assert.Contains(t, buf.String(), "level=ERROR msg=\"code logic bug\" Key=x")
}

// A listening speaker whose peer has a TCP-MD5 password or GTSM is refused
// in a program that listens with multipath TCP (this test binary does,
// Go's default): the kernel would refuse both on the listener. Without a
// listener it is accepted.
func TestMultipathTCPListenerRefused(t *testing.T) {
	var lc net.ListenConfig
	if !lc.MultipathTCP() {
		t.Skip("this binary listens with plain TCP (GODEBUG multipathtcp=0)")
	}
	c := Config{ASN: 65010, RouterID: netip.MustParseAddr("198.18.0.10"), ListenPort: 1179,
		Peers: []Peer{{Address: netip.MustParseAddr("198.18.0.1"), ASN: 65000, Password: "x"}}}
	_, err := New(c)
	require.ErrorIs(t, err, ErrMultipathTCP)
	c.Peers[0].Password, c.Peers[0].TTLSecurity = "", 1
	_, err = New(c)
	require.ErrorIs(t, err, ErrMultipathTCP)
	c.ListenPort = 0
	_, err = New(c)
	require.NoError(t, err)
}
