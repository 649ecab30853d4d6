package bgp

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The loopback tests need no privileges: the "router" is a second GoBGP
// server in the test process, listening on a free port of 127.0.0.1, and
// the Announcer dials it. Nothing leaves the host's loopback interface.
// The BIRD tests (bird_linux_test.go) check the same behaviour against a
// real router in network namespaces.

const (
	muxASN    = 65010
	routerASN = 65000
)

var loopback = netip.MustParseAddr("127.0.0.1")

// gobgpRouter is a GoBGP server standing in for a router.
type gobgpRouter struct {
	srv  *server.BgpServer
	port uint16
}

// newRouter starts a router that accepts sessions from peers (all on
// 127.0.0.1, so at most one at a time) with both unicast families.
func newRouter(t *testing.T, peers ...Peer) *gobgpRouter {
	t.Helper()
	port := freePort(t)
	srv := server.NewBgpServer(server.LoggerOption(newSlogLogger(testLogger(t).With("side", "router"))))
	go srv.Serve()
	require.NoError(t, srv.StartBgp(context.Background(), &api.StartBgpRequest{Global: &api.Global{
		Asn: routerASN, RouterId: "198.18.0.1", ListenPort: int32(port), ListenAddresses: []string{"127.0.0.1"},
	}}))
	t.Cleanup(func() { _ = srv.StopBgp(context.Background(), &api.StopBgpRequest{}) })
	r := &gobgpRouter{srv: srv, port: port}
	for _, p := range peers {
		r.addPeer(t, p)
	}
	return r
}

func (r *gobgpRouter) addPeer(t *testing.T, p Peer) {
	t.Helper()
	ap := peerSpec{Peer: p, hold: 9 * time.Second, retry: time.Second, ipv4: true, ipv6: true}.apiPeer()
	ap.Transport.PassiveMode = true
	ap.Transport.RemotePort = 0
	require.NoError(t, r.srv.AddPeer(context.Background(), &api.AddPeerRequest{Peer: ap}))
}

// routes returns the router's best routes, prefix → next hop.
func (r *gobgpRouter) routes(t *testing.T) map[netip.Prefix]netip.Addr {
	t.Helper()
	out := map[netip.Prefix]netip.Addr{}
	for _, f := range []*api.Family{familyIPv4, familyIPv6} {
		err := r.srv.ListPath(context.Background(), &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: f},
			func(d *api.Destination) {
				pfx := netip.MustParsePrefix(d.GetPrefix())
				for _, p := range d.GetPaths() {
					if !p.GetBest() {
						continue
					}
					out[pfx] = pathNextHop(t, p)
				}
			})
		require.NoError(t, err)
	}
	return out
}

func pathNextHop(t *testing.T, p *api.Path) netip.Addr {
	for _, a := range p.GetPattrs() {
		var nh api.NextHopAttribute
		if a.UnmarshalTo(&nh) == nil {
			return netip.MustParseAddr(nh.GetNextHop())
		}
		var mp api.MpReachNLRIAttribute
		if a.UnmarshalTo(&mp) == nil && len(mp.GetNextHops()) > 0 {
			return netip.MustParseAddr(mp.GetNextHops()[0])
		}
	}
	t.Fatalf("path %v has no next hop", p)
	return netip.Addr{}
}

// sessionUp reports whether the router's session with the mux is
// established.
func (r *gobgpRouter) sessionUp(t *testing.T) bool {
	up := false
	require.NoError(t, r.srv.ListPeer(context.Background(), &api.ListPeerRequest{}, func(p *api.Peer) {
		up = up || p.GetState().GetSessionState() == api.PeerState_ESTABLISHED
	}))
	return up
}

func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return uint16(port)
}

// eventually polls cond until it holds; the deadline only guards against a
// hang, nothing here measures time.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustPrefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

func loopbackAnnouncer(t *testing.T, r *gobgpRouter, mod func(*Config)) *Announcer {
	t.Helper()
	cfg := Config{
		ASN:           muxASN,
		RouterID:      netip.MustParseAddr("198.18.0.10"),
		HoldTime:      9 * time.Second,
		ConnectRetry:  time.Second,
		WithdrawGrace: time.Hour, // tests end the grace period through ctx
		NextHop6:      netip.MustParseAddr("2001:db8::10"),
		Peers:         []Peer{{Address: loopback, ASN: routerASN, Port: r.port}},
		Logger:        testLogger(t).With("side", "mux"),
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = a.Shutdown(ctx)
	})
	return a
}

