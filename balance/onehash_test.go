package balance_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// TestOneHash: whichever hash the connection table places keys by — its
// own, the stage's fleet hash (one hash per packet for 5-tuple rules), or
// a fleet hash of another seed (which the stage must not hand it) — every
// flow the stage enters is where the table's own methods look for it, and
// its later packets hit their entry.
func TestOneHash(t *testing.T) {
	fleet := flow.NewHasher(42)
	other := flow.NewHasher(43)
	rules := []flow.Rule{
		{Name: "web", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(8, 1)},
		{Name: "dns-all", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoUDP}, Mode: flow.Tuple3, Backends: backends(8, 1)},
		{Name: "web6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoTCP, Port: 443}, Backends: backends(8, 1)},
	}
	tests := []struct {
		name   string
		hasher *flow.Hasher
	}{
		{"table's own hash", nil},
		{"the fleet's hash", &fleet},
		{"another seed's hash", &other},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &harness{t: t, rules: flow.NewRules()}
			_, err := h.rules.Update(1, rules)
			require.NoError(t, err)
			h.conns, err = flow.NewConnTable(flow.ConnTableConfig{Capacity: 1024, Hasher: tt.hasher})
			require.NoError(t, err)
			h.now = 1
			h.stage, err = balance.New(balance.Config{Rules: h.rules, Conns: h.conns, Hasher: fleet,
				Clock: func() flow.Tick { return h.now }})
			require.NoError(t, err)
			h.pl = engine.NewPipeline(engine.Parse{}, h.stage)
			h.batch.Counters = &h.ctr

			snap := h.rules.Load()
			for i := range 300 {
				var p pkt
				var key flow.Key
				src := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
				sport := uint16(1000 + i)
				switch i % 3 {
				case 0:
					p = pkt{src: src, dst: vip4, sport: sport, dport: 80, tcp: true, ack: true}
					key = flow.KeyFrom(0, flow.ProtoTCP, netip.AddrPortFrom(src, sport), netip.AddrPortFrom(vip4, 80))
				case 1:
					p = pkt{src: src, dst: vip4, sport: sport, dport: 53}
					key = flow.KeyFrom(0, flow.ProtoUDP, netip.AddrPortFrom(src, sport), netip.AddrPortFrom(vip4, 53))
				default:
					src6 := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 7, 14: byte(i >> 8), 15: byte(i)})
					p = pkt{src: src6, dst: vip6, sport: sport, dport: 443, tcp: true, ack: true}
					key = flow.KeyFrom(0, flow.ProtoTCP, netip.AddrPortFrom(src6, sport), netip.AddrPortFrom(vip6, 443))
				}
				first := h.run(p.build())
				require.NotZero(t, h.pool[0].Flags&engine.FlagNewFlow, "flow %d: first packet", i)
				id, _, ok := h.conns.Lookup(&key, h.now)
				require.True(t, ok, "flow %d: not where the table looks for it", i)
				r, idx, ok := snap.Backend(id)
				require.True(t, ok)
				require.Equal(t, first, r.Backends[idx].Name, "flow %d", i)
				require.Equal(t, first, h.run(p.build()), "flow %d: second packet", i)
				require.Zero(t, h.pool[0].Flags&engine.FlagNewFlow, "flow %d: second packet missed its entry", i)
			}
			require.Equal(t, uint64(300), h.stage.Stats().Inserted)
		})
	}
}
