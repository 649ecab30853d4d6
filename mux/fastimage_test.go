package mux

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
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
	fr, hops, frames, send := newHopRig(t)
	f, r := fr.f, fr.r
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

// unversionedHops answers every destination with benchHop, without a
// version: the next-hop stage's answers change every batch, so images
// hold within a batch only.
type unversionedHops struct{}

func (unversionedHops) Lookup(netip.Addr) (nexthop.Hop, bool) { return benchHop, true }

// TestFusedAgreesTunnels is TestFusedAgrees's flows — new, then
// established, with partial checksums — through the separate stages and
// the fused stage, whose misses the tunnel images serve, in the
// configurations TestFusedAgrees does not have: encap's inner source MAC
// set (the image's, not the frame's); the slow path, with a third of the
// hosts unresolved (their packets out of port 1, their images never
// made) and a third behind another interface (port 2, with its own
// MACs); and a next-hop source without a version. The rig has port 0
// only: what goes out of ports 1 and 2 is counted as no_out_port, alike.
func TestFusedAgreesTunnels(t *testing.T) {
	const ifindex2 = benchUplink + 1
	hop2 := benchHop
	hop2.IfIndex, hop2.DstMAC = ifindex2, [6]byte{0x02, 0xbb, 0, 0, 0, 2}
	thirds := nexthop.Static{Hops: map[netip.Addr]nexthop.Hop{}} // Default: unresolved
	for h := 1; h <= benchHosts; h++ {
		switch h % 3 {
		case 1:
			thirds.Hops[netip.AddrFrom4([4]byte{198, 18, 254, byte(h)})] = benchHop
		case 2:
			thirds.Hops[netip.AddrFrom4([4]byte{198, 18, 254, byte(h)})] = hop2
		}
	}
	for _, tc := range []struct {
		name string
		o    muxStagesOpts
	}{
		{"inner source MAC", muxStagesOpts{innerSrc: header.MAC{0x02, 0, 0x5e, 0, 0, 0x99}}},
		{"slow path, two interfaces", muxStagesOpts{slowPath: true, hops: thirds, port2: ifindex2}},
		{"unversioned next hops", muxStagesOpts{hops: unversionedHops{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.partial = true
			fp := newFusedPairWith(t, tc.o, 1<<12)
			frames := benchTargets.Frames(benchFlows(300, muxAgreeMix, 13, true))
			for i := 0; i < len(frames); i += 3 {
				frames[i] = gpkt.MakePartial(t, frames[i])
			}
			for range 4 {
				for i := 0; i < len(frames); i += engine.MaxBatch {
					fp.batch(t, frames[i:min(i+engine.MaxBatch, len(frames))]...)
				}
				fp.now += int64(2 * time.Second) // past ProveAfter: the flows promote, then are kept
			}
			fp.counters(t)
			require.NotZero(t, fp.f.fast.stats().images, "no packet encapsulated from a tunnel image")
		})
	}
}

// TestImagesLeaveUnresolvedToStages: a packet whose next hop does not
// resolve goes to the slow path, and no image is made of it: the stages
// ask the resolver for its destination again in every batch (which an
// image, shown to the resolver once per next-hop generation, would not),
// so that a destination waiting to resolve is asked for as often as
// without images.
func TestImagesLeaveUnresolvedToStages(t *testing.T) {
	hops := &countingHops{lookups: map[netip.Addr]int{}, unresolved: true}
	fr := &fastRig{now: int64(time.Hour)}
	ms, ctl := newTestMuxStages(t, benchDocument(t), muxConnTable(t, 1<<10),
		muxStagesOpts{hops: hops, slowPath: true, clock: func() int64 { return fr.now }})
	f, err := newFused(ms)
	require.NoError(t, err)
	fr.f, fr.r = f, newMuxRigSnapshot(t, false, ctl.Snapshot, f)
	frames := benchTargets.Frames(benchFlows(16, muxAgreeMix, 5, false))
	const batches = 50
	for range batches {
		fr.send(frames, engine.MaxBatch)
	}
	require.Zero(t, f.fast.stats().images, "a packet to the slow path encapsulated from an image")
	require.NotEmpty(t, hops.counts())
	for a, n := range hops.counts() {
		require.GreaterOrEqual(t, n, batches, "destination %v: asked for in fewer batches than it was sent to", a)
	}
}
