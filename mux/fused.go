package mux

import (
	"errors"
	"unsafe"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/guard"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/prefetch"
)

// muxStages are the stages of the Mux's pipeline after Parse, in order:
// source filter → partial checksums → uplink VNI → ICMP → balance → encap
// (TTL) → next hop → account. Partial may be nil (no partial-checksum
// stage).
type muxStages struct {
	sources *guard.Sources
	partial *engine.PartialChecksums
	vni     uplinkVNI
	icmp    *balance.ICMP
	bal     *balance.Stage
	enc     *encap.Encap
	nh      *nexthop.Stage
	acct    *balance.Account
}

// stages returns the stages in pipeline order, Parse first.
func (m *muxStages) stages() []engine.Stage {
	s := []engine.Stage{engine.Parse{}, m.sources}
	if m.partial != nil {
		s = append(s, m.partial)
	}
	return append(s, m.vni, m.icmp, m.bal, m.enc, m.nh, m.acct)
}

// fused is the Mux's pipeline as one stage: the same work as the
// separate stages of muxStages (engine.NewPipeline(m.stages()...)), with
// the same output bytes, drop reasons and counters, in two loops over
// the batch after Parse's instead of nine or ten.
//
// Parse runs over the whole batch first. A batch with a packet the ICMP
// stage handles (balance.ICMPHandles: echo requests, ICMP errors) then
// runs through the separate stages, as the pipeline would run it. Any
// other batch — the common case, TCP and UDP to VIPs — runs through the
// stages' per-packet steps, each packet in the stages' order: pass 1
// filters its source, completes a partial checksum and sets the uplink
// VNI; pass 2, for each packet in turn, finishes its connection-table
// lookup and places the flow (balance.Pass.Place), then encapsulates,
// addresses it to the next hop and counts it — or does those three
// stages' work from its backend's tunnel image (fastimage.go). Pass 2
// finds the rule and hash and starts the lookup (balance.Pass.Prepare)
// fusedAhead packets ahead, so that the table's cache misses overlap
// with the work on the packets before; Prepare and Place each run in
// batch order, as the balance stage's own two passes run them, and what
// one packet's Place changes in the table is there for the next
// packet's, as there. A packet a step drops skips the later steps, and
// one encap answers with an ICMP error (Batch.Emit) skips the next hop
// and the count, as the separate stages' pipeline would have removed it
// from the batch; a stage's per-batch step (Begin) runs only when a
// packet reaches it, as the pipeline calls a stage only while the batch
// has packets. The ICMP stage leaves every other packet as it is, so
// skipping it changes nothing.
//
// Before those passes the fast path (fastPath) encapsulates the packets
// of established flows whose whole decision its worker keeps, and only
// the rest run the passes; they fill the cache. The next-hop stage's
// pass then begins before the first packet reaches it (the fast path
// and the tunnel images need its answers and generation, and Touch4 the
// next hops they use): its worker's count of batches towards the
// periodic refresh of its answers counts every batch the fast path
// runs, which changes when it asks its Source again, not what it writes
// (a VersionedSource's answers change only with its version).
//
// TestFusedAgrees, TestFastPathAgrees and FuzzFused run the same frames
// through both and compare every output byte and every counter.
type fused struct {
	muxStages
	rules *flow.Rules      // for batches without a worker snapshot (uplinkVNI's)
	slow  *engine.Pipeline // the stages after Parse, for batches with ICMP
	fast  *fastPath        // nil: off (no connection table, or turned off)

	// For BenchmarkMuxPipelineFull: how far ahead Prepare runs
	// (fusedAhead), and no tunnel images (fastimage.go).
	ahead    int
	noImages bool
}

// newFused returns the fused stage of m.
func newFused(m muxStages) (*fused, error) {
	if m.sources == nil || m.icmp == nil || m.bal == nil || m.enc == nil || m.nh == nil || m.acct == nil {
		return nil, errors.New("mux: a stage of the fused pipeline is missing")
	}
	return &fused{muxStages: m, rules: m.vni.rules, slow: engine.NewPipeline(m.stages()[1:]...), fast: newFastPath(&m), ahead: fusedAhead}, nil
}

