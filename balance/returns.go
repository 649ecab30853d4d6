package balance

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// DropUnallocated counts packets to a port of an address's outbound pool
// that no allocation holds: no VM's connection uses it, and a pool port
// is never an inbound port, so there is nothing to balance either.
var DropUnallocated = engine.RegisterDropReason("outbound_unallocated")

// Returns is one version of the Mux's range table: where the packets
// returning to source-NATed outbound connections go. A Host Agent
// translates a VM's outbound connection to VIP:port, the port taken from
// a range allocated to that VM (a flow.PortAllocation); the replies reach
// a Mux addressed to VIP:port, and go to the allocation's owner — VXLAN
// to its host, with its VNI and its MAC as the inner destination (which
// the Host Agent's decapsulation picks the VM port by) — instead of being
// balanced.
//
// The balancing Stage consults it for a packet that matches no rule
// (a pool's ports are never inbound ports, so the rule lookup of every
// other packet is not slowed down): when an allocation holds the
// packet's destination port, the stage sets Packet.Rule to a rule of one
// backend, the owner, whose Backend.ID is flow.ReservedID and whose
// Rule.ID is the counter index of the address (ReturnsConfig.Counter),
// so that encap.Encap sends it unchanged and Account counts it as the
// address's returning traffic (AccountStats.Returns) instead of a
// backend's. Such a rule is no rule of the snapshot: it never enters the
// connection table. A port of the address's pool that no allocation
// holds is dropped (DropUnallocated); any other port stays no_rule. A
// reply's first fragment goes to the owner; its later fragments, which
// carry no port, are dropped (no_rule).
//
// The balancing stage reads the table from the batch's snapshot
// (engine.Batch.Snapshot implementing ReturnSource), never from a pointer
// of its own, so a reload changes the rules and the allocations of one
// batch together. Returns is immutable once built; its lookups allocate
// nothing.
type Returns struct {
	owners *flow.PortOwners
	pools  *flow.PortOwners
	rules  []flow.Rule // rules[i]: allocation i of owners, as a rule of one backend
}

// ReturnSource is a batch snapshot (engine.Batch.Snapshot) that carries
// a range table (the Mux's).
type ReturnSource interface{ Returns() *Returns }

// ReturnsConfig is what a range table is built from.
type ReturnsConfig struct {
	// Pools are the outbound pools: the ports of each address that
	// allocations come from (Owner unused). A packet to a pool port that
	// no allocation holds is dropped (DropUnallocated).
	Pools []flow.PortAllocation
	// Allocations are the ranges held by owners, not overlapping within
	// an address. Each owner needs its host, its VNI and its MAC.
	Allocations []flow.PortAllocation
	// Counter returns the index an address's returning traffic is
	// counted under (Account; AccountStats.Returns). A node keeps an
	// address's index across versions, so that counts carry over a
	// reload; nil counts every address under 0.
	Counter func(netip.Addr) uint32
}

// NewReturns builds the range table of cfg.
func NewReturns(cfg ReturnsConfig) (*Returns, error) {
	for _, a := range cfg.Allocations {
		o := &a.Owner
		switch {
		case !o.Host.IsValid():
			return nil, fmt.Errorf("balance: allocation %v:%d-%d: owner %v has no host", a.VIP, a.First, a.Last, o.DIP)
		case o.MAC == [6]byte{}:
			return nil, fmt.Errorf("balance: allocation %v:%d-%d: owner %v has no MAC", a.VIP, a.First, a.Last, o.DIP)
		case o.VNI >= 1<<24:
			return nil, fmt.Errorf("balance: allocation %v:%d-%d: VNI %d has more than 24 bits", a.VIP, a.First, a.Last, o.VNI)
		}
	}
	owners, err := flow.NewPortOwners(cfg.Allocations)
	if err != nil {
		return nil, fmt.Errorf("balance: %w", err)
	}
	pools := make([]flow.PortAllocation, len(cfg.Pools))
	for i, p := range cfg.Pools {
		pools[i] = flow.PortAllocation{VIP: p.VIP, First: p.First, Last: p.Last}
	}
	poolTab, err := flow.NewPortOwners(pools)
	if err != nil {
		return nil, fmt.Errorf("balance: pools: %w", err)
	}
	t := &Returns{owners: owners, pools: poolTab, rules: make([]flow.Rule, owners.Len())}
	backends := make([]flow.Backend, owners.Len()) // one allocation for every rule
	// The table orders allocations by address, then port: find each
	// one's address by looking its first port up.
	for _, a := range cfg.Allocations {
		k := flow.KeyFrom(0, flow.ProtoTCP, netip.AddrPortFrom(unspecified(a.VIP), 0), netip.AddrPortFrom(a.VIP.Unmap(), a.First))
		i := owners.LookupIndex(&k)
		if i < 0 {
			return nil, errors.New("balance: an allocation is not in its own table") // cannot happen
		}
		o := a.Owner
		var counter uint32
		if cfg.Counter != nil {
			counter = cfg.Counter(a.VIP.Unmap())
		}
		backends[i] = flow.Backend{Name: o.DIP.String(), Addr: o.DIP, MAC: o.MAC, Host: o.Host, Weight: 1, ID: flow.ReservedID}
		t.rules[i] = flow.Rule{Name: "outbound " + a.VIP.Unmap().String(), ID: counter,
			VIP: flow.VIP{Addr: a.VIP.Unmap(), VNI: o.VNI}, Backends: backends[i : i+1 : i+1]}
	}
	return t, nil
}

