package flow

// This file holds the last resort of an insert whose two buckets are full
// of live proven entries: moving one of those entries to its other bucket
// (a cuckoo move), so that the new key takes its slot instead of being
// refused.

// ctMoveTries bounds the entries an insert looks at for a move: each
// costs a hash of the entry's key and a look at its other bucket (a
// cache miss in a large table).
const ctMoveTries = 4

// move frees a slot in one of an insert's full buckets b (indices bi,
// headers h, all held) by moving one of its entries to that entry's other
// bucket, if that bucket has a free slot and no other writer holds it. It
// reports the bucket and slot freed; h holds the freed slot's bucket's
// header with the slot cleared, which the caller fills and unlocks.
//
// A move takes the growing flag, as a split does: it cannot run during a
// split (whose geometry it computes the other bucket by) or a walk (which
// would report the entry twice or not at all), and it gives up at once
// when another writer holds the flag. A lookup may read the entry's new
// bucket before the move and its old one after: the move adds ctMoved to
// the geometry word before it lets either bucket go, so that the lookup's
// miss finds the word changed and looks again, as after a split.
//
// Only a would-be refusal moves: an insert that may evict an untrusted
// entry evicts it instead. So a flood's inserts into a full table pay for
// a move's look (up to ctMoveTries hashes and other buckets) only where
// both buckets hold live proven flows alone, which the proven entries'
// cap keeps rare (see ConnTable, Eviction; ConnTableConfig.ProvenShare).
func (t *ctTable[S, P]) move(b *[2]*ctBucket[S, P], h *[2]uint64, bi [2]uint64, c *ConnTable) (y, j int, ok bool) {
	if !t.growing.CompareAndSwap(false, true) {
		return 0, 0, false
	}
	defer t.growing.Store(false)
	if t.ranging.Load() != 0 { // a walk holds placement still (holdGrowth)
		return 0, 0, false
	}
	g := t.geo.Load()
	v6 := ctKeyWords[S]() == 5
	var k ctKey
	tries := 0
	for y = range 2 {
		for occ := ctOcc(h[y]); occ != 0 && tries < ctMoveTries; occ &= occ - 1 {
			tries++
			j = ctSlot(occ)
			b[y].load(j, &k)
			a1, a2 := t.index(c.hashPacked(&k, v6), g)
			alt := a1
			switch bi[y] {
			case a1:
				alt = a2
			case a2:
			default:
				continue // placed by a hash this table does not compute
			}
			if alt == bi[1-y] {
				continue // the other full bucket
			}
			d := &t.b[alt]
			hd, locked := d.tryLock()
			if !locked {
				continue
			}
			if ctOcc(hd) == ctLanes {
				d.unlockUnchanged(hd)
				continue
			}
			f := ctSlot(^ctOcc(hd) & ctLanes)
			d.store(f, &k, b[y].val(j).Load())
			hd = ctSet(hd, f, h[y]>>(ctTagShift+4*j)&0xf, ctClass(h[y], j))
			h[y] = ctClear(h[y], j)
			t.geo.Store(g + ctMoved)
			d.unlock(hd)
			t.moves.Add(1)
			return y, j, true
		}
	}
	return 0, 0, false
}
