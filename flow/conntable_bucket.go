package flow

import (
	"math/bits"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/xdplb/xdplb/internal/prefetch"
)

// This file holds the bucket table behind ConnTable. One generic
// implementation serves both key widths: an IPv4 slot is 3 words (2 key
// words and the value word), an IPv6 slot 6 words (5 key words and the
// value word). Go compiles one copy per slot shape, so the key loops below
// run over a constant length.

const (
	ctSlots     = 5
	ctCacheLine = 64

	// Bucket header: bits 0..31 sequence (odd while a writer is inside),
	// bits 32..51 a 4-bit tag per slot (0 = free), bits 52..61 a 2-bit
	// class per slot. Slot masks below have bit 4j set for slot j.
	ctSeqMask  = 1<<32 - 1
	ctTagShift = 32
	ctTagMask  = 1<<(4*ctSlots) - 1
	ctClsShift = ctTagShift + 4*ctSlots
	ctLanes    = 0x11111 // bit 0 of each slot's tag nibble

	// ctReadSpins bounds how often a reader re-reads a bucket that a writer
	// holds or changed under it before it reports a miss (counted in
	// Stats.Contended). A writer holds a bucket for a few dozen
	// instructions; running out of spins means the writer was descheduled.
	ctReadSpins = 256
	// ctLockSpins bounds how often a data-path writer (Insert, SetClass)
	// tries to claim a bucket before it gives up with InsertBusy.
	ctLockSpins = 256
)

// ctSlotWords is the shape of a slot: key words followed by the value word
// (backend<<32 | last seen tick).
type ctSlotWords interface {
	[3]atomic.Uint64 | [6]atomic.Uint64
}

// ctPad rounds a bucket up to a whole number of cache lines.
type ctPad interface{ [0]uint64 | [1]uint64 }

// ctBucket is one seqlocked group of slots: 128 bytes (two cache lines) for
// IPv4, 256 bytes for IPv6.
type ctBucket[S ctSlotWords, P ctPad] struct {
	_    P // first: a zero-size last field would be padded
	hdr  atomic.Uint64
	slot [ctSlots]S
}

// ctKey holds a Key as machine words: 2 are used for IPv4, 5 for IPv6.
type ctKey [5]uint64

// ctNonZero returns the slot mask of the nonzero nibbles of x.
func ctNonZero(x uint64) uint64 { return (x | x>>1 | x>>2 | x>>3) & ctLanes }

// ctOcc returns the slot mask of the occupied slots.
func ctOcc(h uint64) uint64 { return ctNonZero(h >> ctTagShift & ctTagMask) }

// ctMatch returns the slot mask of the slots whose tag is tag (SWAR: the
// nibbles of tags XOR tag that are zero). Free slots never match, since a
// tag is never 0.
func ctMatch(h, tag uint64) uint64 {
	return ^ctNonZero(h>>ctTagShift&ctTagMask^tag*ctLanes) & ctLanes
}

// ctSlot turns the lowest bit of a slot mask into a slot index.
func ctSlot(m uint64) int { return bits.TrailingZeros64(m) >> 2 }

// ctClass returns the class of slot j.
func ctClass(h uint64, j int) StateClass { return StateClass(h>>(ctClsShift+2*j)) & 3 }

// ctSet marks slot j occupied with tag and class c.
func ctSet(h uint64, j int, tag uint64, c StateClass) uint64 {
	cs, ts := uint(ctClsShift+2*j), uint(ctTagShift+4*j)
	return h&^(3<<cs|0xf<<ts) | uint64(c&3)<<cs | tag<<ts
}

// ctSetClass changes the class of occupied slot j.
func ctSetClass(h uint64, j int, c StateClass) uint64 {
	cs := uint(ctClsShift + 2*j)
	return h&^(3<<cs) | uint64(c&3)<<cs
}

