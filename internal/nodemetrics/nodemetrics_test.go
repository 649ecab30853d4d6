//go:build linux

package nodemetrics

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
)

// configCollector exports a Status the way the nodes do.
type configCollector struct{ st control.Status }

func (c configCollector) Describe(ch chan<- *prometheus.Desc) { Describe(ch) }
func (c configCollector) Collect(ch chan<- prometheus.Metric) { Config(ch, c.st) }

// configErrors gathers xdplb_config_error by reason.
func configErrors(t *testing.T, st control.Status) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(configCollector{st}))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "xdplb_config_error" {
			continue
		}
		for _, m := range mf.GetMetric() {
			require.Len(t, m.GetLabel(), 1)
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	return got
}

func TestConfigError(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   control.Status
		want string // the reason at 1; "" for none
	}{
		{"applied", control.Status{Version: 7}, ""},
		{"conflict", control.Status{Version: 7, LastError: control.ErrVersionConflict, Reason: control.ReasonConflict}, control.ReasonConflict},
		{"invalid", control.Status{Version: 7, LastError: control.ErrInvalid, Reason: control.ReasonInvalid}, control.ReasonInvalid},
		{"apply", control.Status{Version: 7, LastError: errors.New("no room"), Reason: control.ReasonApply}, control.ReasonApply},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := configErrors(t, tc.st)
			require.Len(t, got, len(control.Reasons), "every reason, 0 or 1")
			for _, r := range control.Reasons {
				want := 0.0
				if r == tc.want {
					want = 1
				}
				assert.Equal(t, want, got[r], r)
			}
		})
	}
}
