package nexthop

import (
	"crypto/rand"
	"encoding/binary"
	"math/bits"
	"net/netip"
	"slices"
)

// This file holds the two immutable structures a Snapshot answers from:
// destTable, the per-destination entries, and lpmTable, the prefix
// entries. Both are read by Lookup without locks or allocation; Run
// changes them only by building new versions.

// words returns the 16-byte form of an address (IPv4 mapped into IPv6) as
// two big-endian words.
func words(k *[16]byte) (a0, a1 uint64) {
	return binary.BigEndian.Uint64(k[:8]), binary.BigEndian.Uint64(k[8:])
}

// is4 reports whether a 16-byte address (as words) is an IPv4-mapped one.
func is4(a0, a1 uint64) bool { return a0 == 0 && a1>>32 == 0xffff }

// --- per-destination entries -------------------------------------------

// destTable maps destinations to entries. It is a persistent hash trie of
// fixed depth: the top 8 bits of a keyed hash pick a directory, the next 8
// a leaf in it, and a leaf is a small open-addressed array (linear
// probing from the hash's low bits, at most half full) of the
// destinations that fall there: 65536 leaves, holding one destination
// each up to tens of thousands, about 16 at a million. Changing one
// destination rebuilds its leaf and copies its directory (6 KiB) and the
// top array (2 KiB): publishing costs O(destinations changed), not
// O(destinations cached), and every published version stays valid for the
// readers that hold it.
//
// The hash is keyed with random secrets (a folded 64×64→128-bit multiply,
// as in wyhash), so that addresses chosen by an attacker, such as spoofed
// clients, cannot all land in one leaf.
type destTable struct {
	gen    uint64 // the destBuilder generation that may still modify it
	n      int
	k0, k1 uint64
	dirs   [destFan]*destDir
}

const (
	destFanBits = 8
	destFan     = 1 << destFanBits
)

// destDir is a directory of leaves. A leaf is a slice held in the
// directory itself, which saves a dependent load per lookup; owned marks
// the leaves whose arrays belong to the directory's generation (they may
// be changed in place).
type destDir struct {
	gen    uint64
	n      int
	owned  [destFan / 64]uint64
	leaves [destFan][]destSlot
}

type destSlot struct {
	a0, a1 uint64
	e      *entry
}

// mum is the folded multiply: the high and low halves of a·b, xored.
func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

func (t *destTable) hash(a0, a1 uint64) uint64 { return mum(a0^t.k0, a1^t.k1) }

// get returns the entry of a destination, or nil.
func (t *destTable) get(a0, a1 uint64) *entry {
	if t.n == 0 {
		return nil
	}
	h := t.hash(a0, a1)
	d := t.dirs[h>>(64-destFanBits)]
	if d == nil {
		return nil
	}
	l := d.leaves[uint8(h>>(64-2*destFanBits))]
	if len(l) == 0 {
		return nil
	}
	m := uint64(len(l) - 1)
	for i := h & m; ; i = (i + 1) & m {
		s := &l[i]
		if s.e == nil {
			return nil
		}
		if s.a0 == a0 && s.a1 == a1 {
			return s.e
		}
	}
}

// all calls f for every destination (in no particular order).
func (t *destTable) all(f func(k [16]byte, e *entry)) {
	for _, d := range t.dirs {
		if d == nil {
			continue
		}
		for _, l := range d.leaves {
			for _, s := range l {
				if s.e == nil {
					continue
				}
				var k [16]byte
				binary.BigEndian.PutUint64(k[:8], s.a0)
				binary.BigEndian.PutUint64(k[8:], s.a1)
				f(k, s.e)
			}
		}
	}
}

// destBuilder makes new versions of a destTable. Nodes of the current
// generation were made since the last publish and are changed in place;
// older ones are shared with published tables and are copied first.
type destBuilder struct {
	t   *destTable
	gen uint64
}