// ctClear marks slot j free.
func ctClear(h uint64, j int) uint64 {
	return h &^ (3<<(ctClsShift+2*j) | 0xf<<(ctTagShift+4*j))
}

// ctTag derives a slot's 4-bit tag (never 0) from the key hash: from bits
// 0..3 and 32..35, which the bucket indexes hardly depend on, so that keys
// sharing a bucket have independent tags.
func ctTag(hash uint64) uint64 {
	t := (hash ^ hash>>32) & 0xf
	if t == 0 {
		t = 0xf
	}
	return t
}

// ctNext returns h with its sequence advanced by one, wrapping within its
// 32 bits.
func ctNext(h uint64) uint64 { return h&^ctSeqMask | (h+1)&ctSeqMask }

func ctVal(backend uint32, seen Tick) uint64 { return uint64(backend)<<32 | uint64(seen) }

func ctBackend(v uint64) uint32 { return uint32(v >> 32) }

func ctSeen(v uint64) Tick { return Tick(uint32(v)) }

// ctIdle reports whether an entry last seen at seen is past timeout at now.
// Ticks wrap; a difference that is negative as an int32 (a worker with a
// slightly older clock reading) counts as fresh.
func ctIdle(now, seen Tick, timeout uint32) bool {
	return int32(uint32(now-seen)) > int32(timeout)
}

// tryLock claims the bucket, spinning at most ctLockSpins times, and returns
// the header as it stands while held (odd sequence).
func (b *ctBucket[S, P]) tryLock() (uint64, bool) {
	for range ctLockSpins {
		h := b.hdr.Load()
		if h&1 == 0 && b.hdr.CompareAndSwap(h, h+1) {
			return h + 1, true
		}
	}
	return 0, false
}

// lockWait claims the bucket, yielding the processor while another writer
// holds it. Only off the data path (Delete).
func (b *ctBucket[S, P]) lockWait() uint64 {
	for {
		if h, ok := b.tryLock(); ok {
			return h
		}
		runtime.Gosched()
	}
}

// unlock publishes held (the header as modified under the lock) with the
// next even sequence.
func (b *ctBucket[S, P]) unlock(held uint64) { b.hdr.Store(ctNext(held)) }

// unlockUnchanged releases a bucket whose slots the holder did not touch.
// Restoring the old even sequence spares readers a retry; it is safe
// because no word of the bucket changed.
func (b *ctBucket[S, P]) unlockUnchanged(held uint64) { b.hdr.Store(held - 1) }

// ctKeyWords is the number of key words in a slot of shape S. (It takes
// the length of a local zero value: len of a slot in the table would count
// as a read of the whole slot under the race detector.)
func ctKeyWords[S ctSlotWords]() int {
	var s S
	return len(s) - 1
}

// word returns word w of slot j. It indexes by address arithmetic: the
// bounds are the callers' (j < ctSlots, w ≤ key words), and indexing a
// type-parameter array would cost a bounds check and a dictionary load per
// word on the hottest loop.
func (b *ctBucket[S, P]) word(j, w int) *atomic.Uint64 {
	var s S
	return (*atomic.Uint64)(unsafe.Add(unsafe.Pointer(&b.slot), uintptr(j)*unsafe.Sizeof(s)+uintptr(w)*8))
}

// match reports whether slot j holds k.
func (b *ctBucket[S, P]) match(j int, k *ctKey) bool {
	for w := 0; w < ctKeyWords[S](); w++ {
		if b.word(j, w).Load() != k[w] {
			return false
		}
	}
	return true
}

// find returns the slot of h that holds k, or -1. Only the slots whose tag
// matches are compared, usually just the one that holds k.
func (b *ctBucket[S, P]) find(h uint64, k *ctKey, tag uint64) int {
	for m := ctMatch(h, tag); m != 0; m &= m - 1 {
		if j := ctSlot(m); b.match(j, k) {
			return j
		}
	}
	return -1
}

