package hostagent

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/nat"
)

// UplinkPort is the worker port index of the uplink; VM ports follow it in
// Plan.Ports order (VMPort.Index).
const UplinkPort = 0

// Plan is one document seen from one host: what that host's Host Agent
// runs. It is a plain value computed without privileges by NewPlan, so
// what an agent would do with a document can be printed and tested.
//
// Its parts fall in two groups. The structure — the host's address and
// VXLAN port, the VM ports with their VNIs, the infrastructure prefixes,
// the tunnel sources — shapes the data path (sockets, workers, pipelines,
// the NAT stages' infrastructure filter, the Decap stage's sources); a document that changes it makes the agent
// rebuild its data path. The contents — endpoints, DIPs, steering rules and
// the VIP rules (flow.Rules, kept by the agent) — are swapped live.
type Plan struct {
	// Version is the document's version.
	Version uint64
	// Host is this host's entry of Document.Hosts (VMs included).
	Host control.Host
	// Ports are the host's VM ports, one per distinct VMs[].Interface,
	// sorted by interface name.
	Ports []VMPort
	// Endpoints are the VMs for the Decap stage: (VNI, MAC) → VM port,
	// in document order. A dual-stack VM, listed once per address family
	// with the same MAC and interface, is one endpoint with both
	// addresses (in document order).
	Endpoints []encap.Endpoint
	// DIPs are the VMs' addresses for the NAT stages.
	DIPs []nat.DIP
	// Infra are the prefixes whose traffic is never translated: the
	// document's infra_prefixes, the host's own address and
	// Config.Infra. Replies from a DIP to them go to the kernel.
	Infra []netip.Prefix
	// TunnelSources are the prefixes VXLAN is accepted from (the Muxes):
	// the document's mux_prefixes, or Config.TunnelSources when set (the
	// agent's apply refuses a plan without any). Other VXLAN is dropped
	// as bad_tunnel_source.
	TunnelSources []netip.Prefix
	// Uplink is the uplink steering program's configuration: VXLAN to the
	// host's address and VXLAN port.
	Uplink steer.Config
	// Probes are the host's DIPs that the agent probes when it reports
	// health (Config.OnDIPHealth): see DIPProbe.
	Probes []DIPProbe
	// Outbound are the document's outbound sections that name VMs of
	// this host, each with only those DIPs: the source NAT's
	// configuration (nat.SNAT.SetOutbound). Their DIPs' VM ports steer
	// all their packets to the data path (a source rule of any port).
	Outbound []nat.Outbound
	// OutboundStatic are the document's static ranges of those DIPs, as
	// allocations owned by this host: always in force, the ranges the
	// agent is given (Agent.SetOutboundAllocations) are added to them.
	OutboundStatic []flow.PortAllocation
}

// outboundVeto are destinations whose packets a VM port with outbound
// DIPs never steers, on top of the infrastructure prefixes: multicast,
// the limited broadcast and link-local addresses, which no source NAT
// translates and the data path's guard would drop (their traffic goes to
// the host's kernel, as before the DIPs were outbound).
var outboundVeto = []netip.Prefix{
	netip.MustParsePrefix("224.0.0.0/4"), netip.MustParsePrefix("255.255.255.255/32"),
	netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("ff00::/8"), netip.MustParsePrefix("fe80::/10"),
}

// DIPProbe is one DIP of this host to probe: a VM on the host that is a
// backend of a VIP with a probe, probed through its VM port. A DIP that
// backs several probed VIPs on the same probe port is probed once, with
// the probe of the first of those VIPs in the document.
type DIPProbe struct {
	// VNI, Addr and Port name the DIP and the port probed (the probe's
	// port, else the backend's, else the VIP's): health.VerdictKey.
	VNI  uint32
	Addr netip.Addr
	Port uint16
	// Interface is the DIP's VM port: probes leave through it.
	Interface string
	// Spec is the probe, defaults applied.
	Spec health.Spec
	// VIP and Backend name the first VIP and backend the probe comes
	// from (for logs).
	VIP, Backend string
}

