//go:build linux

package steer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzSteer runs the program on arbitrary frames (seeded with the golden
// fixtures): it always returns PASS or REDIRECT, counts each frame exactly
// once, redirects exactly what it counts as steered, and agrees with the
// gopacket model whenever the model can decode the frame.
func FuzzSteer(f *testing.F) {
	p := loadOrSkip(f, Options{})
	require.NoError(f, p.Sync(goldenCfg))
	require.NoError(f, p.RegisterSocket(0, xskFD(f)))
	for _, c := range goldenFrames(f) {
		f.Add(c.frame)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > 1518 {
			t.Skip("BPF_PROG_RUN takes an Ethernet header up to a page")
		}
		ret, d := runFrame(t, p, frame)
		out := outcomeOf(t, d)
		if out.steered() {
			require.Equal(t, uint32(xdpRedirect), ret)
		} else {
			require.Equal(t, uint32(xdpPass), ret)
		}
		if m, ok := modelOutcome(goldenCfg, frame); ok {
			require.Equal(t, m, out, "gopacket model vs program")
		}
	})
}
