package nexthop

import "net/netip"

// boundaries is the set of prefixes where the kernel's answer for a
// destination may change: the destination prefix of every route in every
// routing table (local and broadcast routes included) and of every policy
// rule that selects by destination. A prefix entry must not straddle any
// of them: carve cuts the route a destination matched down to the largest
// part around the destination that holds no boundary, so that every
// address in it gets the same answer from the kernel.
//
// It is a binary trie per family, one node per bit of a prefix; a node
// counts the boundaries at and below it (nodes whose count drops to zero
// are removed). A boundary can be added several times (the same prefix in
// several tables) and is kept until removed as often.
type boundaries struct {
	root [2]*bnode // IPv4, IPv6
	n    int       // distinct prefixes held
}

type bnode struct {
	kid   [2]*bnode
	sub   int32 // boundaries at or below this node
	exact int32 // boundaries exactly at this node
}

func family(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// bit returns bit i (0 the most significant) of a's bytes.
func bit(a *[16]byte, i int) int { return int(a[i>>3]>>(7-i&7)) & 1 }

func addrBytes(a netip.Addr) (b [16]byte) {
	if a.Is4() {
		v := a.As4()
		copy(b[:], v[:])
		return b
	}
	return a.As16()
}

// add records one more boundary at p.
func (b *boundaries) add(p netip.Prefix) {
	p = p.Masked()
	if !p.IsValid() {
		return
	}
	a := addrBytes(p.Addr())
	f := family(p.Addr())
	if b.root[f] == nil {
		b.root[f] = new(bnode)
	}
	n := b.root[f]
	n.sub++
	for i := range p.Bits() {
		c := n.kid[bit(&a, i)]
		if c == nil {
			c = new(bnode)
			n.kid[bit(&a, i)] = c
		}
		n = c
		n.sub++
	}
	n.exact++
	if n.exact == 1 {
		b.n++
	}
}

// remove takes back one add of p; it does nothing if p is not held.
func (b *boundaries) remove(p netip.Prefix) {
	p = p.Masked()
	if !b.has(p) {
		return
	}
	a := addrBytes(p.Addr())
	f := family(p.Addr())
	n := b.root[f]
	n.sub--
	if n.sub == 0 {
		b.root[f] = nil
	}
	for i := range p.Bits() {
		c := n.kid[bit(&a, i)]
		c.sub--
		if c.sub == 0 {
			n.kid[bit(&a, i)] = nil // drops the rest of the path
		}
		n = c
	}
	n.exact--
	if n.exact == 0 {
		b.n--
	}
}

// has reports whether p is held.
func (b *boundaries) has(p netip.Prefix) bool {
	a := addrBytes(p.Addr())
	n := b.root[family(p.Addr())]
	for i := 0; n != nil && i < p.Bits(); i++ {
		n = n.kid[bit(&a, i)]
	}
	return n != nil && n.exact > 0
}

// carve returns the length of the shortest prefix of d, at least minBits
// long, that holds no boundary strictly inside it: every boundary either
// contains that prefix or is disjoint from it. minBits is the length of
// the route d matched, so the prefix returned lies inside that route. A
// result of d.BitLen() means no shorter prefix qualifies.
//
// Walking d's path down the trie, a node at depth k (the prefix d/k) with
// a branch away from d has boundaries that share exactly k bits with d:
// the prefix must be at least k+1 long to leave them out. A boundary on
// the path itself (d/k, holding d) only needs the prefix to be at least k
// long, inside it.
func (b *boundaries) carve(d netip.Addr, minBits int) int {
	a := addrBytes(d)
	q := minBits
	n := b.root[family(d)]
	for k := 0; n != nil; k++ {
		if n.exact > 0 && k > q {
			q = k
		}
		if k == d.BitLen() {
			break
		}
		i := bit(&a, k)
		if n.kid[1-i] != nil && k+1 > q {
			q = k + 1
		}
		n = n.kid[i]
	}
	return q
}
