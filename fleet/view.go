package fleet

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

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
	type vniAddr struct {
		vni  uint32
		addr netip.Addr
	}
	local := map[vniAddr]bool{}
	for _, vm := range doc.Hosts[hi].VMs {
		local[vniAddr{vm.VNI, vm.Address}] = true
	}
	v := &control.Document{
		Version:            doc.Version,
		Written:            doc.Written,
		HashSeed:           doc.HashSeed,
		MaglevMinTableSize: doc.MaglevMinTableSize,
		InfraPrefixes:      slices.Clone(doc.InfraPrefixes),
		MuxPrefixes:        slices.Clone(doc.MuxPrefixes),
		InboundNAT:         slices.Clone(doc.InboundNAT),
	}
	// VMs of other hosts that the view's sections name.
	named := map[vniAddr]bool{}
	v.VIPs = make([]control.VIP, len(doc.VIPs))
	for i := range doc.VIPs {
		src := &doc.VIPs[i]
		vip := *src
		vip.Backends = nil
		if src.Probe != nil {
			p := *src.Probe
			vip.Probe = &p
		}
		for _, b := range src.Backends {
			// An inbound NAT rule's VIP keeps its one backend: the
			// parser makes it from the rule, whose targets stay named.
			if src.InboundNAT != "" || local[vniAddr{src.VNI, b.Address}] {
				vip.Backends = append(vip.Backends, b)
			}
		}
		v.VIPs[i] = vip
	}
	for i := range v.InboundNAT {
		r := &v.InboundNAT[i]
		r.Targets = slices.Clone(r.Targets)
		for _, a := range r.Targets {
			named[vniAddr{r.VNI, a}] = true
		}
	}
	for _, ob := range doc.Outbound {
		if !slices.ContainsFunc(ob.DIPs, func(a netip.Addr) bool { return local[vniAddr{ob.VNI, a}] }) {
			continue
		}
		ob.DIPs, ob.Pool, ob.Static = slices.Clone(ob.DIPs), slices.Clone(ob.Pool), slices.Clone(ob.Static)
		for _, a := range ob.DIPs {
			named[vniAddr{ob.VNI, a}] = true
		}
		v.Outbound = append(v.Outbound, ob)
	}
	for i, h := range doc.Hosts {
		if i == hi {
			h.VMs = slices.Clone(h.VMs)
			v.Hosts = append(v.Hosts, h)
			continue
		}
		var vms []control.VM
		for _, vm := range h.VMs {
			if named[vniAddr{vm.VNI, vm.Address}] {
				vms = append(vms, vm)
			}
		}
		if len(vms) > 0 {
			h.VMs = vms
			v.Hosts = append(v.Hosts, h)
		}
	}
	return v, nil
}

// hostViews returns every host's view of doc, marshalled, by host name.
func hostViews(doc *control.Document) (map[string][]byte, error) {
	out := make(map[string][]byte, len(doc.Hosts))
	for _, h := range doc.Hosts {
		v, err := HostView(doc, h.Name)
		if err != nil {
			return nil, err
		}
		text, err := v.Marshal()
		if err != nil {
			return nil, fmt.Errorf("fleet: view of host %q: %w", h.Name, err)
		}
		out[h.Name] = text
	}
	return out, nil
}