func TestAnnouncerLoopback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newRouter(t, Peer{Address: loopback, ASN: muxASN})
	a := loopbackAnnouncer(t, r, nil)

	v4a, v4b, v6 := mustPrefixes("198.18.100.1/32")[0], mustPrefixes("198.18.100.2/32")[0], mustPrefixes("2001:db8:100::1/128")[0]

	// Before Start: the desired set is recorded, nothing is announced.
	require.NoError(t, a.Sync([]netip.Prefix{v4a, v6}))
	assert.Empty(t, a.Announced())
	assert.Nil(t, a.PeerStates())

	require.NoError(t, a.Start(ctx))
	require.ErrorIs(t, a.Start(ctx), ErrStarted)
	require.NoError(t, a.WaitEstablished(ctx))
	assert.Equal(t, []netip.Prefix{v4a, v6}, a.Announced())

	// IPv4 with next-hop self (the session's local address), IPv6 over the
	// IPv4 session with the configured IPv6 next hop.
	want := map[netip.Prefix]netip.Addr{v4a: loopback, v6: netip.MustParseAddr("2001:db8::10")}
	eventually(t, "router learns both VIPs", func() bool { return assert.ObjectsAreEqual(want, r.routes(t)) })

	ps := a.PeerStates()
	require.Len(t, ps, 1)
	assert.Equal(t, loopback, ps[0].Address)
	assert.Equal(t, uint32(routerASN), ps[0].ASN)
	assert.Equal(t, StateEstablished, ps[0].State)
	assert.Equal(t, loopback, ps[0].LocalAddress)
	assert.Equal(t, netip.MustParseAddr("198.18.0.1"), ps[0].RouterID)
	assert.Equal(t, []string{"ipv4-unicast", "ipv6-unicast"}, ps[0].Families)
	assert.Equal(t, uint64(2), ps[0].Advertised)

	// Sync: one VIP goes, one comes, one stays.
	require.NoError(t, a.Sync([]netip.Prefix{v6, v4b}))
	want = map[netip.Prefix]netip.Addr{v4b: loopback, v6: netip.MustParseAddr("2001:db8::10")}
	eventually(t, "router follows Sync", func() bool { return assert.ObjectsAreEqual(want, r.routes(t)) })
	assert.Equal(t, []netip.Prefix{v4b, v6}, a.Announced())

	require.NoError(t, a.Withdraw(v6))
	require.NoError(t, a.Announce(v4a))
	want = map[netip.Prefix]netip.Addr{v4a: loopback, v4b: loopback}
	eventually(t, "router follows Withdraw and Announce", func() bool { return assert.ObjectsAreEqual(want, r.routes(t)) })

	// Drain: everything withdrawn, session kept; Sync while draining only
	// changes the desired set; Resume announces it.
	require.NoError(t, a.Drain())
	assert.True(t, a.Draining())
	eventually(t, "router sees the drain", func() bool { return len(r.routes(t)) == 0 })
	assert.Empty(t, a.Announced())
	assert.True(t, r.sessionUp(t))
	require.NoError(t, a.Sync([]netip.Prefix{v4b}))
	assert.Empty(t, a.Announced())
	require.NoError(t, a.Resume())
	want = map[netip.Prefix]netip.Addr{v4b: loopback}
	eventually(t, "router sees the resume", func() bool { return assert.ObjectsAreEqual(want, r.routes(t)) })

	// Metrics.
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(a.Collector()))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			got[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	assert.Equal(t, 1.0, got["xdplb_bgp_peer_up,peer=127.0.0.1"])
	assert.Equal(t, 1.0, got["xdplb_bgp_peer_state,peer=127.0.0.1,state=established"])
	assert.Equal(t, 0.0, got["xdplb_bgp_peer_state,peer=127.0.0.1,state=idle"])
	assert.Equal(t, 1.0, got["xdplb_bgp_peer_prefixes_advertised,peer=127.0.0.1"])
	assert.Equal(t, 1.0, got["xdplb_bgp_prefixes_announced"])
	assert.Equal(t, 1.0, got["xdplb_bgp_prefixes_desired"])
	assert.Equal(t, 0.0, got["xdplb_bgp_draining"])
	assert.Equal(t, 5.0, got["xdplb_bgp_announcements_total"]) // v4a v6 | v4b | v4a | v4b (resume)
	assert.Contains(t, got, "xdplb_bgp_withdrawals_total")

	// Shutdown: the router loses the route while the session is still up,
	// and only then the session. The grace period is an hour; cancelling
	// ctx ends it, so the test controls the order without any timing.
	sctx, scancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Shutdown(sctx) }()
	eventually(t, "router sees the withdrawal", func() bool { return len(r.routes(t)) == 0 })
	assert.True(t, r.sessionUp(t), "session must stay up during the grace period")
	require.ErrorIs(t, a.Sync([]netip.Prefix{v4a}), ErrClosed)
	scancel()
	require.ErrorIs(t, <-done, context.Canceled)
	eventually(t, "router sees the session close", func() bool { return !r.sessionUp(t) })
	assert.Nil(t, a.PeerStates())
	require.NoError(t, a.Shutdown(ctx))
	require.ErrorIs(t, a.Start(ctx), ErrClosed)
}

