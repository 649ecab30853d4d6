package fleet

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/xdplb/xdplb/control"
)

// ErrNoView is returned (wrapped) by HostView for a host the document
// does not list by that name, and by a Host Agent's Source when the
// fleet's committed views hold none for its host.
var ErrNoView = errors.New("fleet: no view for the host")

// HostView returns the part of doc that the Host Agent of the host named
// host (a hosts[] name, not an address) runs, as a document of doc's
// version that the Host Agent's parser accepts: Apply writes it under
// views/<host> for the host's Source, so that a Host Agent reads a few
// kilobytes per version, not the fleet's document. It holds:
//
//   - the fleet-wide settings a Host Agent uses: version, written,
//     hash_seed, maglev_min_table_size, infra_prefixes, mux_prefixes
//     (not bgp nor nodes: those are the Muxes');
//   - the VIPs with a backend that is a VM of the host (same VNI and
//     address), each with only those backends: the Host Agent translates
//     for its own DIPs;
//   - every VIP's address, in VIPAddresses (sorted, each once): the Host
//     Agent's client filters drop packets from any VIP of the fleet.
//     Every view lists the same addresses, so Apply stores them once,
//     under views.vips, and a Host Agent's Source reads its view followed
//     by them (the text Marshal writes: vip_addresses is its last key). A
//     VIP added thus rewrites the views of its backends' hosts only, and
//     the others parse their small views again, not a view of every VIP;
//   - every inbound NAT rule, whole (its targets' hosts entries are
//     needed to parse it, and its address is a VIP's);
//   - every outbound section listing a DIP of the host, whole (the
//     host's PortAllocator must know the other DIPs' static ranges);
//   - the host's entry of hosts[], whole, and of every other host only
//     the VMs that those inbound NAT rules and outbound sections name.
//
// The result shares nothing mutable with doc; like a parsed document it
// must not be modified. For every host, hostagent.NewPlan(view, host)
// gives the plan NewPlan(doc, host) gives, OutboundDIPs(view, host) what
// OutboundDIPs(doc, host) gives, the rules of VIPs with the host's
// backends are doc's with only those backends, and the VIP addresses
// (its VIPs' and VIPAddresses) are doc's.
func HostView(doc *control.Document, host string) (*control.Document, error) {
	hi := slices.IndexFunc(doc.Hosts, func(h control.Host) bool { return h.Name == host })
	if hi < 0 {
		return nil, fmt.Errorf("%w: version %d lists no host named %q", ErrNoView, doc.Version, host)
	}
	return newViews(doc).view(hi), nil
}

type vniAddr struct {
	vni  uint32
	addr netip.Addr
}

// views builds every host's view of one document in time linear in the
// document (a fleet's apply builds a thousand), and sums them (viewSum)
// without marshalling them.
type views struct {
	doc *control.Document
	// shared is what every view holds: the fleet-wide settings, the
	// inbound NAT rules and their VIPs (each with its one backend);
	// Version 0.
	shared    control.Document
	sharedSum [sha256.Size]byte
	// addrs is every VIP's address, sorted, each once: every view's
	// VIPAddresses.
	addrs []netip.Addr
	// Per host (an index into doc.Hosts): its backends, as (VIP,
	// backend) indexes in document order; the VIPs they serve (indexes
	// into doc.VIPs, in order); the outbound sections listing one of its
	// DIPs.
	backends [][][2]int
	vips     [][]int
	outbound [][]int
	owner    map[vniAddr]int // a VM's host
	natVMs   map[vniAddr]bool
	// bare is each VIP but an inbound NAT rule's without its backends,
	// and bareSum its digest (sum).
	bare    []control.VIP
	bareSum [][sha256.Size]byte
	// vipText is each VIP's text without backends (control.MarshalVIP),
	// made by text the first time a view that lists the VIP is written.
	vipOnce []sync.Once
	vipText [][]byte
}

