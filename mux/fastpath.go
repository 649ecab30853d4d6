package mux

import (
	"encoding/binary"
	"math/rand/v2"
	"sync/atomic"
	"unsafe"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/guard"
	"github.com/xdplb/xdplb/header"
)

// The fast path: each worker remembers, per flow, the whole decision the
// fused pipeline made for an established flow's packet — the outer headers
// it wrote (with the next hop's MACs), the inner MACs, the rule, backend
// and output port — and encapsulates the flow's next packets from it,
// without the source filter's, the rule's, the connection table's,
// Maglev's and the next hop's lookups. Every other packet runs the fused
// pipeline as before, and fills the cache when it may.
//
// A decision is kept only for a packet the balancing stage placed by a
// proven flow's connection-table entry of the packet's own class
// (balance.Pass.Settled: established TCP without SYN, FIN or RST, or UDP),
// at a backend that is up, encapsulated in IPv4 and sent to a resolved
// next hop. It is used for a later packet only if everything it depends on
// holds:
//   - the same flow key, and a packet of the same class: a SYN, FIN or RST
//     runs the full pipeline (and a FIN or RST that changes the entry
//     removes the decision), as do fragments, ICMP and anything else;
//   - the same worker epoch: the batch's rule snapshot (rules, backends
//     and their health), the source filter's prefix set and the next-hop
//     stage's answers (the resolver's version, nexthop.Pass.Answers) are
//     those the decision was made under; a new snapshot also empties the
//     cache, so that it holds no rule of an old one. The next-hop stage's
//     periodic refresh of its cached answers (every 1024 batches) does not
//     end the epoch: a hit shows the resolver its next hop once per
//     next-hop generation instead (nexthop.Pass.Touch4), as the full
//     pipeline's lookup would, so that its idle sweep spares it;
//   - the flow's entry last seen no longer ago than the connection
//     table's refresh interval for its class (flow.ConnTable.RefreshAfter),
//     counted from the entry's last-seen as the full pipeline's lookup
//     left it (balance.Pass.Seen), not from that lookup: past it, a lookup
//     would refresh the entry, so the flow runs the full pipeline once,
//     whose lookup does. The entry is thus last seen when it would be
//     with a lookup for every packet (it expires when it would), and a
//     change another worker made to it is seen within that interval;
//   - the packet itself: not addressed to an Ethernet group address (the
//     source filter's per-packet check), its TTL above 1, the tunnel
//     within the MTU and the headroom enough; otherwise the full pipeline
//     answers it (ICMP error, drop) as it would have.
//
// A hit writes what the full pipeline writes — the inner TTL decremented,
// the outer TOS, lengths and IPv4 checksum patched for the packet — and is
// counted by the Account stage as the full pipeline counts it; it completes
// a partial checksum as the partial-checksum stage does. Its output bytes,
// drop reasons and counters are those of the pipeline without the fast
// path: TestFastPathAgrees, TestFusedAgrees and FuzzFused compare them.
// (A hit does not set Packet.Hash, which nothing after the pipeline reads.)
//
// Each worker's cache is two-way skewed-associative, fastSlots entries of
// 128 bytes (1 MB), made on the worker's first batch: a key may be in one
// entry of each half, placed by two hashes, so that three flows that
// share one entry rarely share the other (with one set of two entries
// for both ways, such flows kept evicting each other: 1.4% of the packets
// at 1,000 flows). The two entries of a batch's packets are prefetched
// before any is looked up, so that their cache misses overlap. A batch
// without a worker index (made by hand) does not use it. A worker whose
// packets rarely hit naps (see awake).
type fastPath struct {
	caches   engine.PerWorker[fastCache]
	ct       *flow.ConnTable
	decTTL   bool
	keepSrc  bool // the inner Ethernet source is the frame's own (encap: no InnerSrcMAC)
	mtu      int
	slowPath bool
	slowPort uint16
	refresh  [4]flow.Tick // flow.ConnTable.RefreshAfter by class
}