// Process implements engine.Stage.
func (f *fused) Process(b *engine.Batch) {
	icmp := false
	for _, p := range b.Packets() {
		if r := engine.ParsePacket(p, 0); r != 0 {
			b.Drop(p, r)
			continue
		}
		icmp = icmp || balance.ICMPHandles(p)
	}
	b.Compact()
	if icmp {
		if f.fast != nil {
			f.fast.forget(b)
		}
		f.slow.Process(b)
		return
	}
	pkts := b.Packets()
	if len(pkts) == 0 {
		return
	}
	t := tail{src: f.sources.Begin(b), snap: b.Rules(f.rules)}
	var w, c *fastCache // the worker's cache; c: its flows' decisions, when it is awake
	if f.fast != nil {
		if w = f.fast.caches.Get(b.Worker); w != nil && w.awake() {
			c = w
		}
	}
	if c != nil {
		f.nh.Begin(b, &t.nh)
		t.nhOn = true
		if hop, ok := t.nh.Answers(); ok {
			gen, _ := t.nh.Generation()
			pkts = f.fastPass(b, c, hop, gen, pkts, &t)
		} else {
			c = nil
		}
	}
	if len(pkts) > 0 {
		f.full(b, pkts, &t, w)
		if c != nil {
			for j, p := range pkts {
				f.fast.fill(c, &t.bal, int(c.at[j]), j, p)
			}
		}
	}
	if c != nil {
		c.judge() // after the fills, which it counts
	}
	if t.on {
		t.acct.End()
	}
}

// tail is the state of one batch's run through the fused stages: the
// passes begun, shared by the fast path and the full pipeline.
type tail struct {
	src      guard.SourcesPass
	snap     *flow.Snapshot
	bal      balance.Pass
	nh       nexthop.Pass
	acct     balance.AccountPass
	nhOn, on bool
}

// accounting returns the batch's Account pass, begun at the first
// packet that reaches the stage.
func (f *fused) accounting(b *engine.Batch, t *tail) *balance.AccountPass {
	if !t.on {
		t.acct = f.acct.Begin(b)
		t.on = true
	}
	return &t.acct
}

// fastPass runs the fast path (see fastPath) over the batch's parsed
// packets on worker cache c, whose next-hop answers are hop and
// generation gen: it
// encapsulates and counts the hits and returns the misses, in batch
// order, for the full pipeline (c.at holds their batch indices).
func (f *fused) fastPass(b *engine.Batch, c *fastCache, hop, gen uint32, pkts []*engine.Packet, t *tail) []*engine.Packet {
	fp := f.fast
	c.begin(t.snap, t.src.Prefixes(), hop, gen, f.bal.Now())
	partial := f.partial != nil
	var completed uint64
	nm, hits, looks := 0, 0, 0
	// Where each packet's decision would be, prefetched for the whole
	// batch in one call, so that the cache misses of its lookups overlap.
	np := 0
	for i, p := range pkts {
		c.slot[i] = noSlot
		if eligible(p) {
			c.keys[i].set(&p.Key)
			s := slotsOf(&c.keys[i], c.seed)
			c.slot[i] = s
			e0, e1 := c.entries(s)
			c.pf[np], c.pf[np+1] = uintptr(unsafe.Pointer(e0)), uintptr(unsafe.Pointer(e1))
			np += 2
		}
	}
	prefetch.Pairs(c.pf[:np])
	for i, p := range pkts {
		if s := c.slot[i]; s != noSlot {
			looks++
			cls := p.StateClass()
			c.class[i] = cls
			if e := c.find(s, &c.keys[i]); e != nil && e.class == cls && c.now-e.seen <= fp.refresh[cls] {
				if n, done := fp.hit(e, p, partial); n > 0 {
					if done {
						completed++
					}
					f.accounting(b, t).AddID(e.rule, e.id, n, false)
					if e.touched != c.hopGen {
						// The first hit in this next-hop generation:
						// show the resolver the next hop in use.
						t.nh.Touch4([4]byte(e.img[header.EthernetSize+16:])) // the outer IPv4 destination
						e.touched = c.hopGen
					}
					hits++
					continue
				}
			}
		}
		c.miss[nm], c.at[nm] = p, uint8(i)
		nm++
	}
	if completed != 0 {
		f.partial.Count(b, completed)
	}
	if hits != 0 {
		c.hits.Add(uint64(hits))
	}
	if looks != hits {
		c.misses.Add(uint64(looks - hits))
	}
	c.batchHits, c.batchLooks = hits, looks
	return c.miss[:nm]
}