func TestAnnouncerReconfigure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newRouter(t, Peer{Address: loopback, ASN: muxASN})
	a := loopbackAnnouncer(t, r, func(c *Config) { c.NextHop6 = netip.Addr{}; c.Peers = nil })
	vip6 := mustPrefixes("2001:db8:100::1/128")[0]
	vip4 := mustPrefixes("198.18.100.1/32")[0]
	require.NoError(t, a.Start(ctx))
	require.NoError(t, a.Sync([]netip.Prefix{vip4, vip6}))
	assert.Empty(t, a.PeerStates())

	// Add the peer: an IPv4 session without NextHop6 carries IPv4 only.
	require.NoError(t, a.SetPeers([]Peer{{Address: loopback, ASN: routerASN, Port: r.port}}))
	require.NoError(t, a.WaitEstablished(ctx, loopback))
	eventually(t, "router learns the IPv4 VIP only", func() bool {
		return assert.ObjectsAreEqual(map[netip.Prefix]netip.Addr{vip4: loopback}, r.routes(t))
	})
	assert.Equal(t, []string{"ipv4-unicast"}, a.PeerStates()[0].Families)

	// Setting NextHop6 (and a new next hop for IPv4) re-creates the session
	// with both families and re-announces.
	c := a.cfg
	c.NextHop = netip.MustParseAddr("198.18.0.10")
	c.NextHop6 = netip.MustParseAddr("2001:db8::10")
	require.NoError(t, a.Reconfigure(c))
	want := map[netip.Prefix]netip.Addr{vip4: c.NextHop, vip6: c.NextHop6}
	eventually(t, "router learns both with the new next hops", func() bool { return assert.ObjectsAreEqual(want, r.routes(t)) })

	// The speaker itself cannot change in place.
	c2 := c
	c2.ASN = 65011
	require.ErrorIs(t, a.Reconfigure(c2), ErrRestartRequired)
	c2 = c
	c2.ListenPort = 1179
	require.ErrorIs(t, a.Reconfigure(c2), ErrRestartRequired)
	c2 = c
	c2.HoldTime = time.Second
	require.ErrorIs(t, a.Reconfigure(c2), ErrInvalidConfig)

	// Removing the peer closes the session.
	require.NoError(t, a.SetPeers(nil))
	assert.Empty(t, a.PeerStates())
	eventually(t, "router sees the session close", func() bool { return !r.sessionUp(t) })
	assert.Equal(t, []netip.Prefix{vip4, vip6}, a.Announced(), "the announced set does not depend on the peers")
}

func TestAnnouncerShutdownBeforeStart(t *testing.T) {
	a, err := New(Config{ASN: muxASN, RouterID: netip.MustParseAddr("198.18.0.10")})
	require.NoError(t, err)
	require.NoError(t, a.Shutdown(context.Background()))
	require.ErrorIs(t, a.Start(context.Background()), ErrClosed)
	require.ErrorIs(t, a.Announce(mustPrefixes("198.18.100.1/32")...), ErrClosed)
	require.ErrorIs(t, a.Drain(), ErrClosed)
}

func TestAnnouncerRejectsBadPrefixes(t *testing.T) {
	a, err := New(Config{ASN: muxASN, RouterID: netip.MustParseAddr("198.18.0.10")})
	require.NoError(t, err)
	good := mustPrefixes("198.18.100.1/32")[0]
	for _, p := range []netip.Prefix{
		{},
		netip.MustParsePrefix("198.18.100.1/24"),
		netip.MustParsePrefix("::ffff:198.18.100.1/128"),
	} {
		err := a.Sync([]netip.Prefix{good, p})
		require.Error(t, err, "%v", p)
	}
	assert.Empty(t, a.want, "an invalid prefix changes nothing")
	require.NoError(t, a.Sync([]netip.Prefix{good, netip.MustParsePrefix("198.18.100.0/24")}))
	assert.Len(t, a.want, 2)
}

func TestAnnouncerStartFailure(t *testing.T) {
	// A port in use makes Start fail; the Announcer stays startable.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	a, err := New(Config{
		ASN: muxASN, RouterID: netip.MustParseAddr("198.18.0.10"), Logger: testLogger(t),
		ListenPort: int32(port), ListenAddresses: []netip.Addr{loopback},
	})
	require.NoError(t, err)
	err = a.Start(context.Background())
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrStarted))
	require.NoError(t, l.Close())
	require.NoError(t, a.Start(context.Background()))
	require.NoError(t, a.Shutdown(context.Background()))
}

func TestAnnouncerShutdownGrace(t *testing.T) {
	start := func(grace time.Duration) *Announcer {
		a, err := New(Config{ASN: muxASN, RouterID: netip.MustParseAddr("198.18.0.10"), WithdrawGrace: grace, Logger: testLogger(t)})
		require.NoError(t, err)
		require.NoError(t, a.Start(context.Background()))
		require.NoError(t, a.Sync(mustPrefixes("198.18.100.1/32", "198.18.100.2/32")))
		require.Len(t, a.Announced(), 2)
		return a
	}
	// A ctx that would expire long before an hour: Shutdown returning
	// without its error shows the grace wait was skipped (nothing was
	// announced after Drain) or completed.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	a := start(time.Hour)
	require.NoError(t, a.Drain())
	require.Empty(t, a.Announced())
	require.NoError(t, a.Shutdown(ctx), "nothing announced: no grace wait")

	a = start(time.Millisecond)
	require.NoError(t, a.Shutdown(ctx), "grace period runs out")
	require.Empty(t, a.Announced())
}