const (
	fastWayBits = 12 // entries per way: 1 << fastWayBits
	fastWays    = 2
	fastSlots   = fastWays << fastWayBits
	noSlot      = ^uint32(0)
)

// fastEntry is one flow's decision, valid in its cache's epoch: 128
// bytes, two cache lines — the first has what a lookup compares, the
// second what a hit writes (a key's two entries, four lines, are
// prefetched together).
type fastEntry struct {
	key   fastKey
	epoch uint16
	class flow.StateClass
	// touched is the low byte of the next-hop generation in which the
	// resolver last saw the entry's next hop (fastCache.hopGen). Only
	// equality is tested: an entry left alone for a multiple of 256
	// generations is not shown once, which at worst lets the resolver
	// forget a next hop in use — a new resolver version, which ends the
	// epoch.
	touched uint8
	seen    flow.Tick // the entry's last-seen after the full pipeline's last lookup (balance.Pass.Seen)
	backend int32
	id      uint32     // the backend's ID (rule.Backends[backend].ID), which the Account stage counts by
	rule    *flow.Rule // its VIP's VNI is the key's after the uplink VNI stage
	// img is the first bytes of the frame the full pipeline wrote, up to
	// the inner EtherType: the outer Ethernet, IPv4, UDP and VXLAN
	// headers, then the inner MACs. The outer IPv4 checksum is that of a
	// TOS and total length of 0 (fill), so that a hit copies the image
	// whole, writes the packet's two fields and adds them to it.
	img [encap.OverheadIPv4 + 12]byte
	out uint16
}

// The entry's size is 128 bytes, and what a lookup reads is in its
// first line: a compile-time check.
var (
	_ [0]struct{} = [unsafe.Sizeof(fastEntry{}) - 128]struct{}{}
	_ [0]struct{} = [unsafe.Offsetof(fastEntry{}.img) - 64]struct{}{}
)

// fastKey is a flow key as the fast path keeps and compares it: flow.Key's
// fields but the VNI, in five words. Every key the fast path looks up has
// VNI 0 (the fused stage parses with VNI 0, and the uplink VNI stage sets
// the VNI after the lookup; eligible requires it), so leaving it out
// loses nothing, and makes room in the entry's first line for the
// backend's ID.
type fastKey struct {
	addr [4]uint64 // Src and Dst, little-endian words
	rest uint64    // SrcPort, DstPort, Proto and Family
}

// set makes f the fastKey of k (k's VNI aside), word by word: a struct
// literal copied in would be written in narrow stores and read back in
// wide loads, which the CPU cannot forward (a store-forwarding stall,
// measured: 7 to 9 ns a packet of the Mux's pipeline at 1k flows).
func (f *fastKey) set(k *flow.Key) {
	le := binary.LittleEndian
	f.addr[0], f.addr[1], f.addr[2], f.addr[3] = le.Uint64(k.Src[0:]), le.Uint64(k.Src[8:]), le.Uint64(k.Dst[0:]), le.Uint64(k.Dst[8:])
	f.rest = uint64(k.SrcPort) | uint64(k.DstPort)<<16 | uint64(k.Proto)<<32 | uint64(k.Family)<<40
}

// sameKey is a == b word by word (the generated comparison calls
// memequal). The parentheses matter: | and ^ bind alike in Go, and
// a^b|c^d without them is ((a^b)|c)^d (TestFastKey).
func sameKey(a, b *fastKey) bool {
	return (a.addr[0]^b.addr[0])|(a.addr[1]^b.addr[1])|(a.addr[2]^b.addr[2])|(a.addr[3]^b.addr[3])|(a.rest^b.rest) == 0
}

