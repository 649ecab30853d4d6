package mux

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow/flowtest"
)

// TestFastPathRefreshAsStages: the fast path must leave a flow's entry
// last seen when the separate stages would. A decision is kept by a
// lookup that did not refresh the entry (it was seen less than
// RefreshAfter ago), and the stages refresh it once it lags by more than
// RefreshAfter counted from when it was last seen, not from when the
// decision was kept. UDP flows (60 s timeout, refreshed after 1.875 s):
// promoted at P, kept at P+1.8 s, hits at P+1.85 s, a packet at P+3.6 s
// (the stages refresh the entries), then silence until P+60.5 s: the
// entries live in the stages, so they must in the fused stage too (no
// new flows, no inserts).
func TestFastPathRefreshAsStages(t *testing.T) {
	fp := newFusedPairWith(t, muxStagesOpts{partial: true}, 1<<12)
	frames := benchTargets.Frames(benchFlows(engine.MaxBatch, flowtest.Mix{flowtest.UDP4: 100}, 21, false))
	hits := func() uint64 { h, _ := fp.f.fast.Stats(); return h }
	at := func(d time.Duration) {
		t.Helper()
		fp.now += int64(d)
		fp.batch(t, frames...)
	}
	at(0)                       // new: untrusted
	at(2 * time.Second)         // past ProveAfter: promoted at P, last seen P
	at(1800 * time.Millisecond) // P+1.8 s: kept, not refreshed
	h := hits()
	at(50 * time.Millisecond) // P+1.85 s
	require.Equal(t, uint64(len(frames)), hits()-h, "the flows' packets are hits")
	at(1750 * time.Millisecond) // P+3.6 s: the stages refresh the entries
	fp.counters(t)
	at(56900 * time.Millisecond) // P+60.5 s
	fp.counters(t)
}
