package fleetlab

import (
	"fmt"
	"net"
	"net/netip"
)

// KernelVXLAN is a backend host that runs no xdplb code (the "DR" model):
// a plain Linux vxlan device terminates the Muxes' VXLAN, the VIPs are
// addresses on that device, and its servers, bound to the VIPs, answer
// the clients straight from the VIP (Direct Server Return by the kernel:
// there is no NAT, so the server listens on the VIP's own port).
//
// Its backend (Backend) is the host's underlay address, which is also
// what the Muxes probe: the Muxes cannot probe the VIP itself (the router
// sends the VIP to the Muxes, not to the host), so the host's servers
// listen on its underlay address too (ServeKernelVXLAN). The DIP address
// is otherwise unused on this path: the Muxes forward the packet
// unchanged, VIP and port included, and address the host by its MAC and
// host fields.
//
// The commands that set such a host up (Commands, Sysctls) are the
// README's recipe ("Backends without a Host Agent"), which
// TestReadmeKernelVXLANRecipe keeps in step.
type KernelVXLAN struct {
	// Name names the host (its namespace and its entry in Doc.Hosts).
	Name string
	// Addr is the host's underlay address: where the Muxes send VXLAN
	// (the vxlan device's local address), and the backend's DIP.
	Addr netip.Addr
	// Uplink is the interface Addr is on ("up" in a Star).
	Uplink string
	// VNI is the VIPs' VNI: the vxlan device's id.
	VNI uint32
	// MAC is the vxlan device's MAC: the backend's mac, the inner
	// Ethernet destination of what the Muxes send. A frame to any other
	// MAC would reach the device as "other host" and be dropped.
	MAC net.HardwareAddr
	// VIPs are the addresses the host serves, each a /32 on the vxlan
	// device (Commands says why not on lo).
	VIPs []netip.Addr
}

// Device returns the vxlan device's name: vxlan<VNI>.
func (k KernelVXLAN) Device() string { return fmt.Sprintf("vxlan%d", k.VNI) }

// Commands returns the `ip` commands (arguments after "ip") that set the
// host up, in order:
//
//   - a vxlan device with id VNI on the IANA port 4789 (what the Muxes
//     send to; Linux's own default port is 8472), local Addr on Uplink,
//     nolearning (the host never sends on it: replies leave from the VIP
//     through the uplink's routes, so there is nothing to learn, and
//     learning would only fill the forwarding table with the Muxes' inner
//     source MACs), with MAC as its address;
//   - the device up;
//   - every VIP as a /32 on the vxlan device, so the kernel delivers the
//     decapsulated packets locally and a server can bind to the VIP. On
//     the device rather than on lo: the packets arrive on the device from
//     clients the host routes through its uplink, which a reverse-path
//     filter in loose mode (Sysctls) accepts only on an interface that
//     has an IPv4 address of its own; an interface without one fails
//     every reverse-path check, loose or strict. (The VIP on lo works
//     too, with rp_filter 0 on both conf.all and the device.)
func (k KernelVXLAN) Commands() [][]string {
	cmds := [][]string{
		{"link", "add", k.Device(), "address", k.MAC.String(), "type", "vxlan", "id", fmt.Sprint(k.VNI),
			"dstport", "4789", "local", k.Addr.String(), "dev", k.Uplink, "nolearning"},
		{"link", "set", k.Device(), "up"},
	}
	for _, v := range k.VIPs {
		cmds = append(cmds, []string{"addr", "add", netip.PrefixFrom(v, v.BitLen()).String(), "dev", k.Device()})
	}
	return cmds
}

// Sysctls returns the sysctls (key, value) the host needs:
//
//   - rp_filter 2 (loose) on the vxlan device: the decapsulated packets
//     arrive on it from the clients' addresses, which the host routes
//     through its uplink, so strict reverse-path filtering (1) drops
//     every one of them. The kernel applies the larger of conf.all and
//     the device's value, so 2 on the device is loose whatever conf.all
//     says (0, 1, or systemd's 2), and still drops sources the host
//     cannot route at all (the device holds the VIPs, so it has an
//     address, which loose mode needs: see Commands);
//   - arp_ignore 1 on the uplink: answer ARP only for addresses of the
//     interface asked on, so the host does not claim the VIPs (on the
//     vxlan device) on its uplink's segment and draw the VIPs' traffic
//     away from the Muxes (by default Linux answers for any of its
//     addresses on any interface);
//   - arp_announce 2 on the uplink: in the host's own ARP requests, use
//     the uplink's address as the sender, never a VIP (a reply's source),
//     so neighbours do not learn the host's MAC for a VIP.
//
// The lab's router reaches the VIP through the Muxes and never asks the
// host's segment for it, so only rp_filter is needed for traffic to flow
// there; the ARP settings are what a real shared segment needs, and the
// lab sets them as the recipe does.
func (k KernelVXLAN) Sysctls() [][2]string {
	return [][2]string{
		{"net.ipv4.conf." + k.Device() + ".rp_filter", "2"},
		{"net.ipv4.conf." + k.Uplink + ".arp_ignore", "1"},
		{"net.ipv4.conf." + k.Uplink + ".arp_announce", "2"},
	}
}

// Host returns the host's entry of Doc.Hosts: one without a Host Agent,
// which the document's hosts section leaves out.
func (k KernelVXLAN) Host() Host { return Host{Name: k.Name, Addr: k.Addr, NoAgent: true} }

// Backend returns the host's backend for a pool, named name, on host
// number host (its place in Doc.Hosts, from 1, which must hold k.Host()):
// DIP Addr (what the Muxes probe), MAC the vxlan device's, no VM port.
func (k KernelVXLAN) Backend(name string, host int, weight uint32) VM {
	return VM{Name: name, Host: host, Addr: k.Addr, MAC: k.MAC, Weight: weight}
}

// FleetKernelVXLAN returns the lab's kernel VXLAN host: host3 on the
// star's subnet 23 (FleetHostAddr(3), the router's end h3), serving the
// fleet's VIP in the fleet's VNI behind a vxlan device with MAC
// 02:00:00:00:33:01.
func FleetKernelVXLAN() KernelVXLAN {
	return KernelVXLAN{Name: "host3", Addr: FleetHostAddr(3), Uplink: "up", VNI: FleetVNI,
		MAC: net.HardwareAddr{2, 0, 0, 0, 0x33, 1}, VIPs: []netip.Addr{FleetVIP}}
}

// FleetKernelVXLANSubnet is FleetKernelVXLAN's subnet of the star.
const FleetKernelVXLANSubnet = 23
