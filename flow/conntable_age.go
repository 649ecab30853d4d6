package flow

import "sync/atomic"

// This file holds the ager's side of a ConnTable's buckets (ConnTable.Age):
// a sweep from a cursor, and the removal of a bucket's idle entries.

// age removes idle entries from bucket i and returns how many it removed.
// A bucket some writer holds is skipped; the next sweep gets it.
func (t *ctTable[S, P]) age(i uint64, now Tick, c *ConnTable) int {
	b := &t.b[i]
	h := b.hdr.Load()
	if h&1 != 0 || !t.anyIdle(b, h, now, c) {
		return 0
	}
	hd, ok := b.tryLock()
	if !ok {
		return 0
	}
	n, proven := 0, int64(0)
	for occ := ctOcc(hd); occ != 0; occ &= occ - 1 {
		j := ctSlot(occ)
		if cls := ctClass(hd, j); ctIdle(now, ctSeen(b.val(j).Load()), c.timeout[cls]) {
			if ctProven(cls) {
				proven++
			}
			hd = ctClear(hd, j)
			n++
		}
	}
	if n == 0 {
		b.unlockUnchanged(hd)
		return 0
	}
	if proven != 0 {
		t.proven.Add(-proven)
	}
	b.unlock(hd)
	t.stripe(c, i).expired.Add(uint64(n))
	return n
}

// sweep ages nb of the n buckets in use from the cursor cur and returns
// how many entries it removed. The cursor is a bucket position, kept in
// [0, n) and advanced by CAS, so that as the table grows (n with it) a
// sweep goes on from where the last one stopped instead of jumping.
func (t *ctTable[S, P]) sweep(cur *atomic.Uint64, n, nb uint64, now Tick, c *ConnTable) (expired int) {
	if nb == 0 {
		return 0
	}
	var i uint64
	for {
		x := cur.Load()
		if i = x; i >= n {
			i = 0
		}
		if cur.CompareAndSwap(x, (i+nb)%n) {
			break
		}
	}
	for range nb {
		expired += t.age(i, now, c)
		if i++; i == n {
			i = 0
		}
	}
	return expired
}

// anyIdle is the ager's optimistic check, without the lock.
func (t *ctTable[S, P]) anyIdle(b *ctBucket[S, P], h uint64, now Tick, c *ConnTable) bool {
	for occ := ctOcc(h); occ != 0; occ &= occ - 1 {
		j := ctSlot(occ)
		if ctIdle(now, ctSeen(b.val(j).Load()), c.timeout[ctClass(h, j)]) {
			return true
		}
	}
	return false
}
