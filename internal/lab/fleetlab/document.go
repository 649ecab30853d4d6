package fleetlab

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/health"
)

// Values every lab document and router share.
const (
	// HashSeed is the flow hash seed of every lab document.
	HashSeed = 0x5eed1234
	// RouterASN is the router's AS number (BIRD's local AS).
	RouterASN = 65000
	// MuxASN is the AS number of every Mux.
	MuxASN = 65010
)

// VM is one backend of a lab: a VM namespace behind a VM port of its host
// (WireVM), or, with Port "", an address on the host itself.
type VM struct {
	// Name names the VM's namespace and its backend, and is what its
	// servers answer (ServeVM).
	Name string
	// Host is the VM's host, numbered from 1 (Doc.Hosts[Host-1]).
	Host int
	// Port is the VM's port on the host, a Linux interface name; "" for
	// a DIP that is no VM port (it is left out of the hosts section).
	Port string
	// Addr is the DIP.
	Addr netip.Addr
	// MAC is the VM's MAC address: the inner destination of what the Muxes
	// send it.
	MAC net.HardwareAddr
	// Weight is the VM's weight in every pool; 0 means
	// control.DefaultWeight (a lab never drains a VM through its weight).
	Weight uint32
}

// Service is one VIP of a lab document, served by every VM of the pool,
// or by those Backends names.
type Service struct {
	Name  string
	Addr  netip.Addr // the VIP
	Proto uint8      // flow.ProtoTCP or flow.ProtoUDP
	Port  uint16     // the VIP port
	VNI   uint32
	// DIPPort is the backends' port; 0 keeps the packet's port.
	DIPPort uint16
	// Probe is the backends' health check, with every field set (as
	// control.Parse would fill it in); nil for none.
	Probe *health.Spec
	// Backends, when set, names the VMs of the pool (Doc.Pool, or
	// Doc.Pool6 for an IPv6 VIP) that serve the service (listed in pool
	// order whatever the order here; Document panics on a name not in
	// the pool); nil: every VM of the pool. The hosts section lists every VM of the
	// pool either way.
	Backends []string
}

// Host is one physical host of a lab document.
type Host struct {
	Name string
	Addr netip.Addr // where the Muxes send VXLAN
	// NoAgent marks a host that runs no Host Agent (KernelVXLAN): the
	// hosts section leaves it out, and its backends keep the packet's
	// port (port 0), since nothing on the host translates it.
	NoAgent bool
}

// Doc describes one version of a lab's desired-state document. Document
// turns it into the control.Document a node would parse, so what a test
// computes from it (flow.Rules, Rule.Pick) is what the nodes run.
type Doc struct {
	// Version is the document version, at least 1.
	Version uint64
	// Node is node.name; "" for none (the Host Agents' copy).
	Node string
	// BGP is a Mux's BGP section (see MuxBGP), or a fleet document's
	// fleet-wide one (FleetShared); nil for none.
	BGP *control.BGP
	// Nodes is a fleet document's nodes section (FleetShared).
	Nodes []control.NodeConfig
	// InboundNAT are inbound NAT rules, written to the document as they
	// are (their one-port VIPs appear when a node parses it, not in
	// Document's VIPs).
	InboundNAT []control.InboundNAT
	// Infra are the infrastructure prefixes (never NATed).
	Infra []netip.Prefix
	// MuxPrefixes are where the Muxes send VXLAN from (mux_prefixes):
	// Host Agents accept tunnel traffic from nothing else, and refuse a
	// document without them.
	MuxPrefixes []netip.Prefix
	// Services are the VIPs, each served by the whole Pool or by its
	// Backends.
	Services []Service
	// Pool are the backends of every service and, on their hosts, the VM
	// ports.
	Pool []VM
	// Pool6 are the backends of the services with an IPv6 VIP (Pool
	// serves the others): the IPv6 addresses of VMs, usually Pool's
	// (FleetVMs6) on the same ports and MACs — the hosts section lists
	// such a VM once per family.
	Pool6 []VM
	// Hosts are the physical hosts; VM.Host numbers them from 1.
	Hosts []Host
	// Outbound are outbound sections, written as they are except that an
	// empty Pool is computed as the parser does (the ports 1024-65535
	// without the address's inbound ports: its services' and inbound NAT
	// rules'), and a zero Unit is control.DefaultOutboundUnit.
	Outbound []control.Outbound
	// OmitHosts leaves the hosts section out (the Muxes need only the
	// backends' host addresses).
	OmitHosts bool
}