// Key is the probe's health.VerdictKey.
func (p DIPProbe) Key() health.VerdictKey {
	return health.VerdictKey{VNI: p.VNI, Addr: p.Addr, Port: p.Port}
}

// targetKey is the probe's health.Target key: "INTERFACE/VNI/ADDR:PORT".
// Interface names hold no '/', so the prober finds the interface in it
// (health.TargetKey); a DIP that moves to another port is a new target.
func (p DIPProbe) targetKey() string {
	return fmt.Sprintf("%s/%d/%v", p.Interface, p.VNI, netip.AddrPortFrom(p.Addr, p.Port))
}

// VMPort is one VM port of the host: a Linux interface that VMs (DIPs)
// of one tenant network sit behind.
type VMPort struct {
	// Interface is the port's interface name on the host.
	Interface string
	// VNI is the tenant network of every VM on the port: frames the port
	// receives are parsed with it (flow.Key.VNI).
	VNI uint32
	// Index is the port's index in every worker's port list.
	Index uint16
	// Steer is the port's steering program configuration: the DIP
	// endpoints (address, DIP port) that serve a VIP, whose replies the
	// Return stage translates, vetoed by the infrastructure prefixes.
	Steer steer.Config
}

// ErrHostNotFound is returned (wrapped) by NewPlan when the document does
// not list the host.
var ErrHostNotFound = errors.New("hostagent: host not in the document")

