package fleetlab

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/xdplb/xdplb/control"
)

// The fleet's IPv6 side (Fleet.AddIPv6): every link of the star also
// carries 2001:db8:0:<subnet>::/64 (SubnetAddr6), the VMs are dual-stack
// on the same eth0 and MAC (FleetVMs6), and the IPv6 VIP FleetVIP6 is
// announced by the Muxes over their IPv4 BGP sessions with an IPv6 next
// hop (MP-BGP, FleetDoc6, FleetBIRD6).
var (
	// FleetVIP6 is the fleet's IPv6 VIP.
	FleetVIP6 = netip.MustParseAddr("2001:db8:100::1")
	// FleetGateway6 is the VMs' IPv6 next hop: a link-local address on
	// the host-side veth of every VM port, which the VMs resolve by
	// neighbour discovery.
	FleetGateway6 = netip.MustParseAddr("fe80::1")
)

// SubnetAddr6 returns 2001:db8:0:<subnet>::<host>, the IPv6 address of
// Star.Attach's subnet beside SubnetAddr(subnet, host) (the numbers are
// written as they read: subnet 21 is 2001:db8:0:21::/64).
func SubnetAddr6(subnet, host int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("2001:db8:0:%d::%d", subnet, host))
}

// FleetMuxAddr6 returns the IPv6 address of Mux i (from 1) on its uplink:
// its BGP next hop for IPv6 VIPs.
func FleetMuxAddr6(i int) netip.Addr { return SubnetAddr6(i, 2) }

// FleetHostAddr6 returns the IPv6 address of host j (from 1) on its
// uplink.
func FleetHostAddr6(j int) netip.Addr { return SubnetAddr6(20+j, 2) }

// FleetClientAddr6 returns the IPv6 address of client k (from 1).
func FleetClientAddr6(k int) netip.Addr { return SubnetAddr6(10+k, 2) }

// FleetVMSubnet6 returns the IPv6 prefix of host j's VMs: the router
// routes it to the host.
func FleetVMSubnet6(j int) netip.Prefix { return netip.PrefixFrom(SubnetAddr6(30+j, 0), 64) }

// FleetVMs6 returns the IPv6 side of the VMs vms: each VM's twin with
// the same name, host, port, MAC and weight, and the address
// 2001:db8:0:3<host>::<n>, n being the last byte of its IPv4 address.
func FleetVMs6(vms []VM) []VM {
	out := slices.Clone(vms)
	for i := range out {
		a := out[i].Addr.As4()
		out[i].Addr = SubnetAddr6(30+out[i].Host, int(a[3]))
	}
	return out
}

// FleetInfra6 are the Muxes' IPv6 subnets: the sources of their probes to
// the IPv6 DIPs, never NATed.
func FleetInfra6() []netip.Prefix {
	var out []netip.Prefix
	for i := 1; i <= FleetMuxes; i++ {
		out = append(out, netip.PrefixFrom(SubnetAddr6(i, 0), 64))
	}
	return out
}

// FleetDoc6 is FleetDoc for a dual-stack fleet: services with an IPv6
// VIP are served by pool6 (FleetVMs6 of pool), the hosts list each VM once
// per family, the Muxes' IPv6 subnets are infrastructure too, and a Mux's
// BGP section announces IPv6 VIPs with its IPv6 address as next hop.
func FleetDoc6(v uint64, mux int, bgp bool, services []Service, pool, pool6 []VM) *Doc {
	d := FleetDoc(v, mux, bgp, services, pool)
	d.Pool6 = slices.Clone(pool6)
	d.Infra = append(d.Infra, FleetInfra6()...)
	if d.BGP != nil {
		d.BGP.NextHop6 = FleetMuxAddr6(mux)
	}
	return d
}

// FleetBIRD6 is FleetBIRD with IPv6 unicast on every session and an
// IPv6 kernel protocol (ECMP over the Muxes for the IPv6 VIPs).
func FleetBIRD6() BIRDConfig {
	c := FleetBIRD()
	c.IPv6 = true
	return c
}

// FleetShared is FleetDoc6 as one document for every node of the fleet:
// no node.name, and with bgp each Mux's router id, peer and IPv6 next hop
// in the nodes section (mux1, mux2, ...) under a fleet-wide bgp section
// (MuxBGP's AS, timers and port).
func FleetShared(v uint64, bgp bool, services []Service, pool, pool6 []VM) *Doc {
	d := FleetDoc6(v, 0, false, services, pool, pool6)
	if !bgp {
		return d
	}
	fleet := MuxBGP(FleetMuxAddr(1), FleetMuxPeer(1))
	fleet.RouterID, fleet.Peers = netip.Addr{}, nil
	d.BGP = fleet
	for i := 1; i <= FleetMuxes; i++ {
		m := MuxBGP(FleetMuxAddr(i), FleetMuxPeer(i))
		d.Nodes = append(d.Nodes, control.NodeConfig{Name: fmt.Sprintf("mux%d", i),
			BGP: &control.BGP{RouterID: m.RouterID, Peers: m.Peers, NextHop6: FleetMuxAddr6(i)}})
	}
	return d
}