// val returns the value word of slot j.
func (b *ctBucket[S, P]) val(j int) *atomic.Uint64 { return b.word(j, ctKeyWords[S]()) }

// store writes k and v into slot j; the caller holds the bucket.
func (b *ctBucket[S, P]) store(j int, k *ctKey, v uint64) {
	for w := 0; w < ctKeyWords[S](); w++ {
		b.word(j, w).Store(k[w])
	}
	b.val(j).Store(v)
}

// load copies the key of slot j into k.
func (b *ctBucket[S, P]) load(j int, k *ctKey) {
	for w := 0; w < ctKeyWords[S](); w++ {
		k[w] = b.word(j, w).Load()
	}
}

// probe is the seqlock read of k in b. first is a header value loaded
// earlier (so that the loads of both candidate buckets overlap), or an odd
// value to load afresh. It returns the slot (-1 for none) and a consistent
// value word and header; ok is false when writers kept the bucket busy.
func (b *ctBucket[S, P]) probe(k *ctKey, tag, first uint64) (j int, v, h uint64, ok bool) {
	h = first
	for range ctReadSpins {
		if h&1 != 0 {
			h = b.hdr.Load()
			continue
		}
		// find, written out: this is the hottest loop of the table.
		j = -1
		for m := ctMatch(h, tag); m != 0; m &= m - 1 {
			if s := ctSlot(m); b.match(s, k) {
				j, v = s, b.val(s).Load()
				break
			}
		}
		if h2 := b.hdr.Load(); h2 != h {
			h = h2
			continue
		}
		return j, v, h, true
	}
	return -1, 0, 0, false
}

// ctTable is an array of buckets with two-choice placement: a key may live in
// either of two buckets picked by its hash. The part of the array in use
// grows with the entries (linear hashing, see ConnTable): buckets
// [0, ctActive(geo)) are in use, the rest have never been written.
type ctTable[S ctSlotWords, P ctPad] struct {
	b []ctBucket[S, P]
	n uint64 // buckets allocated: a power of two, the most the part in use grows to
	// geo is the geometry of the part in use and the count of moves
	// (ctGeo); written only under the growing flag, by a split (holding
	// the bucket it splits) or a move (holding the buckets it changes).
	geo       atomic.Uint64
	stripe0   uint64 // this table's first counter stripe: its stripes are [stripe0, stripe0+ctStripes/2)
	maxProven int64  // the most proven entries SetClass promotes to
	// fixed: the whole array is in use from the start and never grows
	// (ConnTableConfig.Preallocate); its size need not be a power of two,
	// and index reduces the hash to it by a multiply.
	fixed bool
	_     [ctCacheLine - 57]byte
	// proven counts the entries of a proven class (every class but
	// untrusted), changed under the bucket lock of the entry that moved.
	proven atomic.Int64
	// promoteRefused counts the promotions refused at maxProven (rare).
	promoteRefused atomic.Uint64
	// moves counts the entries moved to their other bucket (move).
	moves atomic.Uint64
	// growing is held by the one writer that splits buckets; ranging
	// counts the walks (ConnTable.Range) during which no split may run.
	growing   atomic.Bool
	growAgain atomic.Bool // a writer found the table behind while another grew it
	ranging   atomic.Int32
	_         [ctCacheLine - 36]byte
}

// init makes t a table of nbuckets buckets (at least two) whose part in
// use starts at start buckets (0: ctGrowFrom bytes' worth) and grows with
// its entries (nbuckets a power of two), or, if fixed, is all of them
// from the start; its counters are the stripes from stripe0.
func (t *ctTable[S, P]) init(nbuckets int, fixed bool, start int, maxProven int64, stripe0 uint64) {
	t.b, t.n, t.maxProven, t.stripe0, t.fixed = ctAligned[ctBucket[S, P]](nbuckets), uint64(nbuckets), maxProven, stripe0, fixed
	if fixed {
		// The geometry whose part in use is the whole array: ctActive is n
		// (index does not use it, and grow finds nothing to do).
		lg := uint64(bits.Len(uint(nbuckets)) - 1)
		t.geo.Store(ctGeo(lg, uint64(nbuckets)-1<<lg))
		return
	}
	if start == 0 {
		var b ctBucket[S, P]
		start = 1 << bits.Len(uint(ctGrowFrom/unsafe.Sizeof(b)-1))
	}
	start = min(max(start, 2), nbuckets)
	t.geo.Store(ctGeo(uint64(bits.TrailingZeros(uint(start))), 0))
}

