package flow

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
)

// PortOwner is who holds a port of an outbound allocation: replies to
// the VIP on that port belong to this DIP's connections.
type PortOwner struct {
	DIP  netip.Addr // the VM
	Host netip.Addr // its host: where the Mux sends the replies (VXLAN)
	VNI  uint32     // the DIP's tenant
	MAC  [6]byte    // the DIP's MAC (the inner destination the Mux writes; zero: unknown)
}

// PortAllocation is one range of a VIP address's ports held by an owner.
type PortAllocation struct {
	VIP         netip.Addr
	First, Last uint16
	Owner       PortOwner
}

// PortRangeUse is how much of one outbound allocation a Host Agent's
// source NAT is using, as it reports it to whatever allocates ranges
// (fleet's allocator claims another range for a DIP when its ranges run
// high, and returns a range nobody uses).
type PortRangeUse struct {
	PortAllocation
	// Conns is how many live connections hold a port of the range.
	Conns int
	// Ports is how many distinct ports of the range those connections
	// hold: a port is reused for connections to different remote
	// endpoints, so Conns may exceed the range's size while Ports
	// cannot.
	Ports int
}

// PortOwners maps (VIP address, port) to the owner of the outbound
// allocation holding that port: the Mux's range table for the replies
// to source-NATed connections. It is immutable once built, a value for
// a data-path snapshot; Lookup allocates nothing.
//
// Each address has a table of its ports in blocks of the allocations'
// greatest common unit (a power of two: 1 << shift), so a lookup is a
// search among the addresses (few: the VIPs with outbound sections) and
// one index.
type PortOwners struct {
	addrs  []addrKey // sorted
	tables []portTable
	owners []PortOwner
}

// addrKey is an address as Key stores it (IPv4 in the first 4 bytes),
// as two big-endian words, so that comparing is two integer compares.
type addrKey struct {
	hi, lo uint64
	fam    uint8
}

func keyOf16(a *[16]byte, fam uint8) addrKey {
	return addrKey{binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:]), fam}
}

func keyOf(a netip.Addr) addrKey {
	a = a.Unmap()
	var b [16]byte
	if a.Is4() {
		v := a.As4()
		copy(b[:], v[:])
		return keyOf16(&b, FamilyIPv4)
	}
	b = a.As16()
	return keyOf16(&b, FamilyIPv6)
}

func compareKeys(x, y addrKey) int {
	switch {
	case x.hi != y.hi:
		return cmpU64(x.hi, y.hi)
	case x.lo != y.lo:
		return cmpU64(x.lo, y.lo)
	}
	return int(x.fam) - int(y.fam)
}

func cmpU64(a, b uint64) int {
	if a < b {
		return -1
	}
	return 1
}

func (x addrKey) less(y addrKey) bool {
	return x.hi < y.hi || (x.hi == y.hi && (x.lo < y.lo || (x.lo == y.lo && x.fam < y.fam)))
}

type portTable struct {
	shift uint8
	// block[port>>shift] is an index into owners plus one; 0: none.
	block []uint32
}

// NewPortOwners builds the table of allocs. Allocations of one address
// must not overlap.
func NewPortOwners(allocs []PortAllocation) (*PortOwners, error) {
	t := &PortOwners{}
	byAddr := map[addrKey][]PortAllocation{}
	for _, a := range allocs {
		if !a.VIP.IsValid() || a.Last < a.First {
			return nil, fmt.Errorf("flow: port allocation %v:%d-%d: invalid", a.VIP, a.First, a.Last)
		}
		k := keyOf(a.VIP)
		byAddr[k] = append(byAddr[k], a)
	}
	for k := range byAddr {
		t.addrs = append(t.addrs, k)
	}
	slices.SortFunc(t.addrs, compareKeys)
	for _, k := range t.addrs {
		as := byAddr[k]
		slices.SortFunc(as, func(a, b PortAllocation) int { return int(a.First) - int(b.First) })
		// The largest power of two that every range's start and length
		// are multiples of.
		shift := uint8(16)
		for _, a := range as {
			shift = min(shift, alignment(a.First), alignment(uint16(int(a.Last)-int(a.First)+1)))
		}
		tab := portTable{shift: shift, block: make([]uint32, 1<<(16-shift))}
		for i, a := range as {
			if i > 0 && a.First <= as[i-1].Last {
				return nil, fmt.Errorf("flow: port allocations %v:%d-%d and %d-%d overlap", a.VIP, as[i-1].First, as[i-1].Last, a.First, a.Last)
			}
			t.owners = append(t.owners, a.Owner)
			for b := int(a.First) >> shift; b <= int(a.Last)>>shift; b++ {
				tab.block[b] = uint32(len(t.owners))
			}
		}
		t.tables = append(t.tables, tab)
	}
	return t, nil
}

// alignment is the number of trailing zero bits of n (16 for 0, whose
// range length 65536 wraps to it).
func alignment(n uint16) uint8 {
	if n == 0 {
		return 16
	}
	s := uint8(0)
	for n&1 == 0 {
		n >>= 1
		s++
	}
	return s
}

// Lookup returns the owner of the port a packet with key k is sent to
// (k.Dst, k.DstPort), if an allocation holds it.
func (t *PortOwners) Lookup(k *Key) (PortOwner, bool) {
	return t.lookup(keyOf16(&k.Dst, k.Family), k.DstPort)
}

// LookupAddr is Lookup for an address and a port.
func (t *PortOwners) LookupAddr(vip netip.Addr, port uint16) (PortOwner, bool) {
	return t.lookup(keyOf(vip), port)
}

// LookupIndex is Lookup returning where the owner is in the table: the
// index i (0 ≤ i < Len) of the allocation holding k's destination port,
// whose owner Owner(i) returns, or -1. A caller that keeps something per
// allocation (the Mux: where to send the allocation's replies) indexes it
// by i. It allocates nothing.
func (t *PortOwners) LookupIndex(k *Key) int {
	return t.index(keyOf16(&k.Dst, k.Family), k.DstPort)
}

// Len is the number of allocations in the table.
func (t *PortOwners) Len() int {
	if t == nil {
		return 0
	}
	return len(t.owners)
}

// Owner returns the owner of allocation i (0 ≤ i < Len): the table's
// allocations are ordered by address, then by port.
func (t *PortOwners) Owner(i int) PortOwner { return t.owners[i] }

func (t *PortOwners) lookup(addr addrKey, port uint16) (PortOwner, bool) {
	i := t.index(addr, port)
	if i < 0 {
		return PortOwner{}, false
	}
	return t.owners[i], true
}

func (t *PortOwners) index(addr addrKey, port uint16) int {
	if t == nil {
		return -1
	}
	// Binary search: the address list is short and sorted.
	lo, hi := 0, len(t.addrs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if t.addrs[m].less(addr) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == len(t.addrs) || t.addrs[lo] != addr {
		return -1
	}
	tab := &t.tables[lo]
	return int(tab.block[port>>tab.shift]) - 1
}
