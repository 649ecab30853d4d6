package bgp

import (
	"context"
	"net/netip"
	"runtime"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/server"
	"github.com/stretchr/testify/require"
)

// The tests of a GoBGP AddPeer that fails send no packet: the peers GoBGP
// takes are passive, so it never dials them (a passive peer needs a
// listener: the Announcer listens on a free port of 127.0.0.1 only, where
// nothing connects), and the peer it refuses gets no socket. They once
// were link-local addresses without an interface, which the kernel
// refuses to dial; Config.Validate refuses those now.

// gobgpState is what GoBGP itself runs: whether it is started (its
// global ASN is set) and its neighbours, sorted.
func gobgpState(t *testing.T, srv *server.BgpServer) (started bool, neighbours []string) {
	t.Helper()
	g, err := srv.GetBgp(context.Background(), &api.GetBgpRequest{})
	require.NoError(t, err)
	require.NoError(t, srv.ListPeer(context.Background(), &api.ListPeerRequest{}, func(p *api.Peer) {
		neighbours = append(neighbours, p.GetConf().GetNeighborAddress())
	}))
	return g.GetGlobal().GetAsn() != 0, neighbours
}

// TestAnnouncerStartAddPeerFails: a Start whose GoBGP AddPeer fails
// reports it, naming the peer, and leaves GoBGP stopped — no neighbour
// (those added before the one refused are removed), not started — with
// the Announcer not started; tries again run that same GoBGP server (GoBGP
// cannot end one), and once the peer is gone from the Config, Start runs.
//
// The refused peer is a link-local one whose zone names no interface of
// this host: GoBGP looks the interface up for the session's local address.
// Config.Validate cannot know the host's interfaces; the peer is put into
// the Announcer's peers directly, as the test needs no next_hop6.
func TestAnnouncerStartAddPeerFails(t *testing.T) {
	refused := netip.MustParseAddr("fe80::2%xdplb-none0")
	tests := []struct {
		name  string
		peers []Peer // valid, taken by GoBGP; sorted before refused
	}{
		{"the refused peer alone", nil},
		{"after peers GoBGP took", []Peer{{Address: netip.MustParseAddr("2001:db8::1"), ASN: routerASN, Passive: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{ASN: muxASN, RouterID: netip.MustParseAddr("198.18.0.10"), Peers: tt.peers, Logger: testLogger(t),
				ListenPort: int32(freePort(t)), ListenAddresses: []netip.Addr{loopback}}
			a, err := New(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = a.Shutdown(context.Background()) })
			a.peers[refused] = specFor(a.cfg, Peer{Address: refused, ASN: routerASN})

			require.Error(t, a.Start(context.Background()))
			srv := a.srv
			require.NotNil(t, srv)
			before := runtime.NumGoroutine()
			const tries = 10
			for range tries {
				err := a.Start(context.Background())
				require.ErrorContains(t, err, "bgp: add peer "+refused.String())
				require.True(t, a.srv == srv, "a Start tried again runs the same GoBGP server")
				require.Nil(t, a.PeerStates(), "the Announcer is not started")
				started, neighbours := gobgpState(t, srv)
				require.False(t, started, "GoBGP is left started")
				require.Empty(t, neighbours, "neighbours left in GoBGP")
			}
			require.Eventually(t, func() bool { return runtime.NumGoroutine()-before < tries/2 },
				10*time.Second, 10*time.Millisecond, "goroutines left by %d failed Starts: %d", tries, runtime.NumGoroutine()-before)

			require.NoError(t, a.Reconfigure(cfg), "the Config without the refused peer")
			require.NoError(t, a.Start(context.Background()))
			require.True(t, a.srv == srv)
			started, neighbours := gobgpState(t, srv)
			require.True(t, started)
			require.Len(t, neighbours, len(tt.peers))
			require.NoError(t, a.Shutdown(context.Background()))
			started, neighbours = gobgpState(t, srv)
			require.False(t, started)
			require.Empty(t, neighbours)
		})
	}
}

// TestAnnouncerReconfigureAddPeerFails: a new peer whose GoBGP AddPeer
// fails while the speaker runs is reported, naming it, and not recorded
// as configured, so the next Reconfigure tries it again (and only it: the
// peers GoBGP took are not added twice); the speaker keeps running, and
// Shutdown stops it whole.
//
// GoBGP refuses a neighbour it already has: the test gives GoBGP the new
// peer first, behind the Announcer's back (administratively down: it never
// dials), which Config.Validate cannot refuse.
func TestAnnouncerReconfigureAddPeerFails(t *testing.T) {
	taken := Peer{Address: netip.MustParseAddr("2001:db8::1"), ASN: routerASN, Passive: true}
	refused := Peer{Address: netip.MustParseAddr("2001:db8::2"), ASN: routerASN, Passive: true}
	base := Config{ASN: muxASN, RouterID: netip.MustParseAddr("198.18.0.10"), ListenPort: int32(freePort(t)), ListenAddresses: []netip.Addr{loopback}}
	tests := []struct {
		name   string
		change func(a *Announcer, peers []Peer) error
	}{
		{"SetPeers", func(a *Announcer, peers []Peer) error { return a.SetPeers(peers) }},
		{"Reconfigure", func(a *Announcer, peers []Peer) error {
			c := base
			c.Logger, c.Peers = a.log, peers
			return a.Reconfigure(c)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base
			cfg.Logger = testLogger(t)
			a, err := New(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = a.Shutdown(context.Background()) })
			require.NoError(t, a.Start(context.Background()))
			srv := a.srv
			squatter := specFor(a.cfg, refused).apiPeer()
			squatter.Conf.AdminDown = true
			require.NoError(t, srv.AddPeer(context.Background(), &api.AddPeerRequest{Peer: squatter}))

			peers := []Peer{taken, refused}
			for range 3 {
				err := tt.change(a, peers)
				require.ErrorContains(t, err, "bgp: add peer "+refused.Address.String())
				require.NotContains(t, err.Error(), "bgp: add peer "+taken.Address.String(), "a peer GoBGP took is added again")
				a.mu.Lock()
				_, isTaken := a.peers[taken.Address]
				_, isRefused := a.peers[refused.Address]
				ph := a.phase
				a.mu.Unlock()
				require.True(t, isTaken)
				require.False(t, isRefused, "a peer GoBGP refused is recorded as configured")
				require.Equal(t, phaseRunning, ph, "the speaker keeps running")
			}

			require.NoError(t, srv.DeletePeer(context.Background(), &api.DeletePeerRequest{Address: refused.Address.String()}))
			require.NoError(t, tt.change(a, peers), "the refused peer is tried again")
			started, neighbours := gobgpState(t, srv)
			require.True(t, started)
			require.ElementsMatch(t, []string{taken.Address.String(), refused.Address.String()}, neighbours)
			require.NoError(t, a.Shutdown(context.Background()))
			started, neighbours = gobgpState(t, srv)
			require.False(t, started)
			require.Empty(t, neighbours)
		})
	}
}
