package mux

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/xdplb/xdplb/bgp"
	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// Plan is one document seen from one Mux: everything the Mux will run,
// computed without I/O or privileges by NewPlan, so that what a Mux would
// do with a document can be printed, compared and tested. One document
// may serve a whole fleet: NewPlan takes the node's name and reads that
// node's part of the document (control.Document.ForNode: its BGP router
// id, peers and addresses).
//
// Applying a plan (Controller.Apply) builds the rule snapshot from Rules
// (with the health states known then; it holds each VIP address's VNI
// too), publishes it, syncs the steering program, hands the probe
// targets to the health checker and announces the VIP addresses that are
// servable.
type Plan struct {
	// Version is the document's version.
	Version uint64
	// HashSeed is the fleet's flow hash seed.
	HashSeed uint64
	// VIPs are the document's VIPs, in document order: Rules are built
	// from them (with health), VIPs[i] becoming rule ID i.
	VIPs []control.VIP
	// MaglevMinTableSize is the document's minimum table size.
	MaglevMinTableSize uint32
	// VNIs maps every VIP address to its VNI, for the uplink (whose
	// packets carry none); one VNI per address.
	VNIs map[netip.Addr]uint32
	// Steering is the steering program's configuration: every VIP (and
	// ICMP to every VIP address) goes to the sockets.
	Steering steer.Config
	// Probes are the health checker's targets: every backend of every
	// probed VIP.
	Probes []health.Target
	// Announce are the host prefixes of every VIP address, sorted: what
	// the Mux announces when each has a servable backend. (The address of
	// an outbound section is announced whatever its VIPs' health: its
	// replies must reach the Muxes.)
	Announce []netip.Prefix
	// BGP is the document's BGP section (nil: no BGP).
	BGP *control.BGP
	// Sources are the prefixes the source filter refuses traffic from:
	// infra_prefixes and mux_prefixes.
	Sources []netip.Prefix
	// Outbound are the document's outbound sections, in document order:
	// the addresses whose replies to source-NATed connections the Mux
	// sends to the owners of their ports (balance.Returns).
	Outbound []OutboundPlan
}

// OutboundPlan is one outbound section as a Mux runs it.
type OutboundPlan struct {
	// Address is the VIP address VMs use as their source.
	Address netip.Addr
	// VNI is the section's tenant: every owner's.
	VNI uint32
	// Pool is where allocations come from; a packet to a pool port no
	// allocation holds is dropped (outbound_unallocated).
	Pool []control.PortRange
	// Inbound are the address's inbound ports (its VIPs', every
	// protocol), sorted: no allocation may hold one.
	Inbound []uint16
	// Owners are the section's DIPs, each with its host, VNI and MAC
	// from hosts[]: what a dynamic allocation naming only a DIP is
	// completed with (Controller.SetPortAllocations).
	Owners map[netip.Addr]flow.PortOwner
	// Static are the document's allocations, their owners completed.
	Static []flow.PortAllocation
}

// NewPlan returns the plan of doc for the Mux named node ("" for a
// per-node document, which names no other node). It refuses a document
// that puts one VIP address into two VNIs (a Mux's uplink could not tell
// them apart), a fleet document that does not list node, and a Host
// Agent's view (one with VIPAddresses: its VIPs are a host's, not the
// fleet's).
func NewPlan(doc *control.Document, node string) (*Plan, error) {
	if len(doc.VIPAddresses) > 0 {
		return nil, fmt.Errorf("version %d has vip_addresses: it is a Host Agent's view of the fleet's document "+
			"(its vips are only those one host serves), not the fleet's document a Mux runs", doc.Version)
	}
	doc, err := doc.ForNode(node)
	if err != nil {
		return nil, err
	}
	p := &Plan{Version: doc.Version, HashSeed: doc.HashSeed, VIPs: doc.VIPs,
		MaglevMinTableSize: doc.MaglevMinTableSize, VNIs: map[netip.Addr]uint32{},
		Steering: steerConfig(doc), Probes: targets(doc), BGP: doc.BGP}
	where := map[netip.Addr]string{}
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		if prev, ok := p.VNIs[v.Address]; ok && prev != v.VNI {
			return nil, fmt.Errorf("VIP %s (%s) is in VNI %d and VIP %s in VNI %d: "+
				"a Mux's uplink carries no VNI, so a VIP address must belong to one VNI",
				v.Name, v.Address, v.VNI, where[v.Address], prev)
		}
		if _, ok := p.VNIs[v.Address]; !ok {
			p.Announce = append(p.Announce, bgp.HostPrefix(v.Address))
		}
		p.VNIs[v.Address], where[v.Address] = v.VNI, v.Name
	}
	slices.SortFunc(p.Announce, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	p.Sources = append(slices.Clone(doc.InfraPrefixes), doc.MuxPrefixes...)
	if p.Outbound, err = outboundPlans(doc); err != nil {
		return nil, err
	}
	return p, nil
}