// stripe returns the counter stripe of bucket i.
func (t *ctTable[S, P]) stripe(c *ConnTable, i uint64) *connStripe {
	return &c.stripes[t.stripe0|i&(ctStripes/2-1)]
}

// ctProven reports whether class c is a proven one: every class but
// untrusted.
func ctProven(c StateClass) bool { return c != ClassUntrusted }

// ctProvenDelta is the change in proven entries when slot j of h (free or
// occupied) comes to hold an entry of class to.
func ctProvenDelta(h uint64, j int, to StateClass) int64 {
	var d int64
	if h>>(ctTagShift+4*j)&0xf != 0 && ctProven(ctClass(h, j)) {
		d--
	}
	if ctProven(to) {
		d++
	}
	return d
}

// index maps a key hash to its two candidate buckets under geometry g:
// the buckets (ctAddr) of two key words taken from the hash above the
// bits the slot tag uses (ctTag), the second the first XOR an odd word,
// so that the two differ in their lowest bit, and so do their buckets
// under every geometry. Each candidate is the bucket of a fixed word, so a
// split changes only the candidates that were the bucket it splits (which
// a rule "if both fall together, take the neighbour" would break: the
// split of one bucket would move a key's other candidate).
//
// A fixed table (Preallocate) reduces the high and the low half of the
// hash to [0, n) by a multiply each (Lemire's fast range, so n need not
// be a power of two), the second moved to the next bucket when both fall
// together.
func (t *ctTable[S, P]) index(hash, g uint64) (uint64, uint64) {
	if t.fixed {
		i1, _ := bits.Mul64(hash, t.n)
		i2, _ := bits.Mul64(bits.RotateLeft64(hash, 32), t.n)
		if i2 == i1 {
			if i2++; i2 == t.n {
				i2 = 0
			}
		}
		return i1, i2
	}
	x := hash >> 4
	return ctAddr(x, g), ctAddr(x^(bits.RotateLeft64(hash, 32)>>4|1), g)
}

// ctMoveRetries bounds how often an operation that raced a split (the
// geometry changed under it) starts again with the new geometry before it
// gives up as a reader or writer that found its bucket busy does. A split
// takes a few hundred nanoseconds and the table splits one bucket per few
// inserts, so one retry is the rule and running out means the operation
// was descheduled among many splits.
const ctMoveRetries = 8

// search looks k up in both candidate buckets without locking and returns
// the bucket, slot (-1 for a miss), value word and class; ok is false when
// a bucket stayed busy, so a miss may be a false one.
func (t *ctTable[S, P]) search(k *ctKey, hash, tag uint64) (bi uint64, j int, v uint64, cls StateClass, ok bool) {
	g := t.geo.Load()
	for try := 0; ; try++ {
		i1, i2 := t.index(hash, g)
		b1, b2 := &t.b[i1], &t.b[i2]
		// Load both headers before scanning either, so that both cache
		// misses are in flight together.
		h1, h2 := b1.hdr.Load(), b2.hdr.Load()
		j, v, h, ok1 := b1.probe(k, tag, h1)
		if j >= 0 {
			return i1, j, v, ctClass(h, j), true
		}
		j, v, h, ok2 := b2.probe(k, tag, h2)
		if j >= 0 {
			return i2, j, v, ctClass(h, j), true
		}
		// A miss: if a split moved k since g was read, look again where
		// it went (see ConnTable, Growth); after ctMoveRetries such
		// looks, a miss is a false one as after a busy bucket.
		g2 := t.geo.Load()
		if g2 != g && try < ctMoveRetries {
			g = g2
			continue
		}
		return 0, -1, 0, 0, ok1 && ok2 && g2 == g
	}
}

