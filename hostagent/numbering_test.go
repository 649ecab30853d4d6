package hostagent

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/datapath"
)

// TestPortNumbering: the ports the plan and the stages use — UplinkPort,
// VMPort.Index, slowPort — are the ones the data path builder gives the
// agent's spec, and the spec is valid.
func TestPortNumbering(t *testing.T) {
	a, err := New(Config{Uplink: "up0", ConfigPath: "unused", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	a.cfg.Host = "host-1"
	doc, err := control.Parse([]byte(pipeDoc))
	require.NoError(t, err)
	require.NoError(t, a.apply(doc))
	plan := a.Plan()
	require.NotEmpty(t, plan.Ports)

	spec := a.spec(plan)
	spec.Pipeline = func(datapath.Input) (*engine.Pipeline, error) { return engine.NewPipeline(), nil }
	require.NoError(t, spec.Validate())
	l := spec.Layout()
	p, ok := l.Port("up0")
	require.True(t, ok)
	require.Equal(t, uint16(UplinkPort), p, "uplink")
	for _, vp := range plan.Ports {
		p, ok := l.Port(vp.Interface)
		require.True(t, ok, vp.Interface)
		require.Equal(t, vp.Index, p, vp.Interface)
	}
	slow, ok := l.Slow()
	require.True(t, ok)
	require.Equal(t, slowPort(plan), slow, "slow path")
}