func newViews(doc *control.Document) *views {
	vs := &views{doc: doc, owner: map[vniAddr]int{}, natVMs: map[vniAddr]bool{},
		backends: make([][][2]int, len(doc.Hosts)), vips: make([][]int, len(doc.Hosts)), outbound: make([][]int, len(doc.Hosts)),
		bare: make([]control.VIP, len(doc.VIPs)), bareSum: make([][sha256.Size]byte, len(doc.VIPs)),
		vipOnce: make([]sync.Once, len(doc.VIPs)), vipText: make([][]byte, len(doc.VIPs))}
	for i := range doc.Hosts {
		for _, vm := range doc.Hosts[i].VMs {
			vs.owner[vniAddr{vm.VNI, vm.Address}] = i
		}
	}
	vs.shared = control.Document{
		Written:            doc.Written,
		HashSeed:           doc.HashSeed,
		MaglevMinTableSize: doc.MaglevMinTableSize,
		InfraPrefixes:      doc.InfraPrefixes,
		MuxPrefixes:        doc.MuxPrefixes,
		InboundNAT:         doc.InboundNAT,
	}
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		vs.addrs = append(vs.addrs, v.Address)
		if v.InboundNAT != "" {
			// Its one backend stays: the parser makes the VIP from the
			// rule, whose targets every view names.
			vs.shared.VIPs = append(vs.shared.VIPs, *v)
			continue
		}
		vs.bare[i] = *v
		vs.bare[i].Backends = nil
		for j := range v.Backends {
			if h, ok := vs.owner[vniAddr{v.VNI, v.Backends[j].Address}]; ok {
				vs.backends[h] = append(vs.backends[h], [2]int{i, j})
				if n := len(vs.vips[h]); n == 0 || vs.vips[h][n-1] != i {
					vs.vips[h] = append(vs.vips[h], i)
				}
			}
		}
	}
	slices.SortFunc(vs.addrs, netip.Addr.Compare)
	vs.addrs = slices.Compact(vs.addrs)
	parallel(len(doc.VIPs), func(i int) {
		if doc.VIPs[i].InboundNAT == "" {
			b, err := json.Marshal(&vs.bare[i])
			if err != nil {
				panic(fmt.Sprintf("fleet: a document that does not encode: %v", err)) // every field of a Document encodes
			}
			vs.bareSum[i] = sha256.Sum256(b)
		}
	})
	for _, r := range doc.InboundNAT {
		for _, a := range r.Targets {
			vs.natVMs[vniAddr{r.VNI, a}] = true
		}
	}
	for i, ob := range doc.Outbound {
		for _, a := range ob.DIPs {
			if h, ok := vs.owner[vniAddr{ob.VNI, a}]; ok && !slices.Contains(vs.outbound[h], i) {
				vs.outbound[h] = append(vs.outbound[h], i)
			}
		}
	}
	b, err := json.Marshal(&vs.shared)
	if err != nil {
		panic(fmt.Sprintf("fleet: a document that does not encode: %v", err)) // every field of a Document encodes
	}
	vs.sharedSum = sha256.Sum256(b)
	return vs
}

// hosts returns the hosts entries of host hi's view: its own whole, the
// others' with only the VMs named (the inbound NAT rules' targets, the
// DIPs of outbound sections obs), in document order.
func (vs *views) hosts(hi int, obs []int) []control.Host {
	named := maps.Clone(vs.natVMs)
	for _, i := range obs {
		ob := &vs.doc.Outbound[i]
		for _, a := range ob.DIPs {
			named[vniAddr{ob.VNI, a}] = true
		}
	}
	var idx []int
	for k := range named {
		if h, ok := vs.owner[k]; ok && h != hi {
			idx = append(idx, h)
		}
	}
	idx = append(idx, hi)
	slices.Sort(idx)
	idx = slices.Compact(idx)
	out := make([]control.Host, 0, len(idx))
	for _, i := range idx {
		h := vs.doc.Hosts[i]
		if i == hi {
			h.VMs = slices.Clone(h.VMs)
		} else {
			h.VMs = slices.DeleteFunc(slices.Clone(h.VMs), func(vm control.VM) bool { return !named[vniAddr{vm.VNI, vm.Address}] })
		}
		out = append(out, h)
	}
	return out
}

