package flow

import "runtime"

// This file holds how a ConnTable's part in use grows with its entries
// (see ConnTable, Growth): the geometry word, the look at the count that
// decides to grow, and the split of one bucket.

// ctGrowFrom is the bytes of buckets a growing table starts with in use:
// 32 KiB, 256 IPv4 buckets (a thousand flows at the table's load).
const ctGrowFrom = 32 << 10

// The geometry of the part in use, one word: bits 0..7 hold lg, bits
// 8..47 the split pointer s, with m = 1<<lg and s < m. Buckets [0, m+s)
// are in use; bucket a < s has been split into a and a+m. A key word x
// maps to x mod m, or to x mod 2m if x mod m < s (ctAddr): splitting
// bucket s moves just the keys of s whose bit lg is set, to s+m. Bits
// 48..63 count the entries moved to their other bucket (ctTable.move),
// modulo 1<<16: a reader that misses looks at the whole word again, so
// that it also looks again after a move (see ConnTable, Growth).
func ctGeo(lg, s uint64) uint64 { return s<<8 | lg }

// ctShapeBits masks a geometry word's shape (lg and s), without the
// count of moves.
const ctShapeBits = 1<<48 - 1

// ctMoved is one move in a geometry word's count of moves.
const ctMoved = 1 << 48

// ctActive returns the buckets in use under geometry g.
func ctActive(g uint64) uint64 { return 1<<(g&0xff) + g&ctShapeBits>>8 }

// ctAddr returns the bucket of key word x under geometry g.
func ctAddr(x, g uint64) uint64 {
	m := uint64(1) << (g & 0xff)
	a := x & (m - 1)
	if a < g&ctShapeBits>>8 {
		a = x & (2*m - 1)
	}
	return a
}

// ctSplitGeo returns the geometry after bucket g's split pointer splits
// (the count of moves kept).
func ctSplitGeo(g uint64) uint64 {
	lg, s := g&0xff, g&ctShapeBits>>8
	if s+1 == 1<<lg {
		return g&^ctShapeBits | ctGeo(lg+1, 0)
	}
	return g&^ctShapeBits | ctGeo(lg, s+1)
}

// entries returns the entries the table holds, idle ones included, from
// its stripes: a close estimate under concurrent writes.
func (t *ctTable[S, P]) entries(c *ConnTable) int64 {
	var n uint64
	for i := range uint64(ctStripes / 2) {
		s := &c.stripes[t.stripe0|i]
		n += s.inserts.Load() - s.deletes.Load() - s.expired.Load() - s.evictions.Load()
	}
	return max(int64(n), 0)
}

// holdGrowth keeps splits off until releaseGrowth: it waits for a grow
// in progress (at most ctGrowSteps splits) to end. Walks may nest, and a
// walk's callback may insert: its grow just finds growth held off. (The
// walk counts itself before it looks at growing, and grow takes growing
// before it looks at the count, so one of them sees the other.)
func (t *ctTable[S, P]) holdGrowth() {
	t.ranging.Add(1)
	for t.growing.Load() {
		runtime.Gosched()
	}
}

// releaseGrowth ends a holdGrowth.
func (t *ctTable[S, P]) releaseGrowth() { t.ranging.Add(-1) }

// ctGrowEvery is how many inserts of a stripe pass between two looks at
// whether the table must grow (a power of two).
const ctGrowEvery = 16

// ctGrowSteps bounds the buckets one grow splits: it runs on the data
// path, in the insert that found the table behind its entries.
const ctGrowSteps = 32

// grow splits buckets until the part in use has ctGrowSlots2/2 slots per
// entry, at most ctGrowSteps of them, unless the table is fully grown or
// a walk holds growth off. If another writer is growing the table, it
// leaves a request (growAgain) instead: the grower, when it is done,
// looks at the count again and goes on, up to ctGrowRounds times
// ctGrowSteps splits, so that writers that find the table behind while
// one of them grows it are not ignored (with three writers inserting at
// once and each such look dropped, the table fell to 2.3 entries per
// bucket in use instead of 1, and refused flows).
func (t *ctTable[S, P]) grow(c *ConnTable) { t.growBy(c, 0) }