// full runs the fused pipeline (see fused) over pkts, parsed packets of
// batch b, with the tunnel images of worker cache w (nil: none).
func (f *fused) full(b *engine.Batch, pkts []*engine.Packet, t *tail, w *fastCache) {
	// Pass 1: source filter, partial checksum, uplink VNI.
	snap := t.snap
	var vni uint32
	multi := false // the VIPs are in several VNIs: one probe per packet
	if snap != nil {
		var single bool
		vni, single = snap.SingleVNI()
		multi = !single
	}
	var completed uint64
	live := 0
	for _, p := range pkts {
		if r := t.src.Check(p); r != 0 {
			b.Drop(p, r)
			continue
		}
		live++
		if f.partial != nil && engine.Complete(p) {
			completed++
		}
		if multi {
			uplinkPacket(snap, p)
		} else if vni != 0 {
			p.Key.VNI = vni
		}
	}
	if f.partial != nil {
		f.partial.Count(b, completed)
	}
	if live == 0 {
		return // the pipeline would stop here: no stage's pass begins
	}

	// Pass 2: balance's two steps (balance.Pass: Prepare finds the rule
	// and hash and prefetches the connection table's buckets, Place
	// finishes the lookup and places the flow), Prepare f.ahead packets
	// ahead; then encap, next hop and account, or the packet's tunnel
	// image. Each stage's pass begins at the first packet that reaches
	// it, as the pipeline calls a stage only while the batch has packets
	// left; with images, the next-hop stage's begins at the first packet
	// that reaches encap (the images need its answers).
	f.bal.Begin(b, &t.bal)
	var ic *imageCache
	var place uint64 // the packets Prepare asked to Place
	next := 0        // the next packet to Prepare
	for i, p := range pkts {
		for ; next < len(pkts) && next <= i+f.ahead; next++ {
			if q := pkts[next]; q.Verdict == engine.VerdictTX {
				r, pl := t.bal.Prepare(next, q)
				if r != 0 {
					b.Drop(q, r)
				}
				if pl {
					place |= 1 << uint(next)
				}
			}
		}
		if place&(1<<uint(i)) != 0 {
			if r := t.bal.Place(i, p); r != 0 {
				b.Drop(p, r)
			}
		}
		if p.Verdict != engine.VerdictTX {
			continue // dropped
		}
		if w != nil && !f.noImages {
			ic, w = f.beginImages(b, t, w), nil
		}
		if ic != nil && f.image(b, ic, p, t) {
			continue
		}
		if r := f.enc.Packet(b, p); r != 0 {
			b.Drop(p, r)
			continue
		}
		if p.Verdict == engine.VerdictEmit {
			continue // answered with an ICMP error: finished
		}
		if !t.nhOn {
			f.nh.Begin(b, &t.nh)
			t.nhOn = true
		}
		if r := t.nh.Packet(p); r != 0 {
			b.Drop(p, r)
			continue
		}
		f.accounting(b, t).Packet(p)
		if ic != nil {
			f.fillImage(ic, p)
		}
	}
	t.bal.End()
	if ic != nil && ic.used != 0 {
		ic.hits.Add(uint64(ic.used))
	}
}

// fusedAhead is how many packets ahead of the one being placed the fused
// stage prepares (balance.Pass.Prepare), which prefetches the packet's
// connection-table buckets: at a million flows they are a cache and TLB
// miss each, and come in while the packets before it are placed and
// encapsulated. BenchmarkMuxPipelineFull compares it with preparing the
// whole batch first.
const fusedAhead = 16

var _ engine.Stage = (*fused)(nil)
