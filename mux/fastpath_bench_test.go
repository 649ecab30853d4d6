package mux

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
)

// fastBenchSizes are BenchmarkMuxFastPath's flow counts: those of
// BenchmarkMuxPipeline, and two between them — 5k, which the cache
// (8,192 entries) holds, and 64k, which it does not.
var fastBenchSizes = []struct {
	name  string
	flows int
}{{"1k", 1000}, {"5k", 5000}, {"64k", 64000}, {"1M", 1000000}}

// BenchmarkMuxFastPath is BenchmarkMuxPipeline's xdplb line with the fast
// path (see fastPath) on and off, alternated over three rounds in one
// process, at 1k, 5k, 64k and 1M flows, each round in the other order (at
// 1M flows the rig built second runs 10-15% slower whichever it is: its
// table's memory); x-fast, on the round's second line, is the CPU time
// per packet with it over the time without. Run it with -cpu 1.
func BenchmarkMuxFastPath(b *testing.B) {
	doc := benchDocument(b)
	for _, sz := range fastBenchSizes {
		rigs := map[bool]*muxRig{}
		for round := range 3 {
			order := []bool{false, true}
			if round%2 == 1 {
				order = []bool{true, false}
			}
			cpu := map[bool]float64{}
			for _, fast := range order {
				b.Run(fmt.Sprintf("flows=%s/r%d/fast=%v", sz.name, round, fast), func(b *testing.B) {
					r := rigs[fast]
					_, ns := benchMuxRigCPU(b, &r, sz.flows, func(tb testing.TB, n int) []engine.Stage {
						ms, _ := newTestMuxStages(tb, doc, muxConnTable(tb, n), muxStagesOpts{})
						f, err := newFused(ms)
						require.NoError(tb, err)
						if !fast {
							f.fast = nil
						}
						return []engine.Stage{f}
					})
					rigs[fast] = r
					cpu[fast] = ns
					if on, off := cpu[true], cpu[false]; on > 0 && off > 0 {
						b.ReportMetric(on/off, "x-fast")
					}
				})
			}
		}
	}
}
