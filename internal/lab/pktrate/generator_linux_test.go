//go:build linux

package pktrate

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestGeneratorLayout(t *testing.T) {
	tests := []struct {
		name        string
		size, flows int
		maxUMEM     int
		slots       int
		stride      int
		rewrite     bool
	}{
		{"one flow fills both rings", 64, 1, 0, 4096, 64, false},
		{"whole copies of every flow", 64, 1000, 0, 5000, 64, false},
		{"a million 64-byte flows are prebuilt", 64, 1 << 20, 0, 1 << 20, 64, false},
		{"a million MTU frames are rewritten", 1518, 1 << 20, 0, DefaultMaxUMEM / 2048, 2048, true},
		{"stride is a power of two", 200, 8192, 0, 8192, 256, false},
		{"tiny budget still covers the rings", 64, 1 << 20, 1 << 10, 4096, 64, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &Generator{cfg: GenConfig{Spec: testSpec(tt.size, tt.flows), RingSize: DefaultGenRingSize, MaxUMEM: tt.maxUMEM}}
			if g.cfg.MaxUMEM == 0 {
				g.cfg.MaxUMEM = DefaultMaxUMEM
			}
			g.flowLen = uint32(g.cfg.Spec.Len())
			g.layout()
			assert.Equal(t, tt.slots, g.nslots)
			assert.Equal(t, tt.stride, g.stride)
			assert.Equal(t, tt.rewrite, g.rewrite)
			if !g.rewrite {
				assert.Zero(t, g.nslots%tt.flows, "every flow must be sent equally often")
			}
			// No frame crosses a UMEM chunk.
			for _, s := range []int{0, 1, g.nslots - 1} {
				a := g.slotAddr(s)
				assert.Equal(t, a/chunkSize, (a+int(g.flowLen)-1)/chunkSize, "slot %d", s)
			}
		})
	}
}