func newDestBuilder() destBuilder {
	var seed [16]byte
	_, _ = rand.Read(seed[:])
	t := &destTable{gen: 1}
	t.k0, t.k1 = binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:])
	return destBuilder{t: t, gen: 1}
}

// publish returns the table as it is now; later changes do not touch it.
func (b *destBuilder) publish() *destTable {
	b.gen++
	return b.t
}

// dir returns, for a change, the table and directory (made or copied for
// this generation) of hash h, and the leaf's index.
func (b *destBuilder) dir(h uint64) (*destTable, *destDir, uint8) {
	t := b.t
	if t.gen != b.gen {
		c := *t
		c.gen = b.gen
		t = &c
		b.t = t
	}
	di, li := h>>(64-destFanBits), uint8(h>>(64-2*destFanBits))
	d := t.dirs[di]
	switch {
	case d == nil:
		d = &destDir{gen: b.gen}
		t.dirs[di] = d
	case d.gen != b.gen:
		c := *d
		c.gen, c.owned = b.gen, [destFan / 64]uint64{}
		d = &c
		t.dirs[di] = d
	}
	return t, d, li
}

// put sets the entry of a destination.
func (b *destBuilder) put(k [16]byte, e *entry) {
	a0, a1 := words(&k)
	h := b.t.hash(a0, a1)
	t, d, li := b.dir(h)
	l := d.leaves[li]
	owned := d.owned[li>>6]&(1<<(li&63)) != 0
	if len(l) > 0 {
		m := uint64(len(l) - 1)
		for i := h & m; l[i].e != nil; i = (i + 1) & m {
			if s := &l[i]; s.a0 == a0 && s.a1 == a1 {
				if !owned {
					l = slices.Clone(l)
					d.leaves[li], d.owned[li>>6] = l, d.owned[li>>6]|1<<(li&63)
				}
				l[i].e = e
				return
			}
		}
	}
	d.n++
	t.n++
	n := 1
	for i := range l {
		if l[i].e != nil {
			n++
		}
	}
	if !owned || 2*n > len(l) {
		l = t.rehash(l, max(2*len(l), 2), n)
		d.leaves[li], d.owned[li>>6] = l, d.owned[li>>6]|1<<(li&63)
	}
	t.insert(l, h, destSlot{a0, a1, e})
}

// rehash returns a new leaf array for n entries holding those of l.
func (t *destTable) rehash(l []destSlot, size, n int) []destSlot {
	for size < 2*n {
		size *= 2
	}
	nl := make([]destSlot, size)
	for _, s := range l {
		if s.e != nil {
			t.insert(nl, t.hash(s.a0, s.a1), s)
		}
	}
	return nl
}

// insert places s (of hash h, not present) in a leaf array with room.
func (t *destTable) insert(l []destSlot, h uint64, s destSlot) {
	m := uint64(len(l) - 1)
	i := h & m
	for l[i].e != nil {
		i = (i + 1) & m
	}
	l[i] = s
}

// del removes a destination; it does nothing if there is none.
func (b *destBuilder) del(k [16]byte) {
	a0, a1 := words(&k)
	if b.t.get(a0, a1) == nil {
		return
	}
	h := b.t.hash(a0, a1)
	t, d, li := b.dir(h)
	d.n--
	t.n--
	if d.n == 0 {
		t.dirs[h>>(64-destFanBits)] = nil
		return
	}
	// Rebuild the leaf without it (linear probing has no simple delete).
	l := d.leaves[li]
	n := 0
	for i := range l {
		if s := &l[i]; s.e != nil && (s.a0 != a0 || s.a1 != a1) {
			n++
		}
	}
	var nl []destSlot
	if n > 0 {
		nl = make([]destSlot, 2)
		for len(nl) < 2*n {
			nl = make([]destSlot, 2*len(nl))
		}
		for _, s := range l {
			if s.e != nil && (s.a0 != a0 || s.a1 != a1) {
				t.insert(nl, t.hash(s.a0, s.a1), s)
			}
		}
	}
	d.leaves[li], d.owned[li>>6] = nl, d.owned[li>>6]|1<<(li&63)
}