// outboundPlans completes doc's outbound sections with the owners'
// hosts, VNIs and MACs from hosts[] (the document checks that every DIP
// of a section is a VM of its VNI there).
func outboundPlans(doc *control.Document) ([]OutboundPlan, error) {
	if len(doc.Outbound) == 0 {
		return nil, nil
	}
	type vm struct {
		vni  uint32
		addr netip.Addr
	}
	sites := map[vm]flow.PortOwner{}
	for i := range doc.Hosts {
		h := &doc.Hosts[i]
		for _, v := range h.VMs {
			sites[vm{v.VNI, v.Address}] = flow.PortOwner{DIP: v.Address, Host: h.Address, VNI: v.VNI, MAC: v.MAC}
		}
	}
	out := make([]OutboundPlan, 0, len(doc.Outbound))
	for i := range doc.Outbound {
		ob := &doc.Outbound[i]
		op := OutboundPlan{Address: ob.Address, VNI: ob.VNI, Pool: ob.Pool, Owners: map[netip.Addr]flow.PortOwner{}}
		for j := range doc.VIPs {
			if v := &doc.VIPs[j]; v.Address == ob.Address && !slices.Contains(op.Inbound, v.Port) {
				op.Inbound = append(op.Inbound, v.Port)
			}
		}
		slices.Sort(op.Inbound)
		for _, d := range ob.DIPs {
			o, ok := sites[vm{ob.VNI, d}]
			if !ok {
				return nil, fmt.Errorf("outbound %v: DIP %v is no VM of VNI %d in hosts[]", ob.Address, d, ob.VNI)
			}
			op.Owners[d] = o
		}
		for _, a := range ob.Static {
			op.Static = append(op.Static, flow.PortAllocation{VIP: ob.Address, First: a.Ports.First, Last: a.Ports.Last, Owner: op.Owners[a.DIP]})
		}
		out = append(out, op)
	}
	return out, nil
}

// PlanDiff is what must change to go from one plan to another.
type PlanDiff struct {
	// VIPs added, removed, and changed (their rule, hence their Maglev
	// table or their probes, must be rebuilt), by name, in order.
	AddedVIPs, RemovedVIPs, ChangedVIPs []string
	// Tables are the changed VIPs whose Maglev table changes: a backend
	// added, removed, renamed or reweighted, or the table size or
	// distribution changed, or a backend drained or undrained (a probe or a
	// DIP port alone does not).
	Tables []string
	// SteerAdded and SteerRemoved are the steering entries to add and
	// remove.
	SteerAdded, SteerRemoved []steer.DstRule
	// ProbesAdded and ProbesRemoved are the probe targets (by key) that
	// start and stop; ProbesChanged change address or spec.
	ProbesAdded, ProbesRemoved, ProbesChanged []string
	// AnnounceAdded and AnnounceRemoved are the VIP prefixes that come and
	// go (subject to health).
	AnnounceAdded, AnnounceRemoved []netip.Prefix
	// VNIs is true when a VIP address's VNI changes (or one comes or goes).
	VNIs bool
	// HashSeed is true when the flow hash seed changes: every VIP's new
	// flows move.
	HashSeed bool
	// BGP is true when the BGP section changes (the speaker is
	// reconfigured, or restarted: see bgp.Reconfigure).
	BGP bool
	// Sources is true when the source filter's prefixes change.
	Sources bool
	// Outbound are the addresses whose outbound section comes, goes, or
	// changes its VNI, pool, DIPs or inbound ports; AllocationsAdded and
	// AllocationsRemoved are the static allocations that come and go (a
	// range moving to another owner is both).
	Outbound                             []netip.Addr
	AllocationsAdded, AllocationsRemoved []flow.PortAllocation
}

// Empty reports whether nothing changes.
func (d PlanDiff) Empty() bool { return reflect.DeepEqual(d, PlanDiff{}) }

