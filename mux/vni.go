package mux

import (
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
// This needs a VIP address to belong to one VNI, which NewPlan checks, so
// the Controller refuses a document that breaks it.

// uplinkVNI is the stage that sets each packet's Key.VNI to its VIP's,
// which the batch's rule snapshot holds with every VIP address: none to
// find when every VIP is in one VNI (flow.Snapshot.SingleVNI); else the
// packet's rule by its VIP without the VNI (flow.Snapshot.LookupUplink,
// one probe, the rule left in Packet.Rule as a hint for the balancing
// stage), and for a packet to a VIP address but no rule's port the
// address's VNI (flow.Snapshot.VIPAddrVNI). Packets to no VIP keep VNI 0
// (the balancing stage drops them: no rule). It is safe for concurrent
// use and allocates nothing.
type uplinkVNI struct {
	rules *flow.Rules // for batches without a worker snapshot: tests, hand-made batches
}

// Process implements engine.Stage.
func (s uplinkVNI) Process(b *engine.Batch) {
	snap := b.Rules(s.rules) // the batch's version
	if snap == nil {
		return
	}
	if vni, ok := snap.SingleVNI(); ok {
		if vni != 0 {
			for _, p := range b.Packets() {
				p.Key.VNI = vni
			}
		}
		return
	}
	for _, p := range b.Packets() {
		uplinkPacket(snap, p)
	}
}

// uplinkPacket is the stage's work on one packet of a batch whose
// snapshot snap has VIPs in several VNIs.
func uplinkPacket(snap *flow.Snapshot, p *engine.Packet) {
	// One probe finds the rule, and with it the VNI; the rule is left in
	// p.Rule for the balancing stage, which takes it after checking it
	// against the key (flow.Snapshot.LookupHint) instead of probing
	// again.
	if r := snap.LookupUplink(&p.Key); r != nil {
		p.Key.VNI = r.VIP.VNI
		p.Rule = r
		return
	}
	if v, ok := snap.VIPAddrVNI(&p.Key.Dst, p.Key.Family); ok {
		p.Key.VNI = v
	}
}