// lookup implements ConnTable.Lookup for one key width.
func (t *ctTable[S, P]) lookup(k *ctKey, hash uint64, now Tick, c *ConnTable) (uint32, StateClass, bool) {
	g := t.geo.Load()
	i1, i2 := t.index(hash, g)
	b, cls, _, _, ok := t.lookupFrom(k, hash, g, i1, i2, now, c, true)
	return b, cls, ok
}

// prepare finds the two candidate buckets of hash (for a ConnQuery) and
// prefetches them: the first bucket's first two cache lines (its header,
// and the line where three of an IPv4 bucket's five slots, wholly or in
// part, lie: an insert fills the first bucket unless the second holds
// fewer entries, two fewer in a growing table, so most keys are found
// there: 72% at Capacity, 87% in a growing table) and the second bucket's
// header. A prefetch, unlike the loads this did before, does not wait for
// its line, so a batch's misses overlap instead of filling the
// instruction window one query at a time (prefetch.Three, formerly ctPrefetch3). The second
// bucket's second line measured no better.
func (t *ctTable[S, P]) prepare(q *ConnQuery) {
	q.geo = t.geo.Load()
	q.i1, q.i2 = t.index(q.hash, q.geo)
	b1, b2 := &t.b[q.i1], &t.b[q.i2]
	prefetch.Three(unsafe.Pointer(b1), unsafe.Pointer(b1.line(1)), unsafe.Pointer(b2))
}

// line returns the first word of the bucket's cache line l (l < the
// bucket's lines), for loads that only bring the line in.
func (b *ctBucket[S, P]) line(l uintptr) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Add(unsafe.Pointer(b), l*ctCacheLine))
}

// lookupFrom is lookup with the candidate buckets i1, i2 found under
// geometry g; the second bucket's header is read only when the first does
// not hold the key. It also returns the entry's last-seen tick as read
// (before any refresh), and whether it refreshed it.
func (t *ctTable[S, P]) lookupFrom(k *ctKey, hash, g, i1, i2 uint64, now Tick, c *ConnTable, refresh bool) (_ uint32, _ StateClass, _ Tick, refreshed, found bool) {
	tag := ctTag(hash)
	// search, written out.
	var (
		b       *ctBucket[S, P]
		j       int
		v, h    uint64
		ok, ok2 bool
	)
	for try := 0; ; try++ {
		b = &t.b[i1]
		if j, v, h, ok = b.probe(k, tag, b.hdr.Load()); j >= 0 {
			break
		}
		b = &t.b[i2]
		if j, v, h, ok2 = b.probe(k, tag, b.hdr.Load()); j >= 0 {
			break
		}
		// A miss: if a split moved k since g was read, look again where
		// it went. A hit needs no such check: the entry was where it was
		// read, with the value read, at the moment of the read.
		g2 := t.geo.Load()
		if g2 != g && try < ctMoveRetries {
			g = g2
			i1, i2 = t.index(hash, g)
			continue
		}
		if !ok || !ok2 || g2 != g {
			t.stripe(c, i1).contended.Add(1)
		}
		return 0, 0, 0, false, false
	}
	cls := ctClass(h, j)
	seen := ctSeen(v)
	if ctIdle(now, seen, c.timeout[cls]) {
		return 0, 0, 0, false, false
	}
	if refresh && int32(uint32(now-seen)) > int32(c.slack[cls]) {
		// Refresh last-seen, but only once it lags by more than 1/32 of the
		// class's timeout: a flow's value word is written a few dozen times
		// per timeout, not per packet, and an entry expires at most 3%
		// early. A CAS and not a store: if a writer replaced the slot since
		// the read, the value word differs and the refresh is dropped
		// instead of writing this flow's backend over the new entry. If a
		// split or a move carried the entry away since the read, the CAS
		// lands on the slot it left, which is free, and the entry keeps
		// its tick: the header, which every writer that moves an entry
		// changes, says whether one did, and then the refresh is not
		// reported (the flow's next lookup makes it up), so that a caller
		// keeping the tick (LookupPreparedSeen) is never told a newer one
		// than the entry holds.
		refreshed = b.val(j).CompareAndSwap(v, v&^(1<<32-1)|uint64(now)) && b.hdr.Load() == h
	}
	return ctBackend(v), cls, Tick(seen), refreshed, true
}

