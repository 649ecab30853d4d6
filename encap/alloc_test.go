package encap_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
)

// fixture is a full batch that can be put back as it was before a stage
// ran, without allocating: the frames are copied back into their buffers
// and the packets' metadata restored from templates.
type fixture struct {
	r      *rig
	frames [][]byte
	tmpl   [engine.MaxBatch]engine.Packet
	copy   bool // restore the frame bytes too (the stage overwrote them)
}

func newFixture(tb testing.TB, frames [][]byte, parse bool, prep func([]*engine.Packet)) *fixture {
	fx := &fixture{r: newRig(tb), frames: frames}
	var ps []*engine.Packet
	if parse {
		ps = fx.r.load(0, frames...)
	} else {
		ps = fx.r.loadRaw(frames...)
	}
	if prep != nil {
		prep(ps)
	}
	for i := range frames {
		fx.tmpl[i] = fx.r.pool[i]
	}
	return fx
}

func (fx *fixture) reset() *engine.Batch {
	b := &fx.r.b
	b.Reset()
	for i := range fx.frames {
		if fx.copy {
			copy(fx.r.bufs[i][headroom:], fx.frames[i])
		}
		fx.r.pool[i] = fx.tmpl[i]
		b.Append(&fx.r.pool[i])
	}
	return b
}

func repeat(f []byte, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = f
	}
	return out
}

func TestNoAllocs(t *testing.T) {
	big4, big6 := v4pkt(), v6pkt()
	big4.size, big6.size = 1450, 1450
	ect0 := v4pkt()
	ect0.tos = 2 // ECT(0): the outer CE mark is copied in
	cases := []struct {
		name   string
		stage  engine.Stage
		frames [][]byte
		parse  bool
		rule   bool
		copy   bool
		first  string // the first packet's fate: a drop reason, "" (TX) or "emit"
	}{
		{"encap v4 in v4", newEncap(t, encap.EncapConfig{}), repeat(v4pkt().build(), 64), true, true, false, ""},
		{"encap v6 in v6", newEncap(t, encap.EncapConfig{}), repeat(v6pkt().build(), 64), true, true, false, ""},
		{"encap decrementing TTL", newEncap(t, encap.EncapConfig{DecrementTTL: true}), repeat(v4pkt().build(), 64), true, true, true, ""},
		{"encap ICMP errors", newEncap(t, encap.EncapConfig{MTU: 1400, ICMPRate: 1e9}), [][]byte{big4.build(), big6.build()}, true, true, true, "emit"},
		{"encap rate limited", newEncap(t, encap.EncapConfig{MTU: 1400, ICMPRate: 1, ICMPBurst: 1}), repeat(big4.build(), 64), true, true, true, "mtu_exceeded"},
		{"decap", newDecap(t, encap.DecapConfig{}, nil), repeat(vxlan{src: mux6, dst: host6, vni: testVNI, tos: 3, inner: withDst(ect0.build(), dipMAC, nil)}.build(), 64), false, false, true, ""},
		{"decap drops", newDecap(t, encap.DecapConfig{}, nil), repeat(vxlan{src: mux4, dst: host4, vni: 9, inner: withDst(v4pkt().build(), dipMAC, nil)}.build(), 64), false, false, false, "unknown_local"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t, tc.frames, tc.parse, func(ps []*engine.Packet) {
				if tc.rule {
					for _, p := range ps {
						p.Rule, p.Backend, p.Hash = ruleFor(p.Key.DstAddr(), host6), 1, 7
						if p.Key.DstAddr().Is4() {
							p.Rule.Backends[1].Host = host4
						}
					}
				}
			})
			fx.copy = tc.copy
			allocs := testing.AllocsPerRun(100, func() {
				b := fx.reset()
				tc.stage.Process(b)
				b.Compact()
			})
			require.Zero(t, allocs)
			p := &fx.r.pool[0]
			if tc.first == "emit" {
				require.Equal(t, engine.VerdictEmit, p.Verdict)
			} else {
				require.Equal(t, tc.first, reason(p))
			}
		})
	}
}
