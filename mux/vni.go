package mux

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
	"sync/atomic"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// A frame on the Mux's uplink carries no VNI: it comes from the router,
// addressed to a public VIP, so engine.Parse keys it with VNI 0. A rule,
// though, is found by (VNI, protocol, address, port), the VNI being the
// tenant the VIP belongs to, which the encapsulation also writes into the
// VXLAN header. The uplinkVNI stage bridges the two: it looks the VIP's
// VNI up by the packet's destination address and puts it into the flow
// key, before the ICMP and balancing stages look for the rule.
//
// This needs a VIP address to belong to one VNI, which the Controller
// checks when it applies a document (newVNIIndex).

// vniIndex maps VIP addresses to their VNI. It is immutable once built and
// swapped whole by the Controller. The table is open addressing with linear
// probing at a load of at most 1/2, keyed by the destination address as
// flow.Key holds it (two words and the family): a Go map hashing a 17-byte
// struct cost ~20 ns per packet, this a few.
type vniIndex struct {
	// one is set when every VIP is in the same VNI (or there is no VIP):
	// then no lookup is needed.
	one   bool
	vni   uint32
	slots []vniSlot // power-of-two length; used marks occupied slots
	shift uint8     // 64 - log2(len(slots))
}

type vniSlot struct {
	a0, a1 uint64 // the address, little-endian words of Key.Dst
	family uint8
	used   bool
	vni    uint32
}

// vniHash mixes an address into the table's index (Fibonacci hashing of a
// multiply-folded key).
func vniHash(a0, a1 uint64, family uint8, shift uint8) uint64 {
	hi, lo := bits.Mul64(a0^uint64(family)<<56, a1^0x9e3779b97f4a7c15)
	return ((hi ^ lo) * 0x9e3779b97f4a7c15) >> shift
}

// lookup returns the VNI of the VIP address dst (a Key.Dst) of family.
func (x *vniIndex) lookup(dst *[16]byte, family uint8) (uint32, bool) {
	a0 := binary.LittleEndian.Uint64(dst[:8])
	a1 := binary.LittleEndian.Uint64(dst[8:])
	mask := uint64(len(x.slots) - 1)
	for i := vniHash(a0, a1, family, x.shift); ; i = (i + 1) & mask {
		e := &x.slots[i]
		if !e.used {
			return 0, false
		}
		if e.a0 == a0 && e.a1 == a1 && e.family == family {
			return e.vni, true
		}
	}
}

// insert adds or overwrites an address; the table has room (load ≤ 1/2).
func (x *vniIndex) insert(dst *[16]byte, family uint8, vni uint32) {
	a0 := binary.LittleEndian.Uint64(dst[:8])
	a1 := binary.LittleEndian.Uint64(dst[8:])
	mask := uint64(len(x.slots) - 1)
	for i := vniHash(a0, a1, family, x.shift); ; i = (i + 1) & mask {
		e := &x.slots[i]
		if !e.used || (e.a0 == a0 && e.a1 == a1 && e.family == family) {
			*e = vniSlot{a0: a0, a1: a1, family: family, used: true, vni: vni}
			return
		}
	}
}

// newVNIIndexOf builds the index of a plan's VIPs (NewPlan has checked
// that each address has one VNI).
func newVNIIndexOf(p *Plan) *vniIndex {
	size := 8
	for size < 2*len(p.VNIs) {
		size <<= 1
	}
	idx := &vniIndex{one: true, slots: make([]vniSlot, size), shift: uint8(64 - bits.TrailingZeros(uint(size)))}
	first := true
	for a, vni := range p.VNIs {
		k := flow.KeyFrom(vni, flow.ProtoTCP, netip.AddrPortFrom(a, 0), netip.AddrPortFrom(a, 0))
		idx.insert(&k.Dst, k.Family, vni)
		if first {
			idx.vni, first = vni, false
		} else if vni != idx.vni {
			idx.one = false
		}
	}
	return idx
}

// newVNIIndex builds the index of doc's VIPs. It refuses a document that
// puts one VIP address into two VNIs: the uplink could not tell them
// apart.
func newVNIIndex(doc *control.Document) (*vniIndex, error) {
	p, err := NewPlan(doc, "")
	if err != nil {
		return nil, err
	}
	return newVNIIndexOf(p), nil
}

// uplinkVNI is the stage that sets each packet's Key.VNI to its VIP's.
// Packets to no VIP keep VNI 0 (the balancing stage drops them: no rule).
// It is safe for concurrent use and allocates nothing.
type uplinkVNI struct {
	idx *atomic.Pointer[vniIndex]
}

// Process implements engine.Stage.
func (s uplinkVNI) Process(b *engine.Batch) {
	var idx *vniIndex
	if ms, ok := b.Snapshot.(*muxSnapshot); ok && ms != nil {
		idx = ms.vnis // the batch's version
	} else {
		idx = s.idx.Load() // no worker snapshot: tests, hand-made batches
	}
	if idx == nil {
		return
	}
	if idx.one {
		if idx.vni != 0 {
			for _, p := range b.Packets() {
				p.Key.VNI = idx.vni
			}
		}
		return
	}
	for _, p := range b.Packets() {
		if v, ok := idx.lookup(&p.Key.Dst, p.Key.Family); ok {
			p.Key.VNI = v
		}
	}
}