// insert implements ConnTable.Insert for one key width.
func (t *ctTable[S, P]) insert(k *ctKey, hash uint64, backend uint32, cls StateClass, now Tick, c *ConnTable, claim bool) InsertResult {
	var (
		g, i1, i2 uint64
		blo, bhi  *ctBucket[S, P]
		hlo, hhi  uint64
		grows     int
	)
	for try := 0; ; try++ {
		g = t.geo.Load()
		i1, i2 = t.index(hash, g)
		lo, hi := min(i1, i2), max(i1, i2)
		// Claim both candidate buckets in ascending order: every insert of k
		// holds both, so two inserts of the same key cannot both miss it and
		// place two copies.
		blo, bhi = &t.b[lo], &t.b[hi]
		var ok bool
		if hlo, ok = blo.tryLock(); !ok {
			t.stripe(c, i1).busy.Add(1)
			return InsertBusy
		}
		if hhi, ok = bhi.tryLock(); !ok {
			blo.unlockUnchanged(hlo)
			t.stripe(c, i1).busy.Add(1)
			return InsertBusy
		}
		// With both held, no split can move k's candidates: a split holds
		// the bucket it splits. If one did since g was read, k's
		// candidates may have moved: start again.
		if t.geo.Load()&ctShapeBits == g&ctShapeBits { // (a move elsewhere changes no candidate of k)
			// Both buckets full while the table is still growing: grow
			// first, and look again, rather than evict or refuse in a
			// table that has room it does not use yet. The count of
			// entries may not ask for more buckets (linear hashing
			// splits in order, and the buckets a round has not split
			// yet hold twice as many): split ctGrowSteps more each
			// time, up to ctGrowFull times.
			if grows >= ctGrowFull || ctOcc(hlo) != ctLanes || ctOcc(hhi) != ctLanes || ctActive(g) >= t.n {
				break
			}
			grows++
			blo.unlockUnchanged(hlo)
			bhi.unlockUnchanged(hhi)
			t.growBy(c, ctGrowSteps)
			// Another writer was growing the table: give it a moment
			// to finish (a few dozen yields at most) rather than
			// evict or refuse beside a table about to have room.
			for i := 0; i < ctGrowWaits && t.growing.Load(); i++ {
				runtime.Gosched()
			}
			continue
		}
		blo.unlockUnchanged(hlo)
		bhi.unlockUnchanged(hhi)
		if try >= ctMoveRetries {
			t.stripe(c, i1).busy.Add(1)
			return InsertBusy
		}
	}
	st := t.stripe(c, i1)
	b := [2]*ctBucket[S, P]{blo, bhi}
	h := [2]uint64{hlo, hhi}
	if i1 > i2 {
		b[0], b[1] = bhi, blo
		h[0], h[1] = hhi, hlo
	}
	v := ctVal(backend, now)
	tag := ctTag(hash)

	res, x, j := t.place(k, tag, &b, &h, [2]uint64{i1, i2}, now, c, st)
	if claim && res == InsertUpdated {
		b[0].unlockUnchanged(h[0])
		b[1].unlockUnchanged(h[1])
		return InsertTaken
	}
	if res != InsertRefused {
		if d := ctProvenDelta(h[x], j, cls); d != 0 {
			t.proven.Add(d)
		}
	}
	var inserts uint64
	switch res {
	case InsertUpdated:
		b[x].val(j).Store(v)
		h[x] = ctSetClass(h[x], j, cls)
		st.updates.Add(1)
	case InsertNew, InsertEvicted:
		b[x].store(j, k, v)
		h[x] = ctSet(h[x], j, tag, cls)
		inserts = st.inserts.Add(1)
	case InsertRefused:
		st.refused.Add(1)
	}
	full := res != InsertUpdated && ctOcc(h[0]) == ctLanes && ctOcc(h[1]) == ctLanes
	for y := range 2 {
		if res != InsertRefused && y == x {
			b[y].unlock(h[y])
		} else {
			b[y].unlockUnchanged(h[y])
		}
	}
	// Grow when the table may have outgrown its part in use: every 16th
	// insert of a stripe (a look at the count costs a few dozen loads), and
	// at once when an insert found both its buckets full.
	if inserts&(ctGrowEvery-1) == ctGrowEvery-1 || full {
		t.grow(c)
	}
	return res
}

