package pktrate

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// The desired-state documents (package control) the harness writes for
// the Mux and the Host Agent. Both serve one VIP, VIPAddr UDP DstPort in
// VNI TunnelVNI, without health probes (backends without a probe count
// as healthy) and without a BGP section (nothing to announce to: the
// generator is the router, with a static route).

// MuxBackend is one backend of the Mux's document: a DIP on a host.
type MuxBackend struct {
	Name string
	// Addr is the DIP, MAC its MAC (the inner destination the Mux
	// writes), Host the host's address (the outer destination).
	Addr, Host netip.Addr
	MAC        net.HardwareAddr
}

// MuxBackends are the Mux's backends: 8 DIPs (198.18.5.1-8) on 4 hosts
// (198.18.4.1-4), all in 198.18.0.0/15, which the one-armed DUT routes
// back to the generator.
var MuxBackends = func() []MuxBackend {
	var bs []MuxBackend
	for i := 1; i <= 8; i++ {
		bs = append(bs, MuxBackend{
			Name: fmt.Sprintf("dip%d", i),
			Addr: netip.AddrFrom4([4]byte{198, 18, 5, byte(i)}),
			Host: netip.AddrFrom4([4]byte{198, 18, 4, byte((i + 1) / 2)}),
			MAC:  net.HardwareAddr{0x02, 0, 0, 0, 0x05, byte(i)},
		})
	}
	return bs
}()

// HashSeed is the documents' hash_seed.
const HashSeed = 0x5eed1234

// MuxDocument is the Mux's document: the VIP with MuxBackends, each
// weight 1, 5-tuple distribution, backend port DIPPort (the Host Agent's
// business; the Mux does not translate).
func MuxDocument() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by internal/lab/pktrate for the Mux under test.\nversion: 1\nhash_seed: %#x\n", HashSeed)
	writeVIP(&b)
	for _, be := range MuxBackends {
		fmt.Fprintf(&b, "      - {name: %s, address: %v, port: %d, mac: %q, host: %v}\n",
			be.Name, be.Addr, DIPPort, be.MAC, be.Host)
	}
	return b.String()
}

// HostName is the host's name in HostAgentDocument.
const HostName = "dut"

// HostAgentDocument is the Host Agent's document on PathTunnel: the VIP
// with one backend, the VM (DIPAddr, port DIPPort, MAC vmMAC) behind the
// host's VM port vmPort; the host HostName at DUTInAddr.
func HostAgentDocument(vmMAC net.HardwareAddr, vmPort string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by internal/lab/pktrate for the Host Agent under test.\nversion: 1\nhash_seed: %#x\n", HashSeed)
	// The generator plays the Mux: VXLAN comes from it.
	fmt.Fprintf(&b, "mux_prefixes: [%v]\n", netip.PrefixFrom(GenAddr, 32))
	writeVIP(&b)
	fmt.Fprintf(&b, "      - {name: vm, address: %v, port: %d, mac: %q, host: %v}\n", DIPAddr, DIPPort, vmMAC, DUTInAddr)
	fmt.Fprintf(&b, "hosts:\n  - name: %s\n    address: %v\n    vms:\n      - {vni: %d, address: %v, mac: %q, interface: %s}\n",
		HostName, DUTInAddr, TunnelVNI, DIPAddr, vmMAC, vmPort)
	return b.String()
}

func writeVIP(b *strings.Builder) {
	fmt.Fprintf(b, "vips:\n  - name: bench\n    address: %v\n    protocol: udp\n    port: %d\n    vni: %d\n    backends:\n",
		VIPAddr, DstPort, TunnelVNI)
}
