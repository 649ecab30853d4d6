package mux

import (
	"encoding/binary"
	"sync/atomic"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// Tunnel images: the fast path's second tier, for the packets that run
// the full pipeline. Past the balance stage, what the encap, next-hop and
// Account stages do for a packet depends on the flow only through the
// packet's own fields and its hash: the tunnel's headers are those of
// the backend it was placed on. So each worker keeps, per (rule,
// backend), the image of the headers the full pipeline last wrote for
// one of its packets (a fastEntry without a key, filled as fill fills
// one), and encapsulates the next packets placed there from it (hit),
// writing the outer UDP source port from the packet's hash as encap
// does (encap.SourcePort), and counts them by the backend's ID. That is
// what the full pipeline costs at a million flows, where the flows'
// decisions do not fit the fast path's cache and it naps: the
// connection table's lookup, then these three stages' work.
//
// An image holds while the worker's snapshot (its rules, their backends'
// hosts, MACs and VNIs) and the next-hop stage's answers are those it was
// made under: a change of either starts a new image epoch. Images do
// not depend on the source filter's prefixes (every packet here has
// passed it) or on the flow's class or age (the connection table's
// lookup has just run). A packet the image cannot take — its TTL
// expiring, its tunnel over the MTU, too little headroom, an IPv6
// underlay or a next hop that did not resolve (no image is made: the
// stages ask the resolver again in every batch, TestImagesLeaveUnresolvedToStages),
// its key's VNI not its rule's — runs the stages, as do the packets of
// a batch without next-hop answers. The next hop of an image is shown
// to the resolver once per next-hop generation (nexthop.Pass.Touch4),
// as for the fast path's hits. A worker keeps its images, and the rules
// they point to, until a batch of a new snapshot reaches its full
// pipeline, as its fast path's cache keeps its decisions while awake.
// A stage added between balance and account must be added to hit too,
// or the images (and the fast path) skip it.
const (
	imageBits  = 9 // 1 << imageBits images per worker: 64 KiB
	imageSlots = 1 << imageBits
)

// imageCache is one worker's tunnel images, and their epoch.
type imageCache struct {
	e     [imageSlots]fastEntry // key unused; epoch 0: empty
	epoch uint16
	snap  *flow.Snapshot
	hop   uint32
	gen   uint8         // the low byte of the next-hop generation (nexthop.Pass.Generation)
	used  int           // the batch's packets encapsulated from images
	hits  atomic.Uint64 // packets encapsulated from images: for the metrics
}

// begin readies the images for a batch of snapshot snap, next-hop
// answers hop and next-hop generation gen.
func (ic *imageCache) begin(snap *flow.Snapshot, hop, gen uint32) {
	if snap != ic.snap {
		clear(ic.e[:]) // hold no rule of an old snapshot
		ic.snap = snap
		nextEpoch(&ic.epoch, ic.e[:])
	}
	if hop != ic.hop {
		ic.hop = hop
		nextEpoch(&ic.epoch, ic.e[:])
	}
	ic.gen = uint8(gen)
	ic.used = 0
}

// slot returns the image slot of backend i of rule r.
func (ic *imageCache) slot(r *flow.Rule, i int32) *fastEntry {
	h := (uint64(r.ID)<<32 | uint64(uint32(i))) * 0x9e3779b97f4a7c15
	return &ic.e[h>>(64-imageBits)]
}

// beginImages begins the next-hop stage's pass for batch b, if it has not
// begun, and returns worker cache w's images readied for the batch, or
// nil when the pass has no answers to keep (a batch without a worker
// index) or the batch no snapshot.
func (f *fused) beginImages(b *engine.Batch, t *tail, w *fastCache) *imageCache {
	if !t.nhOn {
		f.nh.Begin(b, &t.nh)
		t.nhOn = true
	}
	hop, ok := t.nh.Answers()
	if !ok || t.snap == nil {
		return nil
	}
	gen, _ := t.nh.Generation()
	w.images.begin(t.snap, hop, gen)
	return &w.images
}

// find returns the image of backend i of rule r, or nil.
func (ic *imageCache) find(r *flow.Rule, i int32) *fastEntry {
	e := ic.slot(r, i)
	if e.epoch == ic.epoch && e.rule == r && e.backend == i {
		return e
	}
	return nil
}

// image encapsulates p, placed by the full pipeline's balance stage, by
// its backend's image and counts it, and reports whether it did; when it
// did not, p is as it was and runs the stages.
func (f *fused) image(b *engine.Batch, ic *imageCache, p *engine.Packet, t *tail) bool {
	// hit sets the key's VNI to the rule's, which the stages leave as
	// the uplink VNI stage set it: where the two differ, the stages run.
	r := p.Rule
	if r == nil || p.Flags&(engine.FlagIPv4|engine.FlagIPv6) == 0 || p.Key.VNI != r.VIP.VNI {
		return false
	}
	e := ic.find(r, p.Backend)
	if e == nil {
		return false
	}
	n, _ := f.fast.hit(e, p, false) // the full pipeline's first pass completed any partial checksum
	if n == 0 {
		return false
	}
	binary.BigEndian.PutUint16(p.Data()[header.EthernetSize+header.IPv4MinSize:], encap.SourcePort(p.Hash))
	f.accounting(b, t).AddID(r, e.id, n, p.Flags&engine.FlagNewFlow != 0)
	if e.touched != ic.gen {
		t.nh.Touch4([4]byte(e.img[header.EthernetSize+16:])) // the outer IPv4 destination
		e.touched = ic.gen
	}
	ic.used++
	return true
}

// fillImage keeps the image of the headers the stages have just written
// for p, placed on its backend and sent to a resolved next hop in an
// IPv4 tunnel, for its backend's next packets.
func (f *fused) fillImage(ic *imageCache, p *engine.Packet) {
	d := p.Data()
	if !f.fast.keepable(p, d) {
		return
	}
	r := p.Rule
	e := ic.slot(r, p.Backend)
	e.epoch, e.rule, e.backend, e.id = ic.epoch, r, p.Backend, r.Backends[p.Backend].ID
	e.out = p.OutPort
	e.touched = ic.gen // the stages' next-hop lookup just showed it
	setImage(e, d)
}

// setImage sets e's image to the first bytes of frame d, the stages'
// output, its outer checksum made that of a TOS and total length of 0:
// a hit writes the packet's and adds them to it.
func setImage(e *fastEntry, d []byte) {
	e.img = [encap.OverheadIPv4 + 12]byte(d)
	ip := header.IPv4(e.img[header.EthernetSize:])
	w0, w1 := binary.BigEndian.Uint16(ip[0:]), binary.BigEndian.Uint16(ip[2:])
	ip.SetChecksum(header.ChecksumUpdate16(header.ChecksumUpdate16(ip.Checksum(), w0, w0&0xff00), w1, 0))
}