func unspecified(a netip.Addr) netip.Addr {
	if a.Unmap().Is4() {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

// Len is the number of allocations in t.
func (t *Returns) Len() int {
	if t == nil {
		return 0
	}
	return t.owners.Len()
}

// Owner returns the owner of the port k is sent to (k.Dst, k.DstPort),
// if an allocation holds it.
func (t *Returns) Owner(k *flow.Key) (flow.PortOwner, bool) {
	if t == nil {
		return flow.PortOwner{}, false
	}
	if i := t.owners.LookupIndex(k); i >= 0 {
		return t.owners.Owner(i), true
	}
	return flow.PortOwner{}, false
}

// inPool reports whether k's destination port is in its address's
// outbound pool (allocated or not).
func (t *Returns) inPool(k *flow.Key) bool {
	return t != nil && (t.pools.LookupIndex(k) >= 0 || t.owners.LookupIndex(k) >= 0)
}

// place sends p to the owner of its destination port (Rule, Backend,
// Hash set) and returns 0, or returns why it cannot: DropUnallocated
// for a pool port no allocation holds, else engine.DropNoRule.
func (t *Returns) place(p *engine.Packet, h *flow.Hasher) engine.DropReason {
	if t == nil || p.Flags&engine.FlagNonFirstFrag != 0 {
		return engine.DropNoRule
	}
	i := t.owners.LookupIndex(&p.Key)
	if i < 0 {
		if t.pools.LookupIndex(&p.Key) >= 0 {
			return DropUnallocated
		}
		return engine.DropNoRule
	}
	p.Rule = &t.rules[i]
	p.Backend = 0
	// The outer source port's entropy: the connection's 5-tuple (an ICMP
	// error about it is keyed by the flow it quotes, so it hashes alike).
	p.Hash = h.Hash(&p.Key, flow.Tuple5)
	return 0
}

// batchReturns is a batch's range table, loaded from its snapshot when a
// packet first needs it.
type batchReturns struct {
	t      *Returns
	loaded bool
}

func (r *batchReturns) get(b *engine.Batch) *Returns {
	if !r.loaded {
		r.loaded = true
		if rs, ok := b.Snapshot.(ReturnSource); ok {
			r.t = rs.Returns()
		}
	}
	return r.t
}

// returning places p, which matches no rule, by the batch's range table:
// 0 when p is a reply to an outbound connection (sent to its owner),
// else the reason to drop it.
func (s *Stage) returning(ret *batchReturns, b *engine.Batch, p *engine.Packet) engine.DropReason {
	return ret.get(b).place(p, &s.cfg.Hasher)
}

// echoReplyID keys an ICMP echo reply (message m) by its identifier as
// the destination port: a Host Agent's source NAT translates a VM's echo
// identifier as it does a port, from the same allocations.
func echoReplyID(p *engine.Packet, m []byte) {
	p.Key.DstPort = binary.BigEndian.Uint16(m[4:])
	p.Key.SrcPort = 0
}

// quotedEchoID reads the identifier of the echo request an ICMP error
// quotes (q starts at its IP header): the port of a source-NATed ping.
func quotedEchoID(q []byte, v4 bool) (uint16, bool) {
	proto, l4, ok := quotedTransport(q, v4)
	echo, want := uint8(header.ICMPv6EchoRequest), uint8(flow.ProtoICMPv6)
	if v4 {
		echo, want = header.ICMPv4EchoRequest, flow.ProtoICMP
	}
	if !ok || proto != want || len(l4) < header.ICMPv4MinSize || l4[0] != echo {
		return 0, false
	}
	return binary.BigEndian.Uint16(l4[4:]), true
}
