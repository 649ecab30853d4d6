package nodemetrics

import (
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine/steer"
)

// TestSteerEveryOutcome: every outcome steer.Stats counts (every field
// but the Matched counts, which say which rule steered a packet) is
// exported, each under its own label: a frame the program drops or passes
// is never missing from xdplb_steer_packets_total.
func TestSteerEveryOutcome(t *testing.T) {
	var ss steer.Stats
	v := reflect.ValueOf(&ss).Elem()
	want := map[float64]string{} // a distinct count per field
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		if strings.HasPrefix(name, "Matched") {
			continue
		}
		v.Field(i).SetUint(uint64(1 + i))
		want[float64(1+i)] = name
	}
	ch := make(chan prometheus.Metric, 64)
	steerStats(ch, "up", ss)
	close(ch)
	got := map[float64]string{}
	outcomes := map[string]bool{}
	for m := range ch {
		var pb dto.Metric
		require.NoError(t, m.Write(&pb))
		for _, l := range pb.GetLabel() {
			if l.GetName() == "outcome" {
				require.False(t, outcomes[l.GetValue()], "outcome %q twice", l.GetValue())
				outcomes[l.GetValue()] = true
			}
		}
		got[pb.GetCounter().GetValue()] = want[pb.GetCounter().GetValue()]
	}
	require.Equal(t, want, got, "each counted outcome exported once")
}
