package bgp

import (
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// linkLocal returns the kernel's link-local address of interface ifname
// in n (the veths get one from their MAC when they come up; the lab turns
// DAD off, so it is usable at once), with ifname as its zone.
func linkLocal(t *testing.T, n *netlab.NS, ifname string) netip.Addr {
	t.Helper()
	lk, err := n.Link(ifname)
	require.NoError(t, err)
	var ll netip.Addr
	eventually(t, "a link-local address on "+n.String()+"/"+ifname, func() bool {
		addrs, err := n.Netlink().AddrList(lk, netlink.FAMILY_V6)
		require.NoError(t, err)
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() {
				ll = ip.WithZone(ifname)
				return true
			}
		}
		return false
	})
	return ll
}

// TestBIRDLinkLocalPeer peers the Announcer with BIRD over IPv6 link-local
// addresses, each side naming the peer's address with its own interface
// as the zone (fe80::…%up on the Mux, fe80::…%m1 on the router), the way
// unnumbered eBGP is set up. No global address carries the session:
//
//	mux1 [up fe80::… 198.18.1.2/24 2001:db8:1::2/64] ── [m1 fe80::… 198.18.1.1/24 2001:db8:1::1/64] router (BIRD)
//
// In one case the Mux dials (BIRD is passive), in the other BIRD dials
// (the Mux's peer is Passive), so GoBGP's outbound connection and its
// matching of an inbound one to the zoned neighbour are both shown, each
// also with GTSM (TTL security, one hop) on both sides. Over
// the session the Mux announces an IPv6 VIP with next_hop6 and an IPv4 VIP
// with next_hop, and the router's kernel table gets both.
func TestBIRDLinkLocalPeer(t *testing.T) {
	tests := []struct {
		name       string
		muxPassive bool // the Mux waits; BIRD dials
		gtsm       bool // TTL security on both sides (directly connected)
	}{
		{"the Mux dials", false, false},
		{"BIRD dials", true, false},
		{"the Mux dials, GTSM", false, true},
		{"BIRD dials, GTSM", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lab := netlab.New(t, "bgpll")
			fleetlabtest.RequireBIRD(t, "the link-local peering test")
			star, err := fleetlab.NewStar(lab)
			require.NoError(t, err)
			m := muxSpecs[0]
			ns, err := star.Attach(m.name, "m1", 1)
			require.NoError(t, err)
			require.NoError(t, star.Router.AddAddr("m1", "2001:db8:1::1/64"))
			require.NoError(t, ns.AddAddr("up", m.addr6.String()+"/64"))
			muxLL, routerLL := linkLocal(t, ns, "up"), linkLocal(t, star.Router, "m1")

			bird := fleetlabtest.StartBIRD(t, star.Router, fleetlab.BIRDConfig{
				RouterID: netip.MustParseAddr("198.18.0.1"), ASN: routerASN, IPv6: true,
				Peers: []fleetlab.BIRDPeer{{Name: m.protocol, Addr: muxLL.WithZone("m1"), ASN: muxASN, Passive: !tt.muxPassive, TTLSecurity: tt.gtsm}},
			})
			peer := Peer{Address: routerLL.WithZone("up"), ASN: routerASN, Passive: tt.muxPassive}
			if tt.gtsm {
				peer.TTLSecurity = 1
			}
			mux := startHelper(t, ns, m, Config{
				ASN:          muxASN,
				RouterID:     m.addr4,
				ListenPort:   179,
				HoldTime:     9 * time.Second,
				ConnectRetry: time.Second,
				NextHop:      m.addr4,
				NextHop6:     m.addr6,
				Peers:        []Peer{peer},
			})
			mux.do("start")
			mux.do("wait")
			// The Mux may see the session up a moment before BIRD does.
			eventually(t, "BIRD sees the session established", func() bool {
				return mustProtocolState(t, bird, m.protocol) == "Established"
			})

			var states []PeerState
			require.NoError(t, json.Unmarshal([]byte(mux.do("states")), &states))
			require.Len(t, states, 1)
			require.Equal(t, peer.Address, states[0].Address, "the peer keeps its zone")
			require.Equal(t, StateEstablished, states[0].State)
			require.Equal(t, muxLL, states[0].LocalAddress, "the session runs from the Mux's link-local address")

			vip4 := netip.MustParsePrefix("198.18.100.1/32")
			vip6 := netip.MustParsePrefix("2001:db8:100::1/128")
			mux.do("sync " + vip4.String() + " " + vip6.String())
			fleetlabtest.WaitNextHops(t, star.Router, bird, 60*time.Second, vip6, m.addr6)
			fleetlabtest.WaitNextHops(t, star.Router, bird, 60*time.Second, vip4, m.addr4)
			mux.do("sync")
			fleetlabtest.WaitNextHops(t, star.Router, bird, 60*time.Second, vip6)
			fleetlabtest.WaitNextHops(t, star.Router, bird, 60*time.Second, vip4)
		})
	}
}

func mustProtocolState(t *testing.T, b *fleetlab.BIRD, name string) string {
	t.Helper()
	state, err := b.ProtocolState(name)
	require.NoError(t, err)
	return state
}