// view returns host hi's view (see HostView).
func (vs *views) view(hi int) *control.Document {
	d := vs.doc
	v := vs.shared
	v.Version = d.Version
	v.InfraPrefixes, v.MuxPrefixes, v.InboundNAT = slices.Clone(v.InfraPrefixes), slices.Clone(v.MuxPrefixes), slices.Clone(v.InboundNAT)
	for i := range v.InboundNAT {
		v.InboundNAT[i].Targets = slices.Clone(v.InboundNAT[i].Targets)
	}
	// The host's VIPs in document order, then the inbound NAT rules'
	// (as the parser orders them).
	v.VIPs = make([]control.VIP, 0, len(vs.vips[hi])+len(vs.shared.VIPs))
	at := make(map[int]int, len(vs.vips[hi])) // doc.VIPs index → v.VIPs index
	for _, i := range vs.vips[hi] {
		at[i] = len(v.VIPs)
		v.VIPs = append(v.VIPs, vs.bare[i])
	}
	v.VIPs = append(v.VIPs, vs.shared.VIPs...)
	for i := range v.VIPs {
		vip := &v.VIPs[i]
		vip.Backends = slices.Clone(vip.Backends)
		if vip.Probe != nil {
			p := *vip.Probe
			vip.Probe = &p
		}
	}
	for _, r := range vs.backends[hi] {
		vip := &v.VIPs[at[r[0]]]
		vip.Backends = append(vip.Backends, d.VIPs[r[0]].Backends[r[1]])
	}
	v.VIPAddresses = slices.Clone(vs.addrs)
	for _, i := range vs.outbound[hi] {
		ob := d.Outbound[i]
		ob.DIPs, ob.Pool, ob.Static, ob.Local = slices.Clone(ob.DIPs), slices.Clone(ob.Pool), slices.Clone(ob.Static), slices.Clone(ob.Local)
		v.Outbound = append(v.Outbound, ob)
	}
	v.Hosts = vs.hosts(hi, vs.outbound[hi])
	return &v
}

// text returns host hi's view as a document's text, without its
// VIPAddresses (stored once for every view: addrsText): each VIP's text
// without backends is encoded once, by the first view written that lists
// it (views are written on every core), and copied into the others that
// do, followed by the host's backends (MarshalVIPs): an apply that
// changes a thousand views encodes each VIP once, one that changes a
// view encodes only its VIPs.
func (vs *views) text(hi int) ([]byte, error) {
	v := vs.view(hi)
	v.VIPAddresses = nil
	// The host's VIPs come first, in vs.vips[hi]'s order; an inbound NAT
	// rule's VIP is written under inbound_nat.
	own := vs.vips[hi]
	return v.MarshalVIPs(func(i int) []byte {
		if i >= len(own) {
			return nil
		}
		j := own[i]
		vs.vipOnce[j].Do(func() {
			vs.vipText[j], _ = control.MarshalVIP(&vs.bare[j]) // on error nil: MarshalVIPs encodes it and reports it
		})
		return vs.vipText[j]
	})
}

// addrsText is the text every view's ends with: its VIPAddresses
// (control.MarshalVIPAddresses), nil when the document has no VIP.
func (vs *views) addrsText() ([]byte, error) {
	if len(vs.addrs) == 0 {
		return nil, nil
	}
	return control.MarshalVIPAddresses(vs.addrs)
}

// sum is a digest of host hi's view, its version and VIPAddresses left
// out (stored apart: addrsText): two documents give a host's view the
// same sum when its view says the same in both, whatever their versions
// (what Apply compares to leave a view as it is).
func (vs *views) sum(hi int) [sha256.Size]byte {
	d := vs.doc
	type backend struct {
		VIP int
		B   control.Backend
	}
	own := struct {
		VIPs     [][sha256.Size]byte
		Backends []backend
		Outbound []control.Outbound
		Hosts    []control.Host
	}{Hosts: vs.hosts(hi, vs.outbound[hi])}
	for _, i := range vs.vips[hi] {
		own.VIPs = append(own.VIPs, vs.bareSum[i])
	}
	// A backend names its VIP by its place in the view, not in the
	// document: a VIP inserted elsewhere leaves the view's sum as it is.
	at := -1
	for k, r := range vs.backends[hi] {
		if k == 0 || r[0] != vs.backends[hi][k-1][0] {
			at++
		}
		own.Backends = append(own.Backends, backend{at, d.VIPs[r[0]].Backends[r[1]]})
	}
	for _, i := range vs.outbound[hi] {
		own.Outbound = append(own.Outbound, d.Outbound[i])
	}
	b, err := json.Marshal(&own)
	if err != nil {
		panic(fmt.Sprintf("fleet: a document that does not encode: %v", err))
	}
	h := sha256.New()
	h.Write(vs.sharedSum[:])
	h.Write(b)
	var s [sha256.Size]byte
	h.Sum(s[:0])
	return s
}
