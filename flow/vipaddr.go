package flow

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// addrSlot is one entry of a snapshot's set of VIP addresses (anyVIP): an
// address as Key holds it (two little-endian words and the family; family
// 0 marks an empty slot) and the VNI of its rules, unless they are in
// several (multi), or it is no rule's (other: NewSnapshotAddrs).
type addrSlot struct {
	a0, a1 uint64
	vni    uint32
	family uint8
	multi  bool
	other  bool
}

func addrHash(a0, a1 uint64, family uint8) uint64 {
	hi, lo := bits.Mul64(a0^uint64(family)<<56^0x9e3779b97f4a7c15, a1^0xc2b2ae3d27d4eb4f)
	return hi ^ lo
}

// findAddr returns the slot of addr in the anyVIP set, or nil.
func (s *Snapshot) findAddr(addr *[16]byte, family uint8) *addrSlot {
	if s.anyVIP == nil || family == 0 {
		return nil
	}
	a0, a1 := binary.LittleEndian.Uint64(addr[:8]), binary.LittleEndian.Uint64(addr[8:])
	for i := addrHash(a0, a1, family) & s.anyVIPMask; ; i = (i + 1) & s.anyVIPMask {
		e := &s.anyVIP[i]
		if e.family == 0 {
			return nil
		}
		if e.a0 == a0 && e.a1 == a1 && e.family == family {
			return e
		}
	}
}

// HasVIPAddr reports whether addr, of family (a Key.Src or Key.Dst with
// its Key.Family), is the address of any rule of s, in any VNI, for any
// protocol and port. It does not allocate; it is meant to be called per
// packet (a source filter drops packets whose source is a VIP). An
// address that is no VIP's is nearly always answered by one bit of a
// filter of at least 32 bits per VIP address (vipBits), without probing
// the set.
func (s *Snapshot) HasVIPAddr(addr *[16]byte, family uint8) bool {
	if s.vipBits == nil {
		return false
	}
	h := vipBitsHash(addr, s.vipShift)
	if s.vipBits[h>>6]&(1<<(h&63)) == 0 {
		return false
	}
	return s.findAddr(addr, family) != nil
}

// Bounds of the filter's size in bits: a cache line at least, 8 KiB at
// most.
const (
	vipBitsMin = 512
	vipBitsMax = 1 << 16
)

// sizeVIPBits allocates the filter for n addresses: 32 bits per address
// (about 3% of non-VIP addresses probe the set once it is full), rounded
// up to a power of two within [vipBitsMin, vipBitsMax].
func (s *Snapshot) sizeVIPBits(n int) {
	size := vipBitsMin
	for size < 32*n && size < vipBitsMax {
		size *= 2
	}
	s.vipBits = make([]uint64, size/64)
	s.vipShift = uint8(64 - bits.TrailingZeros(uint(size)))
}

// vipBitsHash returns addr's bit in a filter of 2^(64-shift) bits: one
// multiply of both words folded (an IPv4 address is its first word's low
// half; a family clash only costs a probe).
func vipBitsHash(addr *[16]byte, shift uint8) uint64 {
	a0, a1 := binary.LittleEndian.Uint64(addr[:8]), binary.LittleEndian.Uint64(addr[8:])
	return (a0 ^ bits.RotateLeft64(a1, 32)) * 0x9e3779b97f4a7c15 >> shift
}

// VIPAddrVNI returns the VNI of the rules whose VIP address is addr, of
// family (a Key.Dst with its Key.Family), whatever their protocol and
// port; ok is false when addr is no rule's address, or the address of
// rules in more than one VNI. It does not allocate; it is meant to be
// called per packet: a Mux's uplink carries no VNI, and finds the tenant
// of a packet by its destination.
func (s *Snapshot) VIPAddrVNI(addr *[16]byte, family uint8) (vni uint32, ok bool) {
	if e := s.findAddr(addr, family); e != nil && !e.multi && !e.other {
		return e.vni, true
	}
	return 0, false
}

// SingleVNI returns the VNI of every rule of s when they all share one;
// ok is false when they do not, or s has no rule. A stage that must find
// each packet's VNI (VIPAddrVNI) skips the lookups when there is only one.
func (s *Snapshot) SingleVNI() (vni uint32, ok bool) {
	if !s.oneVNIOK {
		return 0, false
	}
	return s.oneVNI, true
}

// addOtherVIP adds a, the address of no rule of s (NewSnapshotAddrs), to
// the anyVIP set, unless it is there (a rule's address, or given twice).
func (s *Snapshot) addOtherVIP(a netip.Addr) {
	var addr [16]byte
	family := uint8(FamilyIPv6)
	if a = a.Unmap(); a.Is4() {
		a4 := a.As4()
		copy(addr[:], a4[:])
		family = FamilyIPv4
	} else {
		addr = a.As16()
	}
	if s.findAddr(&addr, family) != nil {
		return
	}
	s.addAnyVIP(&addr, family, 0)
	s.findAddr(&addr, family).other = true
}

// addAnyVIP adds an address of a rule in VNI vni to the anyVIP set (sized
// by NewSnapshot).
func (s *Snapshot) addAnyVIP(addr *[16]byte, family uint8, vni uint32) {
	h := vipBitsHash(addr, s.vipShift)
	s.vipBits[h>>6] |= 1 << (h & 63)
	a0, a1 := binary.LittleEndian.Uint64(addr[:8]), binary.LittleEndian.Uint64(addr[8:])
	for i := addrHash(a0, a1, family) & s.anyVIPMask; ; i = (i + 1) & s.anyVIPMask {
		e := &s.anyVIP[i]
		if e.family == 0 {
			*e = addrSlot{a0: a0, a1: a1, vni: vni, family: family}
			return
		}
		if e.a0 == a0 && e.a1 == a1 && e.family == family {
			if e.vni != vni {
				e.multi = true
			}
			return
		}
	}
}
