package mux

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
)

// BenchmarkMuxFastPath is BenchmarkMuxPipeline's xdplb line with the fast
// path (see fastPath) on and off, alternated over three rounds in one
// process, at 1k and 1M flows; x-fast is the CPU time per packet with it
// over the time without, in the same round. Run it with -cpu 1.
func BenchmarkMuxFastPath(b *testing.B) {
	doc := benchDocument(b)
	for _, sz := range muxBenchSizes {
		rigs := map[bool]*muxRig{}
		off := 0.0
		for round := range 3 {
			for _, fast := range []bool{false, true} {
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
					if !fast {
						off = ns
					} else if off > 0 {
						b.ReportMetric(ns/off, "x-fast")
					}
				})
			}
		}
	}
}
