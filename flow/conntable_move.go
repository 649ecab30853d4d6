package flow

// This file holds what an insert whose two buckets are full may take: a
// victim (an expired entry, else the least recently seen untrusted one),
// and, when both buckets hold only live proven entries, a slot freed by
// moving one of them to its other bucket (a cuckoo move), so that the
// new key is not refused while the table has room one hop away.

// ctVictim is the slot an insert may take in a full bucket: j < 0 for
// none.
type ctVictim struct {
	j       int
	age     uint32 // ticks since the entry was last seen
	expired bool   // idle past its class's timeout
}

// victim returns the slot of full bucket b (header h) an insert may take:
// an entry idle past its class's timeout (the longest idle first), else
// the least recently seen untrusted entry; none when every entry is live
// and proven.
func (b *ctBucket[S, P]) victim(h uint64, now Tick, c *ConnTable) ctVictim {
	v := ctVictim{j: -1}
	for s := range ctSlots {
		cl := ctClass(h, s)
		age := uint32(now - ctSeen(b.val(s).Load()))
		if int32(age) < 0 {
			age = 0
		}
		w := ctVictim{s, age, age > c.timeout[cl]}
		if (w.expired || cl == ClassUntrusted) && w.beats(v) {
			v = w
		}
	}
	return v
}

// beats reports whether v is a better victim than o: v is one, and o is
// none, or v is expired and o is not, or both are alike and v has been
// idle longer.
func (v ctVictim) beats(o ctVictim) bool {
	return v.j >= 0 && (o.j < 0 || v.expired && !o.expired || v.expired == o.expired && v.age > o.age)
}

// took counts victim v taken by an insert: an expired entry reclaimed, or
// a live one evicted.
func (st *connStripe) took(v ctVictim) {
	if v.expired {
		st.expired.Add(1)
	} else {
		st.evictions.Add(1)
	}
}

// move frees a slot in one of an insert's full buckets b (indices bi,
// headers h, all held) by moving one of its entries to that entry's other
// bucket: into a free slot there, else over that bucket's victim (an
// expired or untrusted entry, which an insert there could have taken as
// well: evicted reports it, and the eviction is counted), if no other
// writer holds the bucket. It reports the bucket and slot freed; h holds
// the freed slot's bucket's header with the slot cleared, which the
// caller fills and unlocks. It looks at every entry of both buckets; each
// costs a hash of the entry's key and a look at its other bucket (a cache
// miss in a large table), paid only by an insert that would otherwise be
// refused.
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
// a move's look only where both buckets hold live proven flows alone,
// which the proven entries' cap keeps rare (about one new key in 30,000
// at the cap; see ConnTableConfig.ProvenShare).
func (t *ctTable[S, P]) move(b *[2]*ctBucket[S, P], h *[2]uint64, bi [2]uint64, now Tick, c *ConnTable) (y, j int, evicted, ok bool) {
	if !t.growing.CompareAndSwap(false, true) {
		return 0, 0, false, false
	}
	defer t.growing.Store(false)
	if t.ranging.Load() != 0 { // a walk holds placement still (holdGrowth)
		return 0, 0, false, false
	}
	g := t.geo.Load()
	v6 := ctKeyWords[S]() == 5
	var k ctKey
	for y = range 2 {
		for occ := ctOcc(h[y]); occ != 0; occ &= occ - 1 {
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
				continue // the other full bucket, held
			}
			d := &t.b[alt]
			hd, locked := d.tryLock()
			if !locked {
				continue
			}
			f := -1
			if occ := ctOcc(hd); occ != ctLanes {
				f = ctSlot(^occ & ctLanes)
			} else if v := d.victim(hd, now, c); v.j >= 0 {
				f, evicted = v.j, true
				if ctProven(ctClass(hd, f)) { // an expired proven entry
					t.proven.Add(-1)
				}
				t.stripe(c, alt).took(v)
			}
			if f < 0 {
				d.unlockUnchanged(hd)
				continue
			}
			d.store(f, &k, b[y].val(j).Load())
			hd = ctSet(hd, f, h[y]>>(ctTagShift+4*j)&0xf, ctClass(h[y], j))
			h[y] = ctClear(h[y], j)
			t.geo.Store(g + ctMoved)
			d.unlock(hd)
			t.moves.Add(1)
			return y, j, evicted, true
		}
	}
	return 0, 0, false, false
}
