package balance_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
)

// TestStickyWhenBackendsMove: a connection-table entry holds its backend's
// ID and where the backend was in the pool (flow.Rule.Entry). Reloads that
// move backends within the pool — one added that sorts first, one removed
// before others — keep every established flow on its backend, and the
// flows of a removed backend never go to whichever backend now holds its
// place.
func TestStickyWhenBackendsMove(t *testing.T) {
	rule := func(bs []flow.Backend) flow.Rule {
		return flow.Rule{Name: "web", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: bs}
	}
	without := func(bs []flow.Backend, name string) []flow.Backend {
		var out []flow.Backend
		for _, b := range bs {
			if b.Name != name {
				out = append(out, b)
			}
		}
		return out
	}
	first := flow.Backend{Name: "aaa", Addr: netip.MustParseAddr("198.19.2.1"), Host: netip.MustParseAddr("198.19.2.1"), Weight: 1}
	for _, tc := range []struct {
		name    string
		pool    []flow.Backend
		removed string // its flows must move, and not to the backend at its old place
	}{
		{"a backend sorting first added", append([]flow.Backend{first}, backends(6, 1)...), ""},
		{"a backend removed before others", without(backends(6, 1), "dip01"), "dip01"},
		{"both", append([]flow.Backend{first}, without(backends(6, 1), "dip02")...), "dip02"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, true, rule(backends(6, 1)))
			type conn struct {
				p    pkt
				dest string
			}
			var conns []conn
			for i := range 240 {
				p := pkt{src: netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}), dst: vip4, sport: uint16(1000 + i), dport: 80, tcp: true, syn: true}
				conns = append(conns, conn{p, h.run(p.build())})
			}
			old := h.rules.Load().Rules()[0]
			oldIdx := map[string]int{}
			for i, b := range old.Backends {
				oldIdx[b.Name] = i
			}
			snap, err := h.rules.Update(2, []flow.Rule{rule(tc.pool)})
			require.NoError(t, err)
			moved := 0
			for _, c := range conns {
				p := c.p
				p.syn, p.ack = false, true
				got := h.run(p.build())
				if c.dest != tc.removed {
					require.Equal(t, c.dest, got, "flow moved on reload")
					continue
				}
				moved++
				if i := oldIdx[c.dest]; i < len(snap.Rules()[0].Backends) {
					// Maglev may pick it anyway; the entry must not.
					if at := snap.Rules()[0].Backends[i].Name; got == at {
						pick, _ := snap.Rules()[0].Pick(flow.NewHasher(42).Hash(ptrKey(p), flow.Tuple5))
						require.Equal(t, at, snap.Rules()[0].Backends[pick].Name, "a removed backend's flow went to the backend at its old place")
					}
				}
			}
			if tc.removed != "" {
				require.NotZero(t, moved, "the test must have flows on the removed backend")
			}
		})
	}
}

// ptrKey returns the flow key of p as the stage builds it.
func ptrKey(p pkt) *flow.Key {
	proto := uint8(flow.ProtoUDP)
	if p.tcp {
		proto = flow.ProtoTCP
	}
	k := flow.KeyFrom(0, proto, netip.AddrPortFrom(p.src, p.sport), netip.AddrPortFrom(p.dst, p.dport))
	return &k
}