// growBy is grow that also splits at least extra buckets beyond the part
// in use it finds, whatever the count of entries asks for: for an insert
// that found both its buckets full (linear hashing splits buckets in
// order, so the ones the count asks for may not be the full ones).
func (t *ctTable[S, P]) growBy(c *ConnTable, extra uint64) {
	if ctActive(t.geo.Load()) >= t.n {
		return
	}
	if !t.growing.CompareAndSwap(false, true) {
		t.growAgain.Store(true)
		return
	}
	for range ctGrowRounds {
		t.growAgain.Store(false)
		if t.ranging.Load() != 0 { // a walk holds growth off (holdGrowth)
			break
		}
		want := max((uint64(t.entries(c))*ctGrowSlots2+2*ctSlots-1)/(2*ctSlots), ctActive(t.geo.Load())+extra)
		extra = 0
		for range ctGrowSteps {
			g := t.geo.Load()
			if a := ctActive(g); a >= want || a >= t.n || !t.split(g, c) {
				break
			}
		}
		if !t.growAgain.Load() {
			break
		}
	}
	t.growing.Store(false)
}

// ctGrowWaits bounds how often an insert that found both its buckets
// full yields while another writer grows the table (see insert).
const ctGrowWaits = 64

// ctGrowFull bounds how many times an insert that finds both its buckets
// full splits ctGrowSteps more buckets and looks again before it evicts
// or refuses (see insert).
const ctGrowFull = 8

// ctGrowRounds bounds the rounds of ctGrowSteps splits one grow makes
// when other writers asked for more while it ran (growAgain).
const ctGrowRounds = 4

// ctGrowSlots2 is twice the slots per entry a growing table keeps in use:
// 5. Linear hashing loads the buckets not yet split in a round twice as
// much as the split ones, so the buckets a round splits last hold up to
// twice the mean: 2 entries of 5 slots at 5 slots per entry, less than a
// full table's 2.86 at Capacity. At 3.5 slots per entry (as full as a
// full table at Capacity) the fullest buckets left room for the slack
// of ctSlack only at the price of refusals: filling 1M flows, 3 refused
// by 80% of Capacity and 10 by 100%, against 0 and 3 at 5 slots.
const ctGrowSlots2 = 10

// ctSlack is added to the count of a growing table's second bucket when
// an insert compares its two buckets: with 1, the second takes a new key
// only when it holds two entries fewer than the first. A lookup reads the
// first bucket first, with two of its lines prefetched, so every key in
// its second bucket costs a miss more.
// Filling a table to 1M flows, 87% of the keys end in their first bucket,
// against 65% when it takes any bucket with fewer (growth keeps the table
// at a load where the two differ often) and 72% in a preallocated table,
// with as few refused at Capacity as the latter (3 of 1M).
const ctSlack = 1

// split splits bucket s of geometry g (the table's current one; the
// caller holds growing) into s and s+m, moving the entries whose
// candidate was s and is s+m under the next geometry, and publishes the
// next geometry. It holds both buckets throughout and publishes before it
// lets them go, so that a reader that finds a key gone from s sees the new
// geometry when it looks again (ctTable.search), and a writer holding a
// bucket knows the geometry cannot move its keys (ctTable.insert). It
// reports false, changing nothing, if a writer held s.
func (t *ctTable[S, P]) split(g uint64, c *ConnTable) bool {
	m, s := uint64(1)<<(g&0xff), g&ctShapeBits>>8
	next := ctSplitGeo(g)
	src, dst := &t.b[s], &t.b[s+m]
	hs, ok := src.tryLock()
	if !ok {
		return false
	}
	// dst has never been in use: no reader or writer can reach it before
	// next is published, so it is free and its lock uncontended.
	hd, ok := dst.tryLock()
	if !ok {
		src.unlockUnchanged(hs)
		return false
	}
	moved := false
	var k ctKey
	for occ := ctOcc(hs); occ != 0; occ &= occ - 1 {
		j := ctSlot(occ)
		src.load(j, &k)
		i1, i2 := t.index(c.hashPacked(&k, ctKeyWords[S]() == 5), next)
		if i1 == s || i2 == s || i1 != s+m && i2 != s+m {
			continue // stays; (neither: placed by a hash this table does not compute)
		}
		f := ctSlot(^ctOcc(hd) & ctLanes) // at most five entries move into a free bucket
		dst.store(f, &k, src.val(j).Load())
		hd = ctSet(hd, f, hs>>(ctTagShift+4*j)&0xf, ctClass(hs, j))
		hs = ctClear(hs, j)
		moved = true
	}
	t.geo.Store(next)
	dst.unlock(hd)
	if moved {
		src.unlock(hs)
	} else {
		src.unlockUnchanged(hs)
	}
	return true
}
