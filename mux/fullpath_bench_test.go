package mux

import (
	"fmt"
	"testing"

	"github.com/xdplb/xdplb/engine"
)

// BenchmarkMuxPipelineFull is BenchmarkMuxPipeline's 1M-flow line, where
// every packet runs the full pipeline (the fast path naps), in three
// forms alternated over one rig in one process, rounds times: the whole
// batch prepared before the first packet is placed (ahead=64) and
// encapsulated by the stages (images=off), as before session 20; the
// same with tunnel images; and the landed form, prepared fusedAhead
// packets ahead, with images. One rig for all, and the forms in turn,
// so that the machine's changes of pace fall on all three alike: read
// the per-round ratios.
func BenchmarkMuxPipelineFull(b *testing.B) {
	const rounds = 6
	doc := benchDocument(b)
	var r *muxRig
	var ours *fused
	for round := range rounds {
		for _, v := range []struct {
			ahead  int
			images bool
		}{{engine.MaxBatch, false}, {engine.MaxBatch, true}, {fusedAhead, true}} {
			b.Run(fmt.Sprintf("flows=1M/round=%d/ahead=%d/images=%v", round, v.ahead, v.images), func(b *testing.B) {
				if ours != nil {
					ours.ahead, ours.noImages = v.ahead, !v.images
				}
				benchMuxRig(b, &r, 1000000, func(tb testing.TB, n int) []engine.Stage {
					s := ourMuxStages(tb, doc, muxConnTable(tb, n))
					ours = s[0].(*fused)
					ours.ahead, ours.noImages = v.ahead, !v.images
					return s
				})
			})
		}
	}
}