// fastCache is one worker's cache, and its state for the batch it runs.
type fastCache struct {
	// The entries, first: a large allocation starts on a page, so every
	// entry is two whole cache lines. The first fastSlots/2 are way 0,
	// the others way 1.
	e [fastSlots]fastEntry

	images imageCache // the worker's tunnel images, awake or napping (fastimage.go)

	epoch  uint16 // entries of this epoch are valid; 0 is never one
	snap   *flow.Snapshot
	set    *guard.Prefixes
	hop    uint32 // the next-hop stage's answers (nexthop.Pass.Answers)
	hopGen uint8  // the low byte of its generation (nexthop.Pass.Generation)
	seed   uint64
	now    flow.Tick
	turn   uint32 // which of a key's two entries, both taken, the next fill takes

	// The hit ratio over a window of fastWindow lookups, and the window's
	// fills of free entries (the cache warming): see judge.
	winHits, winLooks, winFree uint32
	warming                    uint32 // windows in a row judged warming
	sleep, nap                 uint32
	batchHits, batchLooks      int // of the batch running, for judge

	hits, misses, naps atomic.Uint64 // packets looked up, and naps: for the metrics

	// Of the batch running: each packet's two slots (slotsOf; noSlot:
	// not eligible), class and key as parsed (the pipeline changes the
	// key's VNI).
	slot  [engine.MaxBatch]uint32
	class [engine.MaxBatch]flow.StateClass
	keys  [engine.MaxBatch]fastKey
	miss  [engine.MaxBatch]*engine.Packet
	at    [engine.MaxBatch]uint8       // a miss's index in the batch
	pf    [2 * engine.MaxBatch]uintptr // the entries to prefetch (c.e's, which c keeps alive)
}

// newFastPath returns the fast path for the fused stages f, or nil when
// they cannot keep decisions: no connection table.
func newFastPath(m *muxStages) *fastPath {
	ct := m.bal.Conns()
	if ct == nil {
		return nil
	}
	ec := m.enc.Config()
	nc := m.nh.Config()
	fp := &fastPath{ct: ct, decTTL: ec.DecrementTTL, keepSrc: ec.InnerSrcMAC == header.MAC{}, mtu: ec.MTU,
		slowPath: nc.SlowPath, slowPort: nc.SlowPort}
	for c := range fp.refresh {
		fp.refresh[c] = ct.RefreshAfter(flow.StateClass(c))
	}
	fp.caches.New = func() *fastCache { return &fastCache{seed: rand.Uint64() | 1, epoch: 1} } // 0 is an empty entry's epoch
	return fp
}

// Stats returns the packets the fast path encapsulated (hits) and those
// it looked up that ran the full pipeline (misses).
func (fp *fastPath) Stats() (hits, misses uint64) {
	s := fp.stats()
	return s.hits, s.misses
}

// fastStats are a fast path's counters, summed over workers.
type fastStats struct{ hits, misses, naps, images uint64 }

func (fp *fastPath) stats() (s fastStats) {
	if fp == nil {
		return s
	}
	fp.caches.Range(func(_ int, c *fastCache) bool {
		s.hits += c.hits.Load()
		s.misses += c.misses.Load()
		s.naps += c.naps.Load()
		s.images += c.images.hits.Load()
		return true
	})
	return s
}

// The fast path's sleep: a worker whose flows are too many, or too
// evenly spread, for its cache (a million flows sending in turn) pays
// for the lookups and fills of packets that never hit. Over each window
// of fastWindow lookups (64 full batches) the worker counts its hits;
// with fewer than one in fastMinRatio of its lookups it runs the full
// pipeline alone for a nap of fastMinNap batches, doubled after every
// poor window up to fastMaxNap (at 64 packets a batch and 3 Mpps,
// 0.35 s), then tries again. Waking starts a new epoch: the full
// pipeline did not keep the cache current while it slept, so the
// window after a nap begins with a miss for every flow, which fills
// the cache. The window is counted in lookups, not batches, so that
// small batches (a moderate packet rate) judge as many packets: a
// window of 64 batches of 16 was one pass over 1,000 flows, all of
// them such misses, and the cache napped on and on
// (TestFastPathSmallBatches). Nor is a window held against the cache
// while it warms — after a nap or a new snapshot, when most of its
// misses fill free entries: such a window is neither good nor poor, the
// worker stays awake and its nap length is kept, for as many windows as
// it takes to fill every entry (fastSlots/fastWindow). Else more flows
// sending in turn than about 7/8 of a window (3,584: a miss each leaves
// fewer than fastWindow/fastMinRatio hits) kept a worker napping after
// its first nap, though its cache would hold them
// (TestFastPathHoldsWhatFits: 5,000 flows, no hits). Too many flows for
// the cache still nap: once its entries are taken, their fills evict.
const (
	fastWindow   = 4096
	fastMinRatio = 8
	fastMinNap   = 256
	fastMaxNap   = 16384
)

