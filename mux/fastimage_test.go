package mux

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// TestImageCacheFind: an image is found for its own rule and backend in
// its own epoch only — not for another backend of the rule or another
// rule's backend that share its slot, not after the next-hop answers
// change, and not after the snapshot changes (which also empties the
// cache, so that it holds no rule of the old one).
func TestImageCacheFind(t *testing.T) {
	r1 := &flow.Rule{ID: 1, Backends: make([]flow.Backend, 1<<12)}
	r2 := &flow.Rule{ID: 2, Backends: make([]flow.Backend, 1<<12)}
	snap1, snap2 := new(flow.Snapshot), new(flow.Snapshot)
	var ic imageCache
	ic.begin(snap1, 7, 1)
	e := ic.slot(r1, 0)
	e.epoch, e.rule, e.backend = ic.epoch, r1, 0
	require.Same(t, e, ic.find(r1, 0))

	// Keys that share the slot: another backend of r1, a backend of r2.
	var same, other int32 = -1, -1
	for i := int32(1); i < 1<<12 && (same < 0 || other < 0); i++ {
		if same < 0 && ic.slot(r1, i) == e {
			same = i
		}
		if other < 0 && ic.slot(r2, i) == e {
			other = i
		}
	}
	require.Positive(t, same, "no backend of r1 shares backend 0's slot")
	require.Positive(t, other, "no backend of r2 shares r1's backend 0's slot")
	require.Nil(t, ic.find(r1, same), "another backend of the rule, in the same slot")
	require.Nil(t, ic.find(r2, other), "another rule's backend, in the same slot")
	require.Nil(t, ic.find(r2, 0), "another rule's backend 0")

	ic.begin(snap1, 7, 2) // a new next-hop generation: the same answers
	require.Same(t, e, ic.find(r1, 0))
	ic.begin(snap1, 8, 2) // new answers
	require.Nil(t, ic.find(r1, 0))
	e.epoch = ic.epoch
	require.Same(t, e, ic.find(r1, 0))
	ic.begin(snap2, 8, 2) // a new snapshot
	require.Nil(t, ic.find(r1, 0))
	require.Nil(t, e.rule, "an image of the old snapshot is kept")
}

// TestImagesAcrossHopRefresh is TestFastPathAcrossHopRefresh for the
// tunnel images: flows that are never proven (the clock stands still)
// run the full pipeline, and after the first packet of each backend
// every packet is encapsulated from its backend's image, across the
// next-hop stage's refreshes of its answers; and the images show the
// resolver every next hop they use, once per refresh, as the stages'
// lookups would have.
func TestImagesAcrossHopRefresh(t *testing.T) {
	hops := &countingHops{lookups: map[netip.Addr]int{}}
	fr := newFastRig(t, hops, 1<<10)
	f, r := fr.f, fr.r
	frames := benchTargets.Frames(benchFlows(16, muxAgreeMix, 5, false))
	send := func() { fr.send(frames, engine.MaxBatch) }
	send()
	i0 := f.fast.stats().images
	send()
	i1 := f.fast.stats().images
	require.Equal(t, uint64(len(frames)), i1-i0, "every packet is encapsulated from an image")
	start := hops.counts()
	require.NotEmpty(t, start)

	const refreshes = 3
	for range refreshes*1024 + 10 {
		send()
	}
	require.Equal(t, i1+uint64(refreshes*1024+10)*uint64(len(frames)), f.fast.stats().images, "images")
	h, _ := f.fast.Stats()
	require.Zero(t, h, "a flow's decision was kept: the test is not about those")
	for a, n := range hops.counts() {
		require.GreaterOrEqual(t, n-start[a], refreshes, "destination %v: looked up in fewer refreshes than the flows spanned", a)
	}
	s := r.stats()
	require.Zero(t, s.Dropped(), "drops: %v", s.DropsByName())
	require.Equal(t, uint64(refreshes*1024+12)*uint64(len(frames)), s.TX)
}
