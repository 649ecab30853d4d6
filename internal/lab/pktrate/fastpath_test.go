package pktrate

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// muxMetrics is a Mux's /metrics as promhttp writes it (trimmed).
const muxMetrics = `# HELP xdplb_conntable_entries Flows in the connection table.
# TYPE xdplb_conntable_entries gauge
xdplb_conntable_entries 1000
# HELP xdplb_mux_fastpath_naps_total Times a worker stopped looking up its cache.
# TYPE xdplb_mux_fastpath_naps_total counter
xdplb_mux_fastpath_naps_total 2
# HELP xdplb_mux_fastpath_packets_total TCP and UDP packets the workers looked up.
# TYPE xdplb_mux_fastpath_packets_total counter
xdplb_mux_fastpath_packets_total{result="hit"} 1.234567e+06
xdplb_mux_fastpath_packets_total{result="miss"} 4321
go_goroutines 12
`

func TestParseFastPathCounts(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    FastPathCounts
		wantErr string
	}{
		{"as the Mux writes it", muxMetrics, FastPathCounts{Hits: 1234567, Misses: 4321, Naps: 2}, ""},
		{"zeros", "xdplb_mux_fastpath_packets_total{result=\"hit\"} 0\nxdplb_mux_fastpath_packets_total{result=\"miss\"} 0\nxdplb_mux_fastpath_naps_total 0\n", FastPathCounts{}, ""},
		{"no fast path (another program)", "go_goroutines 12\n", FastPathCounts{}, "without"},
		{"no naps", "xdplb_mux_fastpath_packets_total{result=\"hit\"} 1\nxdplb_mux_fastpath_packets_total{result=\"miss\"} 1\n", FastPathCounts{}, "xdplb_mux_fastpath_naps_total"},
		{"not a number", strings.Replace(muxMetrics, "4321", "many", 1), FastPathCounts{}, "metrics line"},
		{"negative", strings.Replace(muxMetrics, "4321", "-1", 1), FastPathCounts{}, "not a counter"},
		{"empty", "", FastPathCounts{}, "without"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseFastPathCounts(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestFastPathCounts(t *testing.T) {
	tests := []struct {
		name          string
		end, start    FastPathCounts
		want          FastPathCounts
		share         float64
		lookupsOfWant uint64
	}{
		{"window", FastPathCounts{Hits: 1000, Misses: 300, Naps: 3}, FastPathCounts{Hits: 100, Misses: 200, Naps: 1}, FastPathCounts{Hits: 900, Misses: 100, Naps: 2}, 0.9, 1000},
		{"no lookups", FastPathCounts{Hits: 5, Misses: 5}, FastPathCounts{Hits: 5, Misses: 5}, FastPathCounts{}, 0, 0},
		{"counter went back (restart)", FastPathCounts{Hits: 1}, FastPathCounts{Hits: 10, Misses: 1}, FastPathCounts{}, 0, 0},
		{"all miss", FastPathCounts{Misses: 50}, FastPathCounts{}, FastPathCounts{Misses: 50}, 0, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.end.sub(tt.start)
			assert.Equal(t, tt.want, d)
			assert.Equal(t, tt.lookupsOfWant, d.Lookups())
			assert.InDelta(t, tt.share, d.HitShare(), 1e-12)
		})
	}
}

func TestSummarizeFastPath(t *testing.T) {
	fp := func(hits, misses, naps uint64) *FastPathCounts {
		return &FastPathCounts{Hits: hits, Misses: misses, Naps: naps}
	}
	tests := []struct {
		name    string
		samples []Sample
		want    *FastPathSummary
	}{
		{"no counters (most DUTs)", []Sample{{}, {}, {}}, nil},
		{"none", nil, nil},
		{"medians, each on its own", []Sample{
			{FastPath: fp(90, 10, 0)},   // 0.9 of 100
			{FastPath: fp(500, 500, 4)}, // 0.5 of 1000
			{FastPath: fp(990, 10, 1)},  // 0.99 of 1000
		}, &FastPathSummary{Trials: 3, HitShare: 0.9, Lookups: 1000, Naps: 1}},
		{"a trial without lookups counts 0", []Sample{
			{FastPath: fp(0, 0, 7)},
			{FastPath: fp(100, 0, 0)},
		}, &FastPathSummary{Trials: 2, HitShare: 0.5, Lookups: 50, Naps: 3.5}},
		{"only the trials with counters", []Sample{
			{}, {FastPath: fp(3, 1, 0)},
		}, &FastPathSummary{Trials: 1, HitShare: 0.75, Lookups: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := summarizeFastPath(tt.samples)
			assert.Equal(t, tt.want, got)
			if len(tt.samples) > 0 {
				assert.Equal(t, tt.want, Summarize(tt.samples).FastPath, "Summarize carries it")
			}
		})
	}
}

func TestWriteTableFastPath(t *testing.T) {
	p := Point{Size: 64, Flows: 1000, Load: Max}
	plain := Summary{Trials: 3, OfferedPPS: 2e6, DeliveredPPS: 2e6, MinDelivered: 1.9e6, MaxDelivered: 2.1e6, ForwardedPPS: 2e6, CPUPerPacket: 250 * time.Nanosecond, DUTUtil: 0.5, GenUtil: 1, SinkUtil: 0.2}
	const plainRow = "| l2fwd-1arm | 64 | 1k | max | 2.000 | 2.000 (1.900–2.100) | 2.000 | 1.00 | 0 | 250 | 0.50 | 1.00 | 0.20 |"
	withFP := func(f FastPathSummary) Summary {
		s := plain
		s.FastPath = &f
		return s
	}
	tests := []struct {
		name    string
		results []Result
		// after are the lines after the table (none: nothing but it).
		after []string
	}{
		{"no counters: the table alone", []Result{{Point: withDUT(p, "l2fwd-1arm"), Summary: plain}}, nil},
		{"mux row: a list under the table", []Result{
			{Point: withDUT(p, "l2fwd-1arm"), Summary: plain},
			{Point: withDUT(p, "mux"), Summary: withFP(FastPathSummary{Trials: 3, HitShare: 0.99874, Lookups: 2_412_345, Naps: 0})},
		}, []string{
			"",
			"Fast path (medians over the trials; hits: share of the lookups in the window that hit):",
			"",
			"- mux, 64 B, 1k flows, load max: 99.87% hits, 2.41M lookups, 0 naps",
		}},
		{"shares at the edges, trials without counters", []Result{
			{Point: withDUT(p, "l2fwd-1arm"), Summary: plain},
			{Point: withDUT(Point{Size: 128, Flows: 1_000_000, Load: Load{PPS: 3e5}}, "mux"), Summary: withFP(FastPathSummary{Trials: 2, HitShare: 0.99999, Lookups: 950, Naps: 12})},
			{Point: withDUT(p, "mux"), Summary: withFP(FastPathSummary{Trials: 3, HitShare: 0, Lookups: 0, Naps: 40})},
			{Point: withDUT(p, "mux2"), Summary: withFP(FastPathSummary{Trials: 3, HitShare: 0.00001, Lookups: 12_345, Naps: 1})},
			{Point: withDUT(p, "mux3"), Summary: withFP(FastPathSummary{Trials: 3, HitShare: 1, Lookups: 1e6, Naps: 0})},
		}, []string{
			"",
			"Fast path (medians over the trials; hits: share of the lookups in the window that hit):",
			"",
			"- mux, 128 B, 1M flows, load 300k: >99.99% hits, 950 lookups, 12 naps (2 of 3 trials)",
			"- mux, 64 B, 1k flows, load max: 0% hits, 0 lookups, 40 naps",
			"- mux2, 64 B, 1k flows, load max: <0.01% hits, 12.3k lookups, 1 naps",
			"- mux3, 64 B, 1k flows, load max: 100% hits, 1.00M lookups, 0 naps",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			require.NoError(t, WriteTable(&b, tt.results))
			lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
			rows := 2 + len(tt.results)
			require.Len(t, lines, rows+len(tt.after))
			// The table is the same with or without counters.
			assert.Equal(t, plainRow, lines[2])
			for _, l := range lines[:rows] {
				assert.True(t, strings.HasPrefix(l, "|"), "table line %q", l)
				assert.NotContains(t, l, "hits")
			}
			assert.Equal(t, tt.after, nilIfEmpty(lines[rows:]))
		})
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}
