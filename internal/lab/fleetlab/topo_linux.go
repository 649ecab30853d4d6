package fleetlab

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// testRange is 198.18.0.0/15, every lab address.
var testRange = &net.IPNet{IP: net.IP{198, 18, 0, 0}, Mask: net.CIDRMask(15, 32)}

// Star is a topology with a router in the middle: every node is a
// namespace joined to the router by a veth pair of its own.
type Star struct {
	Lab    *netlab.Lab
	Router *netlab.NS
}

// NewStar makes the router namespace ("router"): it forwards, filters no
// reverse path, and hashes its ECMP routes on L4 (the 5-tuple,
// fib_multipath_hash_policy 1), so flows spread over the Muxes.
func NewStar(lab *netlab.Lab) (*Star, error) {
	r, err := lab.Namespace("router")
	if err != nil {
		return nil, err
	}
	for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.fib_multipath_hash_policy", "1"}} {
		if err := r.SetSysctl(kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	return &Star{Lab: lab, Router: r}, nil
}

// Attach makes a namespace called name and joins it to the router: a veth
// pair from rif in the router to "up" in the new namespace, on the subnet
// 198.18.<subnet>.0/24, the router at .1 (no reverse-path filter on rif)
// and the node at .2 (SubnetAddr), which routes all of 198.18.0.0/15 to
// the router.
func (s *Star) Attach(name, rif string, subnet int) (*netlab.NS, error) {
	n, err := s.Lab.Namespace(name)
	if err != nil {
		return nil, err
	}
	if _, _, err := s.Lab.Veth(s.Router, rif, n, "up"); err != nil {
		return nil, err
	}
	for _, err := range []error{
		s.Router.AddAddr(rif, SubnetAddr(subnet, 1).String()+"/24"),
		n.AddAddr("up", SubnetAddr(subnet, 2).String()+"/24"),
		n.AddRoute("198.18.0.0/15", SubnetAddr(subnet, 1).String()),
		s.Router.SetSysctl("net.ipv4.conf."+rif+".rp_filter", "0"),
	} {
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return n, nil
}

// Fleet is a running fleet topology, the lab's (BuildFleet):
//
//	client1 [up 198.18.11.2] ─ [c1 198.18.11.1] ┐
//	client2 [up 198.18.12.2] ─ [c2 198.18.12.1] ┤
//	mux1    [up 198.18.1.2]  ─ [m1 198.18.1.1]  ├ router (BIRD 2, or static ECMP routes)
//	mux2    [up 198.18.2.2]  ─ [m2 198.18.2.1]  ┤
//	host1   [up 198.18.21.2] ─ [h1 198.18.21.1] ┤   host1: vm1 ─ vm11 (198.18.31.1), vm2 ─ vm12 (198.18.31.2)
//	host2   [up 198.18.22.2] ─ [h2 198.18.22.1] ┘   host2: vm1 ─ vm21 (198.18.32.1), vm2 ─ vm22 (198.18.32.2)
//
// (with FleetVMs as the VMs). The router routes each host's VM subnet
// 198.18.3j.0/24 to host j, whose kernel forwards (the Muxes' probes reach
// the VMs that way); the VMs' next hop is FleetGateway, an address of
// their host-side veth that they resolve by ARP. The slices number the namespaces from 0 (Muxes[0] is mux1).
type Fleet struct {
	*Star
	Clients []*netlab.NS
	Muxes   []*netlab.NS
	Hosts   []*netlab.NS
	VMs     map[string]*netlab.NS // by VM name
}

// BuildFleet builds the fleet's topology with the given number of clients
// (client1 on subnet 11, client2 on 12, ...) and one namespace per VM of
// vms, wired to its host (WireVM, gateway FleetGateway). Every interface is
// as the kernel sets it up: checksum offload and TSO on, neighbours learnt
// by ARP (DisableOffloads shapes the traffic instead, for the variant that
// keeps the data path's complete-checksum case covered).
func BuildFleet(lab *netlab.Lab, clients int, vms []VM) (*Fleet, error) {
	s, err := NewStar(lab)
	if err != nil {
		return nil, err
	}
	f := &Fleet{Star: s, VMs: map[string]*netlab.NS{}}
	for k := 1; k <= clients; k++ {
		n, err := s.Attach(fmt.Sprintf("client%d", k), fmt.Sprintf("c%d", k), 10+k)
		if err != nil {
			return nil, err
		}
		f.Clients = append(f.Clients, n)
	}
	for i := 1; i <= FleetMuxes; i++ {
		n, err := s.Attach(fmt.Sprintf("mux%d", i), fmt.Sprintf("m%d", i), i)
		if err != nil {
			return nil, err
		}
		f.Muxes = append(f.Muxes, n)
	}
	for j := 1; j <= FleetHosts; j++ {
		n, err := s.Attach(fmt.Sprintf("host%d", j), fmt.Sprintf("h%d", j), 20+j)
		if err != nil {
			return nil, err
		}
		f.Hosts = append(f.Hosts, n)
		// The Muxes' probes reach the DIPs through the hosts' kernels.
		if err := n.SetSysctl("net.ipv4.ip_forward", "1"); err != nil {
			return nil, err
		}
		if err := s.Router.AddRoute(fmt.Sprintf("198.18.%d.0/24", 30+j), FleetHostAddr(j).String()); err != nil {
			return nil, err
		}
	}
	for _, vm := range vms {
		n, err := lab.Namespace(vm.Name)
		if err != nil {
			return nil, err
		}
		f.VMs[vm.Name] = n
		if err := WireVM(lab, f.Hosts[vm.Host-1], n, vm, FleetGateway); err != nil {
			return nil, fmt.Errorf("%s: %w", vm.Name, err)
		}
	}
	return f, nil
}

// WireVM connects the VM namespace n to its host like a guest's virtual
// NIC: a veth pair from the VM port vm.Port on the host to eth0 in n, which
// gets vm.MAC and the DIP vm.Addr/32, offloads as the kernel sets them. The
// host-side veth holds gw/32, and the VM routes everything in
// 198.18.0.0/15 through gw, which it resolves by ARP as a guest does; the
// host routes the DIP to the port and resolves it by ARP too. No neighbour
// entry is written by hand.
func WireVM(lab *netlab.Lab, host, n *netlab.NS, vm VM, gw netip.Addr) error {
	return wireVM(lab, host, n, vm, gw, true)
}

// WireTenantVM wires the VM namespace n to host as WireVM does, but
// without the host's route to vm.Addr: for a VM whose address another
// tenant's VM on the same host has (wired with WireVM, so the host routes
// the address there). Nothing the host's kernel routes reaches this VM;
// a socket bound to its VM port does (a Host Agent's probes), and so does
// what a Host Agent delivers on the port.
func WireTenantVM(lab *netlab.Lab, host, n *netlab.NS, vm VM, gw netip.Addr) error {
	return wireVM(lab, host, n, vm, gw, false)
}

func wireVM(lab *netlab.Lab, host, n *netlab.NS, vm VM, gw netip.Addr, route bool) error {
	if err := netlab.CheckAddr(gw); err != nil {
		return err
	}
	gwIP := net.IP(gw.AsSlice())
	hostEnd, vmEnd, err := lab.Veth(host, vm.Port, n, "eth0")
	if err != nil {
		return err
	}
	nl, hl := n.Netlink(), host.Netlink()
	lk, err := n.Link("eth0")
	if err != nil {
		return err
	}
	host32 := &net.IPNet{IP: vm.Addr.AsSlice(), Mask: net.CIDRMask(32, 32)}
	steps := []func() error{
		func() error { return nl.LinkSetDown(lk) },
		func() error { return nl.LinkSetHardwareAddr(lk, vm.MAC) },
		func() error { return nl.LinkSetUp(lk) },
		func() error { return n.AddAddr("eth0", vm.Addr.String()+"/32") },
		func() error { return nl.RouteAdd(vmRoute(vmEnd.Index, gwIP)) },
		// The gateway answers the VM's ARP: an address of the host-side
		// veth (a /32, so it adds no subnet route; the same address on
		// every VM port of the host, as a virtual router's is).
		func() error { return host.AddAddr(vm.Port, gw.String()+"/32") },
	}
	if route {
		steps = append(steps, func() error {
			return hl.RouteAdd(&netlink.Route{LinkIndex: hostEnd.Index, Dst: host32, Scope: netlink.SCOPE_LINK})
		})
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// DisableOffloads turns checksum offload off on every client's uplink and
// every VM's eth0 of the fleet (netlab.NS.DisableChecksumOffload), so every
// frame that reaches a data path carries a complete checksum. The fleet
// runs with the kernel's defaults; this shapes it for the one test variant
// that keeps the complete-checksum path covered end to end.
func (f *Fleet) DisableOffloads() error {
	for _, n := range f.Clients {
		if err := n.DisableChecksumOffload("up"); err != nil {
			return err
		}
	}
	for _, n := range f.VMs {
		if err := n.DisableChecksumOffload("eth0"); err != nil {
			return err
		}
	}
	return nil
}

// vmRoute is a VM's route to the lab: through gw on eth0 (ifindex eth0).
func vmRoute(eth0 int, gw net.IP) *netlink.Route {
	return &netlink.Route{LinkIndex: eth0, Dst: testRange, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}
}

// BlackholeVM makes the VM namespace n stop answering: its route to the
// lab becomes a blackhole, so nothing leaves it (no SYN-ACK, no RST, no
// ICMP) and what reaches it goes unanswered. RestoreVM undoes it.
func BlackholeVM(n *netlab.NS) error {
	return n.Netlink().RouteReplace(&netlink.Route{Dst: testRange, Type: syscall.RTN_BLACKHOLE})
}

// RestoreVM gives the VM namespace n its route through gw back (WireVM's).
func RestoreVM(n *netlab.NS, gw netip.Addr) error {
	eth0, err := n.Link("eth0")
	if err != nil {
		return err
	}
	return n.Netlink().RouteReplace(vmRoute(eth0.Attrs().Index, gw.AsSlice()))
}