// Document returns d as a control.Document with every default resolved,
// so that control.Parse(Marshal(Document())) gives it back. It panics if a
// VM names a host that Hosts does not have, or a service's Backends a VM
// its pool does not have.
func (d *Doc) Document() *control.Document {
	doc := &control.Document{
		Version:       d.Version,
		HashSeed:      HashSeed,
		Node:          control.Node{Name: d.Node},
		InfraPrefixes: d.Infra,
		MuxPrefixes:   d.MuxPrefixes,
		BGP:           d.BGP,
		Nodes:         d.Nodes,
		InboundNAT:    d.InboundNAT,
	}
	for _, s := range d.Services {
		v := control.VIP{Name: s.Name, Address: s.Addr, Protocol: s.Proto, Port: s.Port, VNI: s.VNI, Probe: s.Probe}
		pool := d.Pool
		if s.Addr.Is6() {
			pool = d.Pool6
		}
		for _, name := range s.Backends {
			if !slices.ContainsFunc(pool, func(vm VM) bool { return vm.Name == name }) {
				panic(fmt.Sprintf("fleetlab: service %s names backend %q, not a VM of its pool", s.Name, name))
			}
		}
		for _, vm := range pool {
			if s.Backends != nil && !slices.Contains(s.Backends, vm.Name) {
				continue
			}
			w := vm.Weight
			if w == 0 {
				w = control.DefaultWeight
			}
			port := s.DIPPort
			if d.Hosts[vm.Host-1].NoAgent {
				port = 0
			}
			v.Backends = append(v.Backends, control.Backend{Name: vm.Name, Address: vm.Addr, Port: port,
				MAC: [6]byte(vm.MAC), Host: d.Hosts[vm.Host-1].Addr, Weight: w})
		}
		doc.VIPs = append(doc.VIPs, v)
	}
	for _, ob := range d.Outbound {
		if ob.Unit == 0 {
			ob.Unit = control.DefaultOutboundUnit
		}
		if ob.Pool == nil {
			ob.Pool = control.OutboundPool(control.PortRange{First: 1024, Last: 65535}, ob.Unit, d.inboundPorts(ob.Address))
		}
		doc.Outbound = append(doc.Outbound, ob)
	}
	if d.OmitHosts {
		return doc
	}
	for j, h := range d.Hosts {
		if h.NoAgent {
			continue
		}
		host := control.Host{Name: h.Name, Address: h.Addr, VXLANPort: control.DefaultVXLANPort}
		for _, vm := range slices.Concat(d.Pool, d.Pool6) {
			if vm.Host != j+1 || vm.Port == "" {
				continue
			}
			for _, s := range uniqueVNIs(d.Services) {
				host.VMs = append(host.VMs, control.VM{VNI: s, Address: vm.Addr, MAC: [6]byte(vm.MAC), Interface: vm.Port})
			}
		}
		doc.Hosts = append(doc.Hosts, host)
	}
	return doc
}

// inboundPorts are the ports addr serves inbound: its services' and its
// inbound NAT rules'.
func (d *Doc) inboundPorts(addr netip.Addr) []uint16 {
	var ps []uint16
	for _, s := range d.Services {
		if s.Addr == addr {
			ps = append(ps, s.Port)
		}
	}
	for _, r := range d.InboundNAT {
		for p := int(r.FirstPort); r.Address == addr && p <= int(r.LastPort); p++ {
			ps = append(ps, uint16(p))
		}
	}
	return ps
}

// Marshal returns the document's YAML text (control.Document.Marshal).
func (d *Doc) Marshal() ([]byte, error) { return d.Document().Marshal() }

// uniqueVNIs returns the services' VNIs, each once, in order.
func uniqueVNIs(svcs []Service) []uint32 {
	var out []uint32
	for _, s := range svcs {
		seen := false
		for _, v := range out {
			seen = seen || v == s.VNI
		}
		if !seen {
			out = append(out, s.VNI)
		}
	}
	return out
}

// MuxBGP is the BGP section of a Mux at addr (also its router id) peering
// with the router at peer: AS MuxASN to RouterASN, hold time 9 s, 1 s of
// forwarding after a withdrawal, sessions on port 179 both ways.
func MuxBGP(addr, peer netip.Addr) *control.BGP {
	return &control.BGP{
		ASN:           MuxASN,
		RouterID:      addr,
		ListenPort:    control.DefaultListenPort,
		HoldTime:      9 * time.Second,
		WithdrawGrace: time.Second,
		Peers:         []control.Peer{{Address: peer, ASN: RouterASN, Port: control.DefaultListenPort}},
	}
}

// SubnetAddr returns 198.18.subnet.host, an address of Star.Attach's
// subnet: host 1 is the router's end, host 2 the node's.
func SubnetAddr(subnet, host int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 18, byte(subnet), byte(host)})
}

// WriteDocument writes d's YAML to path, sealed (control.Seal), replacing
// the file atomically (a temporary file renamed over it), so a node
// watching the file never reads half a document; the seal would refuse
// one anyway.
func WriteDocument(path string, d *Doc) error {
	b, err := d.Marshal()
	if err != nil {
		return err
	}
	b = control.Seal(b)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
