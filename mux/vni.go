package mux

import (
	"fmt"
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

// vniAddr is the index key: a destination address as flow.Key holds it.
type vniAddr struct {
	addr   [16]byte
	family uint8
}

// vniIndex maps VIP addresses to their VNI. It is immutable once built and
// swapped whole by the Controller.
type vniIndex struct {
	// one is set when every VIP is in the same VNI (or there is no VIP):
	// then no lookup is needed.
	one    bool
	vni    uint32
	byAddr map[vniAddr]uint32
}

// newVNIIndex builds the index of doc's VIPs. It refuses a document that
// puts one VIP address into two VNIs: the uplink could not tell them
// apart.
func newVNIIndex(doc *control.Document) (*vniIndex, error) {
	idx := &vniIndex{one: true, byAddr: map[vniAddr]uint32{}}
	where := map[netip.Addr]string{}
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		k := flow.KeyFrom(v.VNI, v.Protocol, netip.AddrPortFrom(v.Address, 0), netip.AddrPortFrom(v.Address, 0))
		a := vniAddr{addr: k.Dst, family: k.Family}
		if prev, ok := idx.byAddr[a]; ok && prev != v.VNI {
			return nil, fmt.Errorf("VIP %s (%s) is in VNI %d and VIP %s in VNI %d: "+
				"a Mux's uplink carries no VNI, so a VIP address must belong to one VNI",
				v.Name, v.Address, v.VNI, where[v.Address], prev)
		}
		idx.byAddr[a] = v.VNI
		where[v.Address] = v.Name
		if i == 0 {
			idx.vni = v.VNI
		} else if v.VNI != idx.vni {
			idx.one = false
		}
	}
	return idx, nil
}

// uplinkVNI is the stage that sets each packet's Key.VNI to its VIP's.
// Packets to no VIP keep VNI 0 (the balancing stage drops them: no rule).
// It is safe for concurrent use and allocates nothing.
type uplinkVNI struct {
	idx *atomic.Pointer[vniIndex]
}

// Process implements engine.Stage.
func (s uplinkVNI) Process(b *engine.Batch) {
	idx := s.idx.Load()
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
		if v, ok := idx.byAddr[vniAddr{addr: p.Key.Dst, family: p.Key.Family}]; ok {
			p.Key.VNI = v
		}
	}
}
