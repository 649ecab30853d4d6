package benchmarks

import (
	"runtime"
	"strconv"
	"testing"
)

// oursNs holds the ns/op that our side of each comparison measured last,
// keyed by comparison and GOMAXPROCS. Every comparison runs our
// sub-benchmark first and the peer's right after it, so the peer can report
// the ratio of the two as measured in the same run, seconds apart.
var oursNs = map[string]float64{}

func ratioKey(group string) string { return group + "@" + strconv.Itoa(runtime.GOMAXPROCS(0)) }

// nsPer returns the measured time per unit of work (b.Elapsed counts only
// timed periods).
func nsPer(b *testing.B, units int) float64 {
	if units == 0 {
		return 0
	}
	return float64(b.Elapsed().Nanoseconds()) / float64(units)
}

// recordOurs remembers our ns per unit for group.
func recordOurs(group string, ns float64) { oursNs[ratioKey(group)] = ns }

// reportPeer reports, on the peer's row, how many times longer than ours the
// peer took per unit of work ("ours-speedup": peer ns ÷ our ns; above 1
// means ours is faster). Nothing is reported when our side did not run.
func reportPeer(b *testing.B, group string, ns float64) {
	if o := oursNs[ratioKey(group)]; o > 0 && ns > 0 {
		b.ReportMetric(ns/o, "ours-speedup")
	}
}
