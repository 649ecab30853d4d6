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
//   - every VIP, with only the backends that are VMs of the host (same
//     VNI and address): the Host Agent translates for its own DIPs, and
//     its client filters need every VIP's address (a VIP whose backends
//     are all elsewhere is kept with none);
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
// OutboundDIPs(doc, host) gives, and the VIP addresses are doc's.
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
	// shared is what every view holds: the fleet-wide settings, every VIP
	// without its backends (an inbound NAT rule's VIP with its one), the
	// inbound NAT rules; Version 0.
	shared    control.Document
	sharedSum [sha256.Size]byte
	// Per host (an index into doc.Hosts): its backends, as (VIP,
	// backend) indexes in document order; the outbound sections listing
	// one of its DIPs.
	backends [][][2]int
	outbound [][]int
	owner    map[vniAddr]int // a VM's host
	natVMs   map[vniAddr]bool
	// vipText is each shared VIP's text (control.MarshalVIP), made once
	// by text.
	vipTextOnce sync.Once
	vipText     [][]byte
	vipTextErr  error
}

func newViews(doc *control.Document) *views {
	vs := &views{doc: doc, owner: map[vniAddr]int{}, natVMs: map[vniAddr]bool{},
		backends: make([][][2]int, len(doc.Hosts)), outbound: make([][]int, len(doc.Hosts))}
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
		VIPs:               make([]control.VIP, len(doc.VIPs)),
	}
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		vs.shared.VIPs[i] = *v
		if v.InboundNAT != "" {
			// Its one backend stays: the parser makes the VIP from the
			// rule, whose targets every view names.
			continue
		}
		vs.shared.VIPs[i].Backends = nil
		for j := range v.Backends {
			if h, ok := vs.owner[vniAddr{v.VNI, v.Backends[j].Address}]; ok {
				vs.backends[h] = append(vs.backends[h], [2]int{i, j})
			}
		}
	}
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
	v.VIPs = slices.Clone(v.VIPs)
	for i := range v.VIPs {
		vip := &v.VIPs[i]
		vip.Backends = slices.Clone(vip.Backends)
		if vip.Probe != nil {
			p := *vip.Probe
			vip.Probe = &p
		}
	}
	for _, r := range vs.backends[hi] {
		vip := &v.VIPs[r[0]]
		vip.Backends = append(vip.Backends, d.VIPs[r[0]].Backends[r[1]])
	}
	for _, i := range vs.outbound[hi] {
		ob := d.Outbound[i]
		ob.DIPs, ob.Pool, ob.Static, ob.Local = slices.Clone(ob.DIPs), slices.Clone(ob.Pool), slices.Clone(ob.Static), slices.Clone(ob.Local)
		v.Outbound = append(v.Outbound, ob)
	}
	v.Hosts = vs.hosts(hi, vs.outbound[hi])
	return &v
}

// text returns host hi's view as a document's text: the VIPs, without
// backends the same in every view, are encoded once (the first call
// encodes them all, on every core) and copied into each view, followed
// by the host's backends (MarshalVIPs): encoding a thousand views whole
// was most of an apply that changed them all (a VIP added).
func (vs *views) text(hi int) ([]byte, error) {
	vs.vipTextOnce.Do(func() {
		vs.vipText = make([][]byte, len(vs.shared.VIPs))
		errs := make([]error, len(vs.shared.VIPs))
		parallel(len(vs.vipText), func(i int) {
			if vs.shared.VIPs[i].InboundNAT == "" {
				vs.vipText[i], errs[i] = control.MarshalVIP(&vs.shared.VIPs[i])
			}
		})
		vs.vipTextErr = errors.Join(errs...)
	})
	if vs.vipTextErr != nil {
		return nil, vs.vipTextErr
	}
	// The shared VIPs have no backends (an inbound NAT rule's VIP, which
	// keeps its one, is written under inbound_nat): MarshalVIPs appends
	// the host's.
	return vs.view(hi).MarshalVIPs(func(i int) []byte { return vs.vipText[i] })
}

// sum is a digest of host hi's view, its version left out: two documents
// give a host's view the same sum when its view says the same in both,
// whatever their versions (what Apply compares to leave a view as it is).
func (vs *views) sum(hi int) [sha256.Size]byte {
	d := vs.doc
	type backend struct {
		VIP int
		B   control.Backend
	}
	own := struct {
		Backends []backend
		Outbound []control.Outbound
		Hosts    []control.Host
	}{Hosts: vs.hosts(hi, vs.outbound[hi])}
	for _, r := range vs.backends[hi] {
		own.Backends = append(own.Backends, backend{r[0], d.VIPs[r[0]].Backends[r[1]]})
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