// Diff returns what must change to go from p (nil: nothing running) to q.
func (p *Plan) Diff(q *Plan) PlanDiff {
	if p == nil {
		p = &Plan{}
	}
	var d PlanDiff
	p.diffVIPs(q, &d)
	d.SteerAdded, d.SteerRemoved = setDiff(p.Steering.Dst, q.Steering.Dst)
	probes := make(map[string]health.Target, len(p.Probes))
	for _, t := range p.Probes {
		probes[t.Key] = t
	}
	keys := make(map[string]bool, len(q.Probes))
	for _, t := range q.Probes {
		keys[t.Key] = true
		switch o, ok := probes[t.Key]; {
		case !ok:
			d.ProbesAdded = append(d.ProbesAdded, t.Key)
		case o != t:
			d.ProbesChanged = append(d.ProbesChanged, t.Key)
		}
	}
	for _, t := range p.Probes {
		if !keys[t.Key] {
			d.ProbesRemoved = append(d.ProbesRemoved, t.Key)
		}
	}
	d.AnnounceAdded, d.AnnounceRemoved = setDiff(p.Announce, q.Announce)
	d.VNIs = !maps2Equal(p.VNIs, q.VNIs)
	d.HashSeed = p.HashSeed != q.HashSeed && p.VIPs != nil
	d.BGP = !reflect.DeepEqual(p.BGP, q.BGP)
	d.Sources = !slices.Equal(p.Sources, q.Sources)
	d.Outbound, d.AllocationsAdded, d.AllocationsRemoved = outboundDiff(p.Outbound, q.Outbound)
	return d
}

// diffVIPs fills d's VIP fields (AddedVIPs, RemovedVIPs, ChangedVIPs,
// Tables): what Controller.Apply logs, without the rest of Diff. p may
// be nil (nothing running).
func (p *Plan) diffVIPs(q *Plan, d *PlanDiff) {
	if p == nil {
		p = &Plan{}
	}
	old := make(map[string]*control.VIP, len(p.VIPs))
	for i := range p.VIPs {
		old[p.VIPs[i].Name] = &p.VIPs[i]
	}
	seen := make(map[string]bool, len(q.VIPs))
	for i := range q.VIPs {
		v := &q.VIPs[i]
		seen[v.Name] = true
		o, ok := old[v.Name]
		switch {
		case !ok:
			d.AddedVIPs = append(d.AddedVIPs, v.Name)
		case !vipEqual(o, v):
			d.ChangedVIPs = append(d.ChangedVIPs, v.Name)
			if tableChanged(o, v) || p.MaglevMinTableSize != q.MaglevMinTableSize && v.TableSize == 0 {
				d.Tables = append(d.Tables, v.Name)
			}
		case p.MaglevMinTableSize != q.MaglevMinTableSize && v.TableSize == 0:
			d.ChangedVIPs = append(d.ChangedVIPs, v.Name)
			d.Tables = append(d.Tables, v.Name)
		}
	}
	for i := range p.VIPs {
		if !seen[p.VIPs[i].Name] {
			d.RemovedVIPs = append(d.RemovedVIPs, p.VIPs[i].Name)
		}
	}
}

// outboundDiff returns the addresses whose outbound section differs
// (but for its static allocations) between p and q, and the static
// allocations added and removed.
func outboundDiff(p, q []OutboundPlan) (addrs []netip.Addr, added, removed []flow.PortAllocation) {
	old := map[netip.Addr]*OutboundPlan{}
	var pa, qa []flow.PortAllocation
	for i := range p {
		old[p[i].Address] = &p[i]
		pa = append(pa, p[i].Static...)
	}
	seen := map[netip.Addr]bool{}
	for i := range q {
		n := &q[i]
		seen[n.Address] = true
		qa = append(qa, n.Static...)
		o, ok := old[n.Address]
		if !ok || o.VNI != n.VNI || !slices.Equal(o.Pool, n.Pool) || !slices.Equal(o.Inbound, n.Inbound) || !maps.Equal(o.Owners, n.Owners) {
			addrs = append(addrs, n.Address)
		}
	}
	for i := range p {
		if !seen[p[i].Address] {
			addrs = append(addrs, p[i].Address)
		}
	}
	added, removed = setDiff(pa, qa)
	return addrs, added, removed
}

