package engine_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
)

// TestPacketReframe moves a frame's start and sets its length in one
// step, and refuses, changing nothing, every move that would leave the
// buffer: a 32-byte buffer holding a 10-byte frame at offset 4.
func TestPacketReframe(t *testing.T) {
	for _, tc := range []struct {
		name     string
		d, n     int
		ok       bool
		off, len int // the frame after the call
	}{
		{"into the headroom", -4, 14, true, 0, 14},
		{"into the headroom, shorter", -2, 3, true, 2, 3},
		{"forward, as a trim", 3, 7, true, 7, 7},
		{"forward and longer, to the buffer's end", 3, 25, true, 7, 25},
		{"nothing", 0, 10, true, 4, 10},
		{"empty", 0, 0, true, 4, 0},
		{"past the headroom", -5, 10, false, 4, 10},
		{"past the buffer's end", 0, 29, false, 4, 10},
		{"forward past the end", 29, 0, false, 4, 10},
		{"negative length", 0, -1, false, 4, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := make([]byte, 32)
			for i := range buf {
				buf[i] = byte(i)
			}
			var p engine.Packet
			p.SetBuffer(nil, 0, buf, 4, 10, 0)
			out, ok := p.Reframe(tc.d, tc.n)
			require.Equal(t, tc.ok, ok)
			if !ok {
				require.Nil(t, out)
			} else {
				require.Equal(t, p.Data(), out)
			}
			require.Equal(t, tc.off, p.Headroom(), "headroom")
			require.Equal(t, tc.len, p.Len(), "length")
			if tc.len > 0 {
				require.Equal(t, byte(tc.off), p.Data()[0], "the frame's first byte is the buffer's at its offset")
			}
			require.Equal(t, 32-tc.off-tc.len, p.Tailroom(), "tailroom")
		})
	}
}
