package nodemetrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/nat"
)

type outboundCollector struct{ s nat.SNATStats }

func (c outboundCollector) Describe(ch chan<- *prometheus.Desc) { DescribeOutbound(ch) }
func (c outboundCollector) Collect(ch chan<- prometheus.Metric) { Outbound(ch, c.s) }

// gather returns every sample of the collectors as "name{label}" →
// value (one label at most).
func gather(t *testing.T, cs ...prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	for _, c := range cs {
		require.NoError(t, reg.Register(c))
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetValue() + "}"
			}
			v := m.GetCounter().GetValue()
			if mf.GetType().String() == "GAUGE" {
				v = m.GetGauge().GetValue()
			}
			got[name] = v
		}
	}
	return got
}

func TestOutboundMetrics(t *testing.T) {
	allocs := fleet.PortAllocatorCounters{Claims: 3, Reclaims: 1, Returns: 2, Conflicts: 4, Exhausted: 5, Cooling: 6, Swept: 7,
		Sweeps: 8, Sweeper: true}
	have := false
	got := gather(t, outboundCollector{nat.SNATStats{Out: 10, In: 9, Local: 8, Passed: 7, Exhausted: 6, NoState: 5, Refused: 4,
		Created: 3, Reused: 2, Closed: 1, Expired: 11, Entries: 12, ICMP: 13}},
		OutboundRanges(func() (fleet.PortAllocatorCounters, bool) { return allocs, have }))
	assert.Equal(t, map[string]float64{
		"xdplb_outbound_packets_total{out}": 10, "xdplb_outbound_packets_total{in}": 9,
		"xdplb_outbound_packets_total{local}": 8, "xdplb_outbound_packets_total{passed}": 7,
		"xdplb_outbound_packets_total{exhausted}": 6, "xdplb_outbound_packets_total{no_state}": 5,
		"xdplb_outbound_packets_total{refused}":     4,
		"xdplb_outbound_packets_total{icmp}":        13,
		"xdplb_outbound_connections_total{created}": 3, "xdplb_outbound_connections_total{reused}": 2,
		"xdplb_outbound_connections_total{closed}": 1, "xdplb_outbound_connections_total{expired}": 11,
		"xdplb_outbound_table_entries": 12,
	}, got, "no allocator: no range metrics")
	have = true
	got = gather(t, OutboundRanges(func() (fleet.PortAllocatorCounters, bool) { return allocs, have }))
	assert.Equal(t, map[string]float64{
		"xdplb_outbound_ranges_total{claimed}": 3, "xdplb_outbound_ranges_total{reclaimed}": 1,
		"xdplb_outbound_ranges_total{returned}": 2, "xdplb_outbound_ranges_total{conflict}": 4,
		"xdplb_outbound_ranges_total{exhausted}": 5, "xdplb_outbound_ranges_total{cooling}": 6,
		"xdplb_outbound_ranges_total{swept}": 7,
		"xdplb_outbound_sweeps_total":        8, "xdplb_outbound_sweeper": 1,
	}, got)
	allocs.Sweeper = false
	got = gather(t, OutboundRanges(func() (fleet.PortAllocatorCounters, bool) { return allocs, have }))
	assert.Equal(t, 0.0, got["xdplb_outbound_sweeper"], "not the sweeper")
}