// awake reports whether the cache is used for the next batch, counting
// a nap down.
func (c *fastCache) awake() bool {
	if c.sleep == 0 {
		return true
	}
	c.sleep--
	if c.sleep == 0 {
		c.newEpoch() // the decisions kept before the nap are stale
		c.winHits, c.winLooks, c.winFree = 0, 0, 0
	}
	return false
}

// judge adds a batch's hits and lookups to the window, and ends the
// window when it is full: good (at least one hit in fastMinRatio
// lookups), warming (fewer, but at least half of the misses filled a
// free entry, and not more windows in a row than it takes to fill them
// all: the worker stays awake, its nap length kept), or poor (a nap,
// longer than the last). It runs at the end of a batch, after the
// batch's fills.
func (c *fastCache) judge() {
	c.winHits += uint32(c.batchHits)
	c.winLooks += uint32(c.batchLooks)
	if c.winLooks < fastWindow {
		return
	}
	switch {
	case c.winHits*fastMinRatio >= c.winLooks:
		c.nap, c.warming = 0, 0
	case 2*c.winFree >= c.winLooks-c.winHits && c.warming < fastSlots/fastWindow:
		c.warming++ // judged again over the next window
	default:
		c.warming = 0
		c.nap = min(max(c.nap*2, fastMinNap), fastMaxNap)
		c.sleep = c.nap
		c.naps.Add(1)
		// A nap may last long on a quiet worker: hold no rule of the
		// snapshot meanwhile (begin starts a new epoch on waking).
		clear(c.e[:])
		c.snap = nil
	}
	c.winHits, c.winLooks, c.winFree = 0, 0, 0
}

// begin readies worker cache c for a batch of snapshot snap, source
// prefixes set, next-hop answers hop and next-hop generation gen at tick
// now.
func (c *fastCache) begin(snap *flow.Snapshot, set *guard.Prefixes, hop, gen uint32, now flow.Tick) {
	if snap != c.snap {
		clear(c.e[:]) // hold no rule of an old snapshot
		c.snap = snap
		c.newEpoch()
	}
	if set != c.set || hop != c.hop {
		c.set, c.hop = set, hop
		c.newEpoch()
	}
	c.hopGen = uint8(gen)
	c.now = now
}

// newEpoch starts a new epoch: the decisions kept in earlier ones no
// longer match. The count wraps after 2^16 epochs (snapshots, prefix
// sets, next-hop versions, naps); there the cache is emptied once, so
// that no entry kept 2^16 epochs ago matches its number again, and the
// count skips 0, the epoch of an empty entry (TestFastCacheEpochWraps).
func (c *fastCache) newEpoch() { nextEpoch(&c.epoch, c.e[:]) }

// nextEpoch advances *epoch, the epoch of entries e, as newEpoch
// describes.
func nextEpoch(epoch *uint16, e []fastEntry) {
	if *epoch++; *epoch == 0 {
		clear(e)
		*epoch = 1
	}
}

// slotsOf places key k in a cache of seed seed: the index of its entry in
// way 0 in the low half, that of its entry in way 1 in the high half.
func slotsOf(k *fastKey, seed uint64) uint32 {
	const m1, m2, m3, m4 = 0x9e3779b97f4a7c15, 0xc2b2ae3d27d4eb4f, 0x165667b19e3779f9, 0xd6e8feb86659fd93
	h := (k.addr[0]^seed)*m1 + k.addr[1]*m2 + k.addr[2]*m3 + k.addr[3]*m4 + k.rest*m1
	h ^= h >> 29
	h *= m2
	const mask = 1<<fastWayBits - 1
	w0 := uint32(h >> (64 - fastWayBits))
	w1 := 1<<fastWayBits | uint32(h>>(64-2*fastWayBits))&mask
	return w0 | w1<<16
}

