package pktrate

import (
	"fmt"
	"io"
	"strings"

	"github.com/xdplb/xdplb/internal/lab/promtext"
)

// The Mux's Prometheus samples FastPathCounts reads (mux/metrics.go).
const (
	metricFastPathHits   = `xdplb_mux_fastpath_packets_total{result="hit"}`
	metricFastPathMisses = `xdplb_mux_fastpath_packets_total{result="miss"}`
	metricFastPathNaps   = `xdplb_mux_fastpath_naps_total`
)

// FastPathCounts are a Mux's fast-path counters, summed over its workers:
// Hits are packets encapsulated from a worker's cache of established
// flows' decisions, Misses packets looked up there but sent through the
// full pipeline, Naps the times a worker stopped looking up its cache for
// a while because too few packets hit it. Packets of batches with ICMP,
// and of napping workers, are neither hits nor misses. As read from the
// Mux (FastPathReader) they count since it started; in a Sample, over the
// measurement window.
type FastPathCounts struct {
	Hits, Misses, Naps uint64
}

// Lookups is Hits + Misses.
func (c FastPathCounts) Lookups() uint64 { return c.Hits + c.Misses }

// HitShare is Hits / Lookups (0 without lookups).
func (c FastPathCounts) HitShare() float64 {
	if c.Lookups() == 0 {
		return 0
	}
	return float64(c.Hits) / float64(c.Lookups())
}

// sub returns c - before, counter by counter (0 where a counter went
// back, as a restarted program's would).
func (c FastPathCounts) sub(before FastPathCounts) FastPathCounts {
	return FastPathCounts{Hits: sat(c.Hits, before.Hits), Misses: sat(c.Misses, before.Misses), Naps: sat(c.Naps, before.Naps)}
}

// ParseFastPathCounts reads the fast-path counters from a Prometheus
// text exposition (what a Mux's /metrics serves). It reads only the
// hit, miss and nap samples, written as the Mux writes them (no
// timestamps, labels as in metricFastPath*); a missing one is an error,
// so a program without a fast path is not taken for one that never hit.
func ParseFastPathCounts(r io.Reader) (FastPathCounts, error) {
	m, err := promtext.Parse(r)
	if err != nil {
		return FastPathCounts{}, fmt.Errorf("pktrate: %w", err)
	}
	var c FastPathCounts
	var missing []string
	for _, f := range []struct {
		name string
		to   *uint64
	}{{metricFastPathHits, &c.Hits}, {metricFastPathMisses, &c.Misses}, {metricFastPathNaps, &c.Naps}} {
		v, ok := m[f.name]
		switch {
		case !ok:
			missing = append(missing, f.name)
		case v < 0:
			return FastPathCounts{}, fmt.Errorf("pktrate: metrics: %s %v: not a counter", f.name, v)
		default:
			*f.to = uint64(v) // Prometheus writes counters as floats ("1.234567e+06")
		}
	}
	if len(missing) > 0 {
		return FastPathCounts{}, fmt.Errorf("pktrate: metrics without %s", strings.Join(missing, ", "))
	}
	return c, nil
}

// FastPathSummary is the median over a point's trials of the fast-path
// figures, for a DUT whose trials read them (FastPathReader).
type FastPathSummary struct {
	// Trials is the number of trials with counters.
	Trials int
	// HitShare is the median of the trials' Hits / Lookups (a trial
	// without lookups counts 0: the fast path served none of it).
	HitShare float64
	// Lookups and Naps are the medians of the window's counts.
	Lookups, Naps float64
}

// summarizeFastPath returns the medians over the samples that carry
// counters, nil when none does.
func summarizeFastPath(samples []Sample) *FastPathSummary {
	var share, lookups, naps []float64
	for _, s := range samples {
		if s.FastPath == nil {
			continue
		}
		share = append(share, s.FastPath.HitShare())
		lookups = append(lookups, float64(s.FastPath.Lookups()))
		naps = append(naps, float64(s.FastPath.Naps))
	}
	if len(share) == 0 {
		return nil
	}
	return &FastPathSummary{Trials: len(share), HitShare: Median(share), Lookups: Median(lookups), Naps: Median(naps)}
}