// NewPlan returns the plan of the host named host — a Document.Hosts
// name or address — for doc; extraInfra are prefixes added to the
// document's infrastructure prefixes. It refuses a document that does not
// list the host, that puts VMs of two VNIs on one interface, that lists a
// (VNI, MAC) on two interfaces or with two addresses of one family, or
// whose VMs the data path cannot index (encap.NewEndpoints, nat.NewDIPs).
func NewPlan(doc *control.Document, host string, extraInfra []netip.Prefix) (*Plan, error) {
	h, ok := doc.Host(host)
	if !ok {
		return nil, fmt.Errorf("%w: %q (version %d lists %d hosts)", ErrHostNotFound, host, doc.Version, len(doc.Hosts))
	}
	p := &Plan{Version: doc.Version, Host: *h}
	p.Host.VMs = slices.Clone(h.VMs)

	// VM ports, sorted by name, one VNI each.
	byName := map[string]int{}
	for _, vm := range h.VMs {
		if _, ok := byName[vm.Interface]; !ok {
			byName[vm.Interface] = 0
			p.Ports = append(p.Ports, VMPort{Interface: vm.Interface, VNI: vm.VNI})
		}
	}
	slices.SortFunc(p.Ports, func(a, b VMPort) int {
		switch {
		case a.Interface < b.Interface:
			return -1
		case a.Interface > b.Interface:
			return 1
		}
		return 0
	})
	if len(p.Ports) > 1<<16-2 {
		return nil, fmt.Errorf("hostagent: host %q has %d VM ports, more than a worker can hold", h.Name, len(p.Ports))
	}
	for i := range p.Ports {
		p.Ports[i].Index = uint16(UplinkPort + 1 + i)
		byName[p.Ports[i].Interface] = i
	}
	type vniMAC struct {
		vni uint32
		mac [6]byte
	}
	byMAC := map[vniMAC]int{} // endpoint index
	var first []int           // per endpoint: its first VM in h.VMs
	for j, vm := range h.VMs {
		vp := &p.Ports[byName[vm.Interface]]
		if vm.VNI != vp.VNI {
			return nil, fmt.Errorf("hostagent: host %q: interface %s has VMs in VNI %d and VNI %d; "+
				"a VM port belongs to one tenant network", h.Name, vm.Interface, vp.VNI, vm.VNI)
		}
		p.DIPs = append(p.DIPs, nat.DIP{VNI: vm.VNI, Addr: vm.Address})
		// A dual-stack VM is listed once per address family with the
		// same MAC and interface: one endpoint with both addresses.
		k := vniMAC{vm.VNI, vm.MAC}
		if i, ok := byMAC[k]; ok {
			e := &p.Endpoints[i]
			prev := p.Host.VMs[first[i]]
			if prev.Interface != vm.Interface {
				return nil, fmt.Errorf("hostagent: host %q: VNI %d MAC %v is on interface %s (%v) and on interface %s (%v); "+
					"a MAC names one VM port", h.Name, vm.VNI, header.MAC(vm.MAC), prev.Interface, prev.Address, vm.Interface, vm.Address)
			}
			for _, a := range e.Addrs {
				if a.Unmap().Is4() == vm.Address.Unmap().Is4() {
					return nil, fmt.Errorf("hostagent: host %q: VNI %d MAC %v on interface %s has %v and %v; "+
						"a VM has at most one address per family", h.Name, vm.VNI, header.MAC(vm.MAC), vm.Interface, a, vm.Address)
				}
			}
			e.Addrs = append(e.Addrs, vm.Address)
			e.Name += "," + vm.Address.String()
			continue
		}
		byMAC[k] = len(p.Endpoints)
		first = append(first, j)
		p.Endpoints = append(p.Endpoints, encap.Endpoint{VNI: vm.VNI, MAC: header.MAC(vm.MAC),
			Addrs: []netip.Addr{vm.Address}, OutPort: vp.Index, Name: vm.Interface + "/" + vm.Address.String()})
	}
	if _, err := encap.NewEndpoints(p.Endpoints); err != nil {
		return nil, fmt.Errorf("hostagent: host %q: %w", h.Name, err)
	}
	if _, err := nat.NewDIPs(p.DIPs); err != nil {
		return nil, fmt.Errorf("hostagent: host %q: %w", h.Name, err)
	}

	// Infrastructure: the document's, the host itself, the caller's.
	infra := slices.Clone(doc.InfraPrefixes)
	infra = append(infra, netip.PrefixFrom(h.Address, h.Address.BitLen()))
	for _, pf := range extraInfra {
		if !pf.IsValid() {
			return nil, fmt.Errorf("hostagent: invalid infrastructure prefix %v", pf)
		}
		infra = append(infra, pf.Masked())
	}
	slices.SortFunc(infra, comparePrefix)
	p.Infra = slices.Compact(infra)
	p.TunnelSources = slices.Clone(doc.MuxPrefixes)

	// Steering: which DIP endpoints serve a VIP. A backend port of 0
	// keeps the VIP port; an all-ports VIP with such a backend serves
	// every port of the DIP (port 0 in the rule).
	type vniAddr = vmKey
	portOf := map[vniAddr]int{}
	for _, vm := range h.VMs {
		portOf[vniAddr{vm.VNI, vm.Address}] = byName[vm.Interface]
	}
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		for j := range v.Backends {
			b := &v.Backends[j]
			k, ok := portOf[vniAddr{v.VNI, b.Address}]
			if !ok {
				continue
			}
			port := b.Port
			if port == 0 {
				port = v.Port
			}
			vp := &p.Ports[k]
			vp.Steer.Src = append(vp.Steer.Src, steer.SrcRule{Addr: b.Address, Port: port})
		}
	}
	p.Probes = probesOf(doc, h, byName)
	outPorts := p.outbound(doc, portOf)
	for i := range p.Ports {
		vp := &p.Ports[i]
		vp.Steer.Infra = p.Infra
		if outPorts[i] {
			vp.Steer.Infra = append(slices.Clone(p.Infra), outboundVeto...)
		}
		if err := vp.Steer.Validate(); err != nil {
			return nil, fmt.Errorf("hostagent: host %q: interface %s: %w", h.Name, vp.Interface, err)
		}
		vp.Steer = vp.Steer.Normalize()
	}
	p.Uplink = steer.Config{VXLAN: []steer.VXLANRule{{Local: h.Address, Port: h.VXLANPort}}}
	if err := p.Uplink.Validate(); err != nil {
		return nil, fmt.Errorf("hostagent: host %q: %w", h.Name, err)
	}
	p.Uplink = p.Uplink.Normalize()
	return p, nil
}