// entries returns the entries of slots s (slotsOf).
func (c *fastCache) entries(s uint32) (e0, e1 *fastEntry) {
	return &c.e[s&0xffff], &c.e[s>>16]
}

// find returns the entry of slots s that holds key k in the cache's
// epoch, or nil.
func (c *fastCache) find(s uint32, k *fastKey) *fastEntry {
	e0, e1 := c.entries(s)
	if e0.epoch == c.epoch && sameKey(&e0.key, k) {
		return e0
	}
	if e1.epoch == c.epoch && sameKey(&e1.key, k) {
		return e1
	}
	return nil
}

// place returns the entry of slots s to keep key k's decision in: the
// one holding k, else one not valid in the epoch, else the two in turn.
func (c *fastCache) place(s uint32, k *fastKey) *fastEntry {
	e0, e1 := c.entries(s)
	switch {
	case sameKey(&e0.key, k):
		return e0
	case sameKey(&e1.key, k):
		return e1
	case e0.epoch != c.epoch:
		return e0
	case e1.epoch != c.epoch:
		return e1
	}
	c.turn++
	if c.turn&1 == 0 {
		return e0
	}
	return e1
}

// eligible reports whether p, parsed, may be a hit: a TCP or UDP packet
// of IPv4 or IPv6 with its ports, not a fragment, its key's VNI 0 (as
// parsed: see fastKey).
func eligible(p *engine.Packet) bool {
	return p.Flags&(engine.FlagL4|engine.FlagFragment) == engine.FlagL4 &&
		p.Flags&(engine.FlagIPv4|engine.FlagIPv6) != 0 &&
		(p.L4Proto == flow.ProtoTCP || p.L4Proto == flow.ProtoUDP) && p.Key.VNI == 0
}

// hit encapsulates p by entry e and returns the length of the client's IP
// packet (the Account stage's count), or returns 0 and leaves p as it was
// when p needs the full pipeline: it is addressed to an Ethernet group
// address, its TTL expires, its tunnel exceeds the MTU, it lacks
// headroom. completed reports that it completed p's partial checksum
// (when partial is set).
func (fp *fastPath) hit(e *fastEntry, p *engine.Packet, partial bool) (n int, completed bool) {
	data := p.Data()
	if len(data) == 0 || data[0]&1 != 0 {
		return 0, false // a group address: the source filter drops it
	}
	l3 := int(p.L3Off)
	var (
		l3len   int
		tc, ttl uint8
		ip4     header.IPv4
		ip6     header.IPv6
	)
	if p.Flags&engine.FlagIPv4 != 0 {
		if l3+header.IPv4MinSize > len(data) {
			return 0, false
		}
		ip4 = header.IPv4(data[l3:])
		l3len, tc, ttl = int(ip4.TotalLength()), ip4.TOS(), ip4.TTL()
	} else {
		if l3+header.IPv6Size > len(data) {
			return 0, false
		}
		ip6 = header.IPv6(data[l3:])
		l3len, tc, ttl = header.IPv6Size+int(ip6.PayloadLength()), ip6.TrafficClass(), ip6.HopLimit()
	}
	const hdr = encap.OverheadIPv4
	start := l3 - header.EthernetSize // where the untagged inner frame starts
	inner := header.EthernetSize + l3len
	if start < 0 || l3+l3len > len(data) || fp.decTTL && ttl <= 1 ||
		hdr-header.EthernetSize+inner > fp.mtu || p.Headroom()+start < hdr {
		return 0, false
	}
	if partial {
		completed = engine.Complete(p)
	}
	if fp.decTTL {
		if ip4 != nil {
			ip4.SetTTLWithChecksumUpdate(ttl - 1)
		} else {
			ip6.SetHopLimit(ttl - 1)
		}
	}
	var src [6]byte
	if fp.keepSrc {
		src = [6]byte(data[6:]) // the frame's source, before the image covers it
	}
	// The new frame, in one step: the tunnel's headers in the headroom
	// (and over any VLAN tags), then the inner frame, whose MACs the
	// image holds and whose EtherType is the frame's own, in place in
	// front of the IP header. It fits: checked above.
	out, _ := p.Reframe(start-hdr, hdr+inner)
	f := (*[hdr + header.EthernetSize]byte)(out)
	*(*[hdr + 12]byte)(f[:]) = e.img
	if fp.keepSrc {
		*(*[6]byte)(f[hdr+6:]) = src
	}
	// The image's checksum is that of a TOS and total length of 0: write
	// the packet's and add them (RFC 1624: the sum over the words that
	// changed).
	be := binary.BigEndian
	n1 := uint16(hdr - header.EthernetSize + inner)
	f[15] = tc
	be.PutUint16(f[16:], n1)
	sum := uint32(^be.Uint16(e.img[24:])) + uint32(tc) + uint32(n1)
	sum = sum&0xffff + sum>>16
	sum = sum&0xffff + sum>>16
	be.PutUint16(f[24:], ^uint16(sum))
	be.PutUint16(f[38:], uint16(header.UDPSize+header.VXLANSize+inner))
	p.Key.VNI = e.rule.VIP.VNI
	p.Rule, p.Backend = e.rule, e.backend
	p.OutPort = e.out
	return l3len, completed
}