// --- prefix entries ----------------------------------------------------

// lpmTable answers longest-prefix-match queries over the cached prefixes
// of one address family. It is a multibit trie with 8-bit strides: a node
// has 256 slots, one per value of the address byte at its depth; a prefix
// of length L lives in the node at depth (L-1)/8, expanded over the
// 2^(8·depth+8−L) slots it covers, and deeper nodes hang from kids. A
// lookup walks the address's bytes and remembers the last entry seen, so
// it costs one step per byte of the longest prefix on the path (at most 4
// for IPv4) however many prefixes and lengths are cached. Tables are
// rebuilt whole when the prefix entries change; there are few of them
// (tens to hundreds) next to the destinations they answer for.
type lpmTable struct {
	def  *entry // the zero-length prefix, if cached
	root *lpmNode
}

type lpmNode struct {
	ents [256]*entry
	kids [256]*lpmNode
}

// lookup4 returns the entry of the longest cached prefix holding a.
func (t *lpmTable) lookup4(a uint32) *entry {
	best := t.def
	n := t.root
	for shift := 24; n != nil; shift -= 8 {
		b := uint8(a >> shift)
		if e := n.ents[b]; e != nil {
			best = e
		}
		n = n.kids[b]
	}
	return best
}

// lookup6 returns the entry of the longest cached prefix holding the IPv6
// address a0:a1.
func (t *lpmTable) lookup6(a0, a1 uint64) *entry {
	best := t.def
	n := t.root
	w := a0
	for i := 0; n != nil; i++ {
		if i == 8 {
			w = a1
		}
		b := uint8(w >> (56 - 8*(i&7)))
		if e := n.ents[b]; e != nil {
			best = e
		}
		n = n.kids[b]
	}
	return best
}

// prefixEntry is a cached prefix and its entry, as buildLPM takes them.
type prefixEntry struct {
	p netip.Prefix
	e *entry
}

// prefixTables builds the lookup tables of a set of prefix entries, and
// the list of their prefixes in address order.
func prefixTables(ps []prefixEntry) (v4, v6 *lpmTable, prefixes []netip.Prefix) {
	var p4, p6 []prefixEntry
	prefixes = make([]netip.Prefix, 0, len(ps))
	for _, pe := range ps {
		if pe.p.Addr().Is4() {
			p4 = append(p4, pe)
		} else {
			p6 = append(p6, pe)
		}
		prefixes = append(prefixes, pe.p)
	}
	slices.SortFunc(prefixes, comparePrefix)
	return buildLPM(p4), buildLPM(p6), prefixes
}

// comparePrefix orders prefixes by address, then length.
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// destKey is the key of destination a's own entry: its full-length prefix.
func destKey(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen())
}

// isDest reports whether a key is a destination's (not a prefix entry's).
func isDest(p netip.Prefix) bool { return p.Bits() == p.Addr().BitLen() }

// buildLPM returns a table holding the prefixes of one family (nil when
// there are none). It sorts ps.
func buildLPM(ps []prefixEntry) *lpmTable {
	if len(ps) == 0 {
		return nil
	}
	slices.SortFunc(ps, func(a, b prefixEntry) int { return a.p.Bits() - b.p.Bits() })
	t := &lpmTable{root: new(lpmNode)}
	for _, pe := range ps {
		l := pe.p.Bits()
		if l == 0 {
			t.def = pe.e
			continue
		}
		a := pe.p.Masked().Addr().AsSlice()
		depth := (l - 1) / 8
		n := t.root
		for i := range depth {
			k := n.kids[a[i]]
			if k == nil {
				k = new(lpmNode)
				n.kids[a[i]] = k
			}
			n = k
		}
		// Shorter prefixes were placed first: a longer one overwrites the
		// slots it shares with them.
		first, span := int(a[depth]), 1<<(8*(depth+1)-l)
		for j := range span {
			n.ents[first+j] = pe.e
		}
	}
	return t
}
