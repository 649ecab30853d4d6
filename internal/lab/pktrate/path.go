package pktrate

import (
	"fmt"
	"net/netip"
)

// Path is the shape of a measurement: which topology the harness builds,
// what traffic the generator sends and what the sink counts. Every DUT of
// one Run must run on the same path (PathDUT).
type Path uint8

const (
	// PathRouted (the default): generator → DUT → sink over two veth
	// pairs; plain IPv4/UDP test frames to SinkAddr:DstPort, forwarded
	// from the DUT's ingress veth out of its egress veth. For forwarders:
	// xdp-redirect, kernel, l2fwd.
	PathRouted Path = iota
	// PathOneArm: generator ⇄ DUT over one veth pair. Test frames to
	// VIPAddr:DstPort arrive on the DUT's only veth and leave on it again,
	// to the generator's veth, which is the DUT's router (its next hop
	// for everything in 198.18.0.0/15) and where the sink counts them.
	// A Mux is one-armed: VIP traffic arrives on its uplink and VXLAN
	// leaves on it. For mux, l2fwd-1arm, kernel-1arm, xdp-tx-1arm.
	PathOneArm
	// PathTunnel: generator → host (DUT) → VM (sink) over two veth
	// pairs. The generator sends what a Mux sends a Host Agent: VXLAN
	// (VNI TunnelVNI) to the host's address DUTInAddr, around test frames
	// to VIPAddr:DstPort addressed to the VM's MAC. The DUT decapsulates,
	// translates VIPAddr:DstPort to DIPAddr:DIPPort and delivers the
	// inner frame to the VM, where the sink counts frames to
	// DIPAddr:DIPPort. For hostagent, kernel-vxlan-dnat.
	PathTunnel
)

// String returns "routed", "one-arm" or "tunnel".
func (p Path) String() string {
	switch p {
	case PathRouted:
		return "routed"
	case PathOneArm:
		return "one-arm"
	case PathTunnel:
		return "tunnel"
	}
	return fmt.Sprintf("Path(%d)", uint8(p))
}

// Output is the kind of test frame a DUT delivers to the sink. The sink
// counts both kinds apart; frames of the other kind are counted as
// Sample.WrongKind and flag the row.
type Output uint8

const (
	// OutputPlain: the test frame itself (forwarded, or decapsulated and
	// translated).
	OutputPlain Output = iota
	// OutputVXLAN: the test frame in VXLAN (what a Mux sends).
	OutputVXLAN
)

// String returns "plain" or "vxlan".
func (o Output) String() string {
	if o == OutputVXLAN {
		return "vxlan"
	}
	return "plain"
}

// Addresses of the topologies (RFC 2544 benchmarking range). Test frames
// go from FlowSrc (and the addresses after it, one per 32768 flows) to
// SinkAddr (PathRouted) or VIPAddr (PathOneArm, PathTunnel), UDP port
// DstPort.
var (
	GenAddr    = netip.MustParseAddr("198.18.0.1")
	DUTInAddr  = netip.MustParseAddr("198.18.0.2")
	DUTOutAddr = netip.MustParseAddr("198.18.1.1")
	SinkAddr   = netip.MustParseAddr("198.18.1.2")
	FlowSrc    = netip.MustParseAddr("198.18.0.128")
	// VIPAddr is the destination of one-armed and tunnelled test traffic:
	// the VIP the Mux and the Host Agent serve.
	VIPAddr = netip.MustParseAddr("198.18.2.1")
	// DIPAddr is the VM's address on PathTunnel (the sink's).
	DIPAddr = SinkAddr
)

// Ports and the tenant network of the test traffic.
const (
	// DstPort is the test traffic's UDP destination port (discard), the
	// VIP's port.
	DstPort = 9
	// DIPPort is the port the VIP's port becomes on PathTunnel (the DUT
	// translates VIPAddr:DstPort to DIPAddr:DIPPort).
	DIPPort = 7009
	// TunnelVNI is the VNI of the VIP and of the tunnelled traffic.
	TunnelVNI = 100
)