// vipEqual reports whether a and b are the same VIP: reflect.DeepEqual,
// without reflection (Diff compares every VIP of every version; at
// 10,000 backends DeepEqual was a sixth of a Mux's Apply).
// TestVIPEqualCoversEveryField fails when control.VIP gains a field this
// does not compare.
func vipEqual(a, b *control.VIP) bool {
	return a.Name == b.Name && a.Address == b.Address && a.Protocol == b.Protocol && a.Port == b.Port &&
		a.VNI == b.VNI && a.Distribution == b.Distribution && a.TableSize == b.TableSize &&
		(a.Probe == b.Probe || a.Probe != nil && b.Probe != nil && *a.Probe == *b.Probe) &&
		a.InboundNAT == b.InboundNAT && slices.Equal(a.Backends, b.Backends)
}

// tableChanged reports whether a VIP's Maglev table differs between o and
// v: the table's inputs are the backends' names, weights and states, the
// size and the distribution.
func tableChanged(o, v *control.VIP) bool {
	if o.TableSize != v.TableSize || o.Distribution != v.Distribution || len(o.Backends) != len(v.Backends) {
		return true
	}
	for i := range o.Backends {
		ob, vb := &o.Backends[i], &v.Backends[i]
		if ob.Name != vb.Name || ob.Weight != vb.Weight || ob.State != vb.State {
			return true
		}
	}
	return false
}

// setDiff returns the elements of b not in a, and of a not in b, each in
// its slice's order.
func setDiff[T comparable](a, b []T) (added, removed []T) {
	in := func(s []T, x T) bool { return slices.Contains(s, x) }
	for _, x := range b {
		if !in(a, x) {
			added = append(added, x)
		}
	}
	for _, x := range a {
		if !in(b, x) {
			removed = append(removed, x)
		}
	}
	return added, removed
}

func maps2Equal(a, b map[netip.Addr]uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// String renders the plan as text, one fact per line, for tests and for
// operators (mux -plan).
func (p *Plan) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "version %d, hash seed %#x\n", p.Version, p.HashSeed)
	for i := range p.VIPs {
		v := &p.VIPs[i]
		size := v.TableSize
		if size == 0 {
			size = flow.MaglevAutoSize(len(v.Backends), p.MaglevMinTableSize)
		}
		fmt.Fprintf(&s, "vip %s: %s proto %d port %d vni %d, %v, table %d, %d backends", v.Name, v.Address, v.Protocol, v.Port, v.VNI, v.Distribution, size, len(v.Backends))
		if v.Probe != nil {
			fmt.Fprintf(&s, ", probed (%s)", v.Probe.Type)
		}
		s.WriteString("\n")
		for _, b := range v.Backends {
			fmt.Fprintf(&s, "  backend %s: %s port %d weight %d via %s\n", b.Name, b.Address, b.Port, b.Weight, b.Host)
		}
	}
	for _, r := range p.Steering.Dst {
		fmt.Fprintf(&s, "steer %s proto %d port %d\n", r.Addr, r.Proto, r.Port)
	}
	for _, t := range p.Probes {
		fmt.Fprintf(&s, "probe %s: %s %s every %v\n", t.Key, t.Spec.Type, t.Addr, t.Spec.Interval)
	}
	for _, a := range p.Announce {
		fmt.Fprintf(&s, "announce %s (when servable)\n", a)
	}
	for i := range p.Outbound {
		o := &p.Outbound[i]
		pool := make([]string, len(o.Pool))
		for j, r := range o.Pool {
			pool[j] = r.String()
		}
		fmt.Fprintf(&s, "outbound %s vni %d (announced always): pool %s, %d dips, inbound ports %v\n", o.Address, o.VNI, strings.Join(pool, ","), len(o.Owners), o.Inbound)
		for _, a := range o.Static {
			fmt.Fprintf(&s, "  static %d-%d: %s via %s mac %s\n", a.First, a.Last, a.Owner.DIP, a.Owner.Host, net.HardwareAddr(a.Owner.MAC[:]))
		}
	}
	for _, src := range p.Sources {
		fmt.Fprintf(&s, "refuse sources %s\n", src)
	}
	if p.BGP != nil {
		fmt.Fprintf(&s, "bgp as %d router-id %s, %d peers\n", p.BGP.ASN, p.BGP.RouterID, len(p.BGP.Peers))
	}
	return s.String()
}