// place chooses where k goes, with both buckets held: its own slot if
// present, else a free slot in the first bucket unless the second holds
// fewer entries (a growing table: at least two fewer, see ctSlack), else
// the entry idle longest past its timeout, else the least recently seen
// untrusted entry, else a slot it frees by moving an entry to that
// entry's other bucket (move; bi are the buckets' indices). It counts
// reclaimed and evicted entries; the caller counts the outcome.
func (t *ctTable[S, P]) place(k *ctKey, tag uint64, b *[2]*ctBucket[S, P], h *[2]uint64, bi [2]uint64, now Tick, c *ConnTable, st *connStripe) (res InsertResult, x, j int) {
	for x := range 2 {
		if j := b[x].find(h[x], k, tag); j >= 0 {
			if ctIdle(now, ctSeen(b[x].val(j).Load()), c.timeout[ctClass(h[x], j)]) {
				// The old flow timed out: this is a new one reusing its key.
				st.expired.Add(1)
				return InsertNew, x, j
			}
			return InsertUpdated, x, j
		}
	}
	o0, o1 := ctOcc(h[0]), ctOcc(h[1])
	if o0 != ctLanes || o1 != ctLanes {
		l0, l1 := bits.OnesCount64(o0), bits.OnesCount64(o1)
		if !t.fixed {
			l1 += ctSlack
		}
		if o0 == ctLanes || o1 != ctLanes && l1 < l0 {
			return InsertNew, 1, ctSlot(^o1 & ctLanes)
		}
		return InsertNew, 0, ctSlot(^o0 & ctLanes)
	}
	// Both full: the better victim of the two (an expired entry beats any
	// live one, and among equals the longest idle loses its slot; the
	// first bucket's on a tie).
	x, v := 0, b[0].victim(h[0], now, c)
	if v1 := b[1].victim(h[1], now, c); v1.beats(v) {
		x, v = 1, v1
	}
	if v.j < 0 {
		y, j, evicted, ok := t.move(b, h, bi, now, c)
		switch {
		case !ok:
			return InsertRefused, 0, -1
		case evicted:
			return InsertEvicted, y, j
		}
		return InsertNew, y, j
	}
	st.took(v)
	return InsertEvicted, x, v.j
}

