package afxdp_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
)

func TestConfigValidate(t *testing.T) {
	ok := afxdp.Config{Interface: "eth0"}
	tests := []struct {
		name string
		edit func(c *afxdp.Config)
		ok   bool
	}{
		{"defaults", func(c *afxdp.Config) {}, true},
		{"ifindex only", func(c *afxdp.Config) { c.Interface, c.Ifindex = "", 3 }, true},
		{"no interface", func(c *afxdp.Config) { c.Interface = "" }, false},
		{"negative queue", func(c *afxdp.Config) { c.Queue = -1 }, false},
		{"frame 4096", func(c *afxdp.Config) { c.FrameSize = 4096 }, true},
		{"frame 3000", func(c *afxdp.Config) { c.FrameSize = 3000 }, false},
		{"frame 1024", func(c *afxdp.Config) { c.FrameSize = 1024 }, false},
		{"too few frames", func(c *afxdp.Config) { c.NumFrames = 100 }, false},
		{"minimum frames", func(c *afxdp.Config) { c.NumFrames = 4 * engine.MaxBatch }, true},
		{"umem too large", func(c *afxdp.Config) { c.NumFrames, c.FrameSize = 1<<20, 4096 }, false},
		{"negative headroom", func(c *afxdp.Config) { c.Headroom = -1 }, false},
		{"headroom too large", func(c *afxdp.Config) { c.Headroom = 600 }, false},
		{"headroom 512 in 4096", func(c *afxdp.Config) { c.Headroom, c.FrameSize = 512, 4096 }, true},
		{"ring not power of two", func(c *afxdp.Config) { c.RXRingSize = 1000 }, false},
		{"ring too small", func(c *afxdp.Config) { c.TXRingSize = 32 }, false},
		{"ring too large", func(c *afxdp.Config) { c.FillRingSize = 1 << 17 }, false},
		{"bad mode", func(c *afxdp.Config) { c.Mode = 9 }, false},
		{"bad ring", func(c *afxdp.Config) { c.Ring = 9 }, false},
		{"asavie", func(c *afxdp.Config) { c.Ring = afxdp.RingAsavie }, true},
		{"asavie headroom beyond 256", func(c *afxdp.Config) { c.Ring, c.Headroom = afxdp.RingAsavie, 300 }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.Validate()
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, afxdp.ErrInvalidConfig)
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	c := afxdp.Config{Interface: "eth1", Queue: 3}.WithDefaults()
	require.Equal(t, afxdp.Config{
		Name: "afxdp:eth1:3", Interface: "eth1", Queue: 3,
		NumFrames: 4096, FrameSize: 2048, Headroom: engine.DefaultHeadroom,
		FillRingSize: 2048, CompletionRingSize: 2048, RXRingSize: 2048, TXRingSize: 2048,
	}, c)
	require.Equal(t, "afxdp:if7:0", afxdp.Config{Ifindex: 7}.WithDefaults().Name)
	require.Equal(t, "own", afxdp.RingOwn.String())
	require.Equal(t, "asavie", afxdp.RingAsavie.String())
	require.Equal(t, "zerocopy", afxdp.BindZeroCopy.String())
}
