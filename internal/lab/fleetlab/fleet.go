package fleetlab

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// Fleet addresses and numbers.
var (
	// FleetVIP is the fleet's VIP.
	FleetVIP = netip.MustParseAddr("198.18.100.1")
	// FleetGateway is the VMs' next hop: an address of the host-side
	// veth of their VM port, which they resolve by ARP.
	FleetGateway = netip.MustParseAddr("198.18.30.254")
)

// FleetVNI is the VNI of the fleet's services and VMs.
const FleetVNI = 100

// FleetMuxes and FleetHosts are how many Muxes and hosts a fleet has.
const (
	FleetMuxes = 2
	FleetHosts = 2
)

// FleetMuxAddr returns the address of Mux i (from 1) on its uplink "up".
func FleetMuxAddr(i int) netip.Addr { return SubnetAddr(i, 2) }

// FleetMuxPeer returns the router's address on the link to Mux i.
func FleetMuxPeer(i int) netip.Addr { return SubnetAddr(i, 1) }

// FleetHostAddr returns the physical address of host j (from 1).
func FleetHostAddr(j int) netip.Addr { return SubnetAddr(20+j, 2) }

// FleetClientAddr returns the address of client k (from 1).
func FleetClientAddr(k int) netip.Addr { return SubnetAddr(10+k, 2) }

// FleetVMs returns the fleet's four VMs, two per host, weighted 1:2:1:4.
func FleetVMs() []VM {
	return []VM{
		{"vm11", 1, "vm1", netip.MustParseAddr("198.18.31.1"), net.HardwareAddr{2, 0, 0, 0, 0x31, 1}, 1},
		{"vm12", 1, "vm2", netip.MustParseAddr("198.18.31.2"), net.HardwareAddr{2, 0, 0, 0, 0x31, 2}, 2},
		{"vm21", 2, "vm1", netip.MustParseAddr("198.18.32.1"), net.HardwareAddr{2, 0, 0, 0, 0x32, 1}, 1},
		{"vm22", 2, "vm2", netip.MustParseAddr("198.18.32.2"), net.HardwareAddr{2, 0, 0, 0, 0x32, 2}, 4},
	}
}

// FleetHostList returns the fleet's hosts as a document lists them: host1
// and host2.
func FleetHostList() []Host {
	hs := make([]Host, FleetHosts)
	for j := range hs {
		hs[j] = Host{Name: fmt.Sprintf("host%d", j+1), Addr: FleetHostAddr(j + 1)}
	}
	return hs
}

// FleetDoc returns version v of the fleet's document for mux (0: the Host
// Agents' copy; i: Mux i's, named mux<i>, with its BGP session to the
// router when bgp is set): services served by pool, the hosts with the
// pool's VMs, the Muxes' subnets as infrastructure prefixes, the Muxes'
// addresses as the tunnel sources (mux_prefixes).
func FleetDoc(v uint64, mux int, bgp bool, services []Service, pool []VM) *Doc {
	d := &Doc{
		Version:     v,
		Infra:       []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("198.18.2.0/24")},
		MuxPrefixes: FleetMuxPrefixes(),
		Services:    services,
		Pool:        slices.Clone(pool),
		Hosts:       FleetHostList(),
	}
	if mux > 0 {
		d.Node = fmt.Sprintf("mux%d", mux)
		if bgp {
			d.BGP = MuxBGP(FleetMuxAddr(mux), FleetMuxPeer(mux))
		}
	}
	return d
}

// FleetMuxPrefixes returns the Muxes' addresses as /32 prefixes: where
// they send VXLAN from.
func FleetMuxPrefixes() []netip.Prefix {
	var ps []netip.Prefix
	for i := 1; i <= FleetMuxes; i++ {
		ps = append(ps, netip.PrefixFrom(FleetMuxAddr(i), 32))
	}
	return ps
}

// FleetBIRD returns the router's BIRD configuration in a fleet: an eBGP
// session with each Mux.
func FleetBIRD() BIRDConfig {
	c := BIRDConfig{RouterID: netip.MustParseAddr("198.18.0.1"), ASN: RouterASN}
	for i := 1; i <= FleetMuxes; i++ {
		c.Peers = append(c.Peers, BIRDPeer{Name: fmt.Sprintf("mux%d", i), Addr: FleetMuxAddr(i), ASN: MuxASN})
	}
	return c
}