// setClass implements ConnTable.SetClass for one key width.
func (t *ctTable[S, P]) setClass(k *ctKey, hash uint64, cls StateClass, now Tick, c *ConnTable) bool {
	tag := ctTag(hash)
	var (
		b  *ctBucket[S, P]
		hd uint64
		j  int
	)
	for try := 0; ; try++ {
		g := t.geo.Load()
		bi, j0, _, _, _ := t.search(k, hash, tag)
		if j0 < 0 {
			return false
		}
		b = &t.b[bi]
		var ok bool
		if hd, ok = b.tryLock(); !ok {
			t.stripe(c, bi).busy.Add(1)
			return false
		}
		if j = b.find(hd, k, tag); j >= 0 {
			break
		}
		// Gone since the search: removed, or moved by a split.
		b.unlockUnchanged(hd)
		if t.geo.Load() == g || try == ctMoveRetries {
			return false
		}
	}
	if ctIdle(now, ctSeen(b.val(j).Load()), c.timeout[ctClass(hd, j)]) {
		b.unlockUnchanged(hd)
		return false
	}
	d := ctProvenDelta(hd, j, cls)
	if d > 0 && t.proven.Load() >= t.maxProven {
		// A promotion past the proven limit: the flow stays untrusted
		// (evictable), so that new flows always find room.
		b.unlockUnchanged(hd)
		t.promoteRefused.Add(1)
		return false
	}
	if d != 0 {
		t.proven.Add(d)
	}
	v := b.val(j)
	if old := v.Load(); int32(uint32(now-ctSeen(old))) > 0 {
		v.Store(ctVal(ctBackend(old), now))
	}
	b.unlock(ctSetClass(hd, j, cls))
	return true
}

// remove implements ConnTable.Delete for one key width.
func (t *ctTable[S, P]) remove(k *ctKey, hash uint64, c *ConnTable) bool {
	tag := ctTag(hash)
	for {
		bi, j, _, _, ok := t.search(k, hash, tag)
		if j < 0 {
			if ok {
				return false
			}
			runtime.Gosched()
			continue
		}
		b := &t.b[bi]
		hd := b.lockWait()
		if j := b.find(hd, k, tag); j >= 0 {
			if ctProven(ctClass(hd, j)) {
				t.proven.Add(-1)
			}
			b.unlock(ctClear(hd, j))
			t.stripe(c, bi).deletes.Add(1)
			return true
		}
		// Deleted, replaced or moved since the search; look again.
		b.unlockUnchanged(hd)
	}
}

// ctEntry is one slot copied out by snapshot.
type ctEntry struct {
	k   ctKey
	v   uint64
	cls StateClass
}

// snapshot copies the occupied slots of bucket i into out under the
// seqlock and returns how many it copied.
func (t *ctTable[S, P]) snapshot(i uint64, out *[ctSlots]ctEntry) int {
	b := &t.b[i]
	for {
		for range ctReadSpins {
			h := b.hdr.Load()
			if h&1 != 0 {
				continue
			}
			n := 0
			for occ := ctOcc(h); occ != 0; occ &= occ - 1 {
				j := ctSlot(occ)
				b.load(j, &out[n].k)
				out[n].v = b.val(j).Load()
				out[n].cls = ctClass(h, j)
				n++
			}
			if b.hdr.Load() == h {
				return n
			}
		}
		runtime.Gosched()
	}
}

// ctAligned allocates n zeroed values of T (which must hold no pointers)
// starting on a cache-line boundary, so that no bucket straddles more lines
// than its size needs and no two stripes of counters share one; a large
// table is given huge pages where the system does so on request
// (ctHugePages).
func ctAligned[T any](n int) []T {
	var zero T
	size := unsafe.Sizeof(zero)
	words := (uintptr(n)*size + ctCacheLine + 7) / 8
	raw := make([]uint64, words)
	p := unsafe.Pointer(unsafe.SliceData(raw))
	ctHugePages(p, words*8)
	off := (ctCacheLine - uintptr(p)%ctCacheLine) % ctCacheLine
	return unsafe.Slice((*T)(unsafe.Add(p, off)), n)
}

// ctBytes returns the bytes s's elements occupy.
func ctBytes[T any](s []T) int {
	var zero T
	return int(unsafe.Sizeof(zero)) * len(s)
}