// fill keeps the decision the full pipeline made for p — the miss at
// index j of the batch's misses, whose batch index is i — when p may be
// kept (see fastPath), and otherwise forgets any decision of p's flow.
func (fp *fastPath) fill(c *fastCache, bal *balance.Pass, i, j int, p *engine.Packet) {
	s := c.slot[i]
	if s == noSlot {
		return
	}
	d := p.Data()
	if !bal.Settled(j) || !fp.keepable(p, d) {
		c.drop(s, &c.keys[i])
		return
	}
	e := c.place(s, &c.keys[i])
	if e.epoch != c.epoch {
		c.winFree++ // the cache warming (judge)
	}
	e.key, e.epoch = c.keys[i], c.epoch
	e.rule, e.backend, e.id = p.Rule, p.Backend, p.Rule.Backends[p.Backend].ID
	e.seen = bal.Seen(j)
	e.out, e.class = p.OutPort, c.class[i]
	e.touched = c.hopGen // the full pipeline's next-hop lookup just showed it
	setImage(e, d)
}

// keepable reports whether the headers the stages wrote for p (its frame
// d) may be kept as an image, for a fast-path decision or a tunnel
// image: p placed on a backend of its rule, whose VNI its key has, and
// sent in an IPv4 tunnel to a resolved next hop, not to the slow path.
func (fp *fastPath) keepable(p *engine.Packet, d []byte) bool {
	return p.Verdict == engine.VerdictTX && p.Rule != nil && uint32(p.Backend) < uint32(len(p.Rule.Backends)) &&
		!(fp.slowPath && p.OutPort == fp.slowPort) &&
		len(d) >= encap.OverheadIPv4+header.EthernetSize && binary.BigEndian.Uint16(d[12:]) == header.EtherTypeIPv4 &&
		p.Key.VNI == p.Rule.VIP.VNI
}

// forget removes the decisions of the TCP and UDP packets of a batch that
// runs through the separate stages (one with ICMP): a FIN or RST among
// them changes its flow's entry, which the cache would not see.
func (fp *fastPath) forget(b *engine.Batch) {
	c := fp.caches.Get(b.Worker)
	if c == nil {
		return
	}
	for _, p := range b.Packets() {
		if eligible(p) {
			var k fastKey
			k.set(&p.Key)
			c.drop(slotsOf(&k, c.seed), &k)
		}
	}
}

// drop removes key k's decision from slots s.
func (c *fastCache) drop(s uint32, k *fastKey) {
	e0, e1 := c.entries(s)
	if sameKey(&e0.key, k) {
		e0.epoch = 0
	}
	if sameKey(&e1.key, k) {
		e1.epoch = 0
	}
}
