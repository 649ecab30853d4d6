package fleetlab

import (
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// testRange6 is 2001:db8::/32, every lab IPv6 address.
var testRange6 = &net.IPNet{IP: net.ParseIP("2001:db8::"), Mask: net.CIDRMask(32, 128)}

// AddIPv6 makes the fleet dual-stack: every link of the star gets
// 2001:db8:0:<subnet>::/64 (the router ::1, the node ::2, SubnetAddr6),
// every node routes 2001:db8::/32 to the router, the router forwards
// IPv6 and hashes its IPv6 ECMP routes on L4, the hosts forward IPv6 and
// the router routes host j's VM subnet FleetVMSubnet6(j) to it, and each
// VM of vms6 (FleetVMs6: the IPv6 twins of the VMs BuildFleet wired) gets
// its IPv6 address on the same eth0 (WireVM6).
func (f *Fleet) AddIPv6(vms6 []VM) error {
	r := f.Router
	for _, kv := range [][2]string{{"net.ipv6.conf.all.forwarding", "1"}, {"net.ipv6.fib_multipath_hash_policy", "1"}} {
		if err := r.SetSysctl(kv[0], kv[1]); err != nil {
			return err
		}
	}
	type link struct {
		n      *netlab.NS
		rif    string
		subnet int
	}
	var links []link
	for k, n := range f.Clients {
		links = append(links, link{n, fmt.Sprintf("c%d", k+1), 10 + k + 1})
	}
	for i, n := range f.Muxes {
		links = append(links, link{n, fmt.Sprintf("m%d", i+1), i + 1})
	}
	for j, n := range f.Hosts {
		links = append(links, link{n, fmt.Sprintf("h%d", j+1), 20 + j + 1})
	}
	for _, l := range links {
		for _, err := range []error{
			r.AddAddr(l.rif, SubnetAddr6(l.subnet, 1).String()+"/64"),
			l.n.AddAddr("up", SubnetAddr6(l.subnet, 2).String()+"/64"),
			l.n.AddRoute("2001:db8::/32", SubnetAddr6(l.subnet, 1).String()),
		} {
			if err != nil {
				return fmt.Errorf("%s: %w", l.n, err)
			}
		}
	}
	for j, n := range f.Hosts {
		if err := n.SetSysctl("net.ipv6.conf.all.forwarding", "1"); err != nil {
			return err
		}
		if err := r.AddRoute(FleetVMSubnet6(j+1).String(), FleetHostAddr6(j+1).String()); err != nil {
			return err
		}
	}
	for _, vm := range vms6 {
		n, ok := f.VMs[vm.Name]
		if !ok {
			return fmt.Errorf("fleetlab: AddIPv6: no VM %s", vm.Name)
		}
		if err := WireVM6(f.Hosts[vm.Host-1], n, vm); err != nil {
			return fmt.Errorf("%s: %w", vm.Name, err)
		}
	}
	return nil
}

// WireVM6 gives the VM namespace n, already wired to its host by WireVM,
// its IPv6 address vm.Addr/128 on the same eth0 (and MAC): the host-side
// veth vm.Port gets the link-local FleetGateway6, the VM routes
// 2001:db8::/32 to it and the host routes vm.Addr to the port. Both ends
// find each other by neighbour discovery (no static neighbours).
func WireVM6(host, n *netlab.NS, vm VM) error {
	if !vm.Addr.Is6() || !netip.MustParsePrefix("2001:db8::/32").Contains(vm.Addr) {
		return fmt.Errorf("fleetlab: WireVM6: %v is not in 2001:db8::/32", vm.Addr)
	}
	hl, nl := host.Netlink(), n.Netlink()
	port, err := host.Link(vm.Port)
	if err != nil {
		return err
	}
	eth0, err := n.Link("eth0")
	if err != nil {
		return err
	}
	gw := &net.IPNet{IP: FleetGateway6.AsSlice(), Mask: net.CIDRMask(64, 128)}
	for _, step := range []func() error{
		func() error { return hl.AddrAdd(port, &netlink.Addr{IPNet: gw, Flags: unix.IFA_F_NODAD}) },
		func() error { return n.AddAddr("eth0", vm.Addr.String()+"/128") },
		func() error {
			return nl.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: testRange6, Gw: FleetGateway6.AsSlice()})
		},
		func() error {
			return hl.RouteAdd(&netlink.Route{LinkIndex: port.Attrs().Index, Scope: netlink.SCOPE_LINK,
				Dst: &net.IPNet{IP: vm.Addr.AsSlice(), Mask: net.CIDRMask(128, 128)}})
		},
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}