// outbound fills p.Outbound and p.OutboundStatic from doc's outbound
// sections, adds a source rule of any port for each outbound DIP to its
// VM port's steering, and reports which ports (by index) have one.
// portOf maps the host's VMs (VNI, address) to their port index.
func (p *Plan) outbound(doc *control.Document, portOf map[vmKey]int) map[int]bool {
	macOf := map[vmKey][6]byte{}
	for _, vm := range p.Host.VMs {
		macOf[vmKey{vm.VNI, vm.Address}] = vm.MAC
	}
	ports := map[int]bool{}
	for i := range doc.Outbound {
		ob := &doc.Outbound[i]
		sec := nat.Outbound{VIP: ob.Address, VNI: ob.VNI, Local: slices.Clone(ob.Local)}
		for _, d := range ob.DIPs {
			k, ok := portOf[vmKey{ob.VNI, d}]
			if !ok {
				continue
			}
			sec.DIPs = append(sec.DIPs, d)
			ports[k] = true
			vp := &p.Ports[k]
			vp.Steer.Src = append(vp.Steer.Src, steer.SrcRule{Addr: d, Port: 0})
			for _, st := range ob.Static {
				if st.DIP == d {
					p.OutboundStatic = append(p.OutboundStatic, flow.PortAllocation{VIP: ob.Address, First: st.Ports.First, Last: st.Ports.Last,
						Owner: flow.PortOwner{DIP: d, Host: p.Host.Address, VNI: ob.VNI, MAC: macOf[vmKey{ob.VNI, d}]}})
				}
			}
		}
		if len(sec.DIPs) > 0 {
			p.Outbound = append(p.Outbound, sec)
		}
	}
	return ports
}

// vmKey names a VM: its VNI and address.
type vmKey struct {
	vni  uint32
	addr netip.Addr
}

// probesOf lists the DIPs of host h to probe: the backends of VIPs with
// a probe that are VMs of h (same VNI and address), one per (VNI,
// address, probed port), in document order. byName maps a VM port's
// interface to its index.
func probesOf(doc *control.Document, h *control.Host, byName map[string]int) []DIPProbe {
	type vniAddr struct {
		vni  uint32
		addr netip.Addr
	}
	vms := map[vniAddr]string{} // → interface
	for _, vm := range h.VMs {
		vms[vniAddr{vm.VNI, vm.Address}] = vm.Interface
	}
	var out []DIPProbe
	seen := map[health.VerdictKey]bool{}
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		if v.Probe == nil {
			continue
		}
		spec := v.Probe.WithDefaults()
		for j := range v.Backends {
			b := &v.Backends[j]
			ifname, ok := vms[vniAddr{v.VNI, b.Address}]
			if !ok {
				continue
			}
			if _, ok := byName[ifname]; !ok {
				continue
			}
			port := spec.Port
			if port == 0 {
				port = b.Port
			}
			if port == 0 {
				port = v.Port
			}
			if port == 0 {
				continue // an all-ports VIP probed on no port: nothing to probe
			}
			dp := DIPProbe{VNI: v.VNI, Addr: b.Address, Port: port, Interface: ifname, Spec: spec, VIP: v.Name, Backend: b.Name}
			if seen[dp.Key()] {
				continue
			}
			seen[dp.Key()] = true
			out = append(out, dp)
		}
	}
	return out
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// SameStructure reports whether q can run on the data path built for p:
// the same host address and VXLAN port, the same VM ports with the same
// VNIs, the same infrastructure prefixes and tunnel sources. Otherwise the
// data path must be rebuilt.
func (p *Plan) SameStructure(q *Plan) bool {
	if p == nil || q == nil {
		return false
	}
	if p.Host.Address != q.Host.Address || p.Host.VXLANPort != q.Host.VXLANPort || !slices.Equal(p.Infra, q.Infra) ||
		!slices.Equal(p.TunnelSources, q.TunnelSources) {
		return false
	}
	return slices.EqualFunc(p.Ports, q.Ports, func(a, b VMPort) bool {
		return a.Interface == b.Interface && a.VNI == b.VNI && a.Index == b.Index
	})
}

// Port returns the VM port named ifname.
func (p *Plan) Port(ifname string) (*VMPort, bool) {
	for i := range p.Ports {
		if p.Ports[i].Interface == ifname {
			return &p.Ports[i], true
		}
	}
	return nil, false
}
