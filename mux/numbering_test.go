package mux

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPortNumbering: the ports the Mux's stages use — uplinkPort for the
// next hop, slowPort for what it cannot address — are the ones the data
// path builder gives the Mux's spec, which carries the running document's
// steering rules and is valid.
func TestPortNumbering(t *testing.T) {
	r := newMetricsRig(t, 1)
	spec := r.m.spec(partialHops, 0)
	require.NoError(t, spec.Validate())
	require.Len(t, spec.Interfaces, 1)
	require.Equal(t, r.m.ctl.Plan().Steering, spec.Interfaces[0].Steer)
	require.NotEmpty(t, spec.Interfaces[0].Steer.Dst)

	l := spec.Layout()
	p, ok := l.Port("uplink0")
	require.True(t, ok)
	require.Equal(t, uint16(uplinkPort), p, "uplink")
	slow, ok := l.Slow()
	require.True(t, ok)
	require.Equal(t, uint16(slowPort), slow, "slow path")
}
