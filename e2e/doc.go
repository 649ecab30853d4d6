// Package e2e holds the end-to-end tests of the fleet: they build the
// reference binaries (examples/mux, examples/hostagent and
// examples/xdplbctl, once per test binary through fleetlabtest.Examples,
// or examples/mux alone for the Mux-only tests), run them as separate processes in network namespaces
// on this machine with BIRD 2 as the router (internal/lab/netlab,
// internal/lab/fleetlab), and send real traffic through the VIPs from
// client namespaces.
//
// What runs here, by file:
//
//   - mux_*: two Muxes behind BIRD (TestMuxEndToEnd: ECMP, the picks
//     against the library's Maglev, health, VXLAN on the wire), the
//     locked-down control plane (TestMuxControlPlane), a backend host
//     that runs only the kernel's vxlan device
//     (TestMuxKernelVXLANBackend);
//   - hostagent_*, spoof_*, flood_*: one Mux and one Host Agent with VMs
//     (TestHostAgentEndToEnd, TestHostAgentControlPlane), the Host
//     Agent's probes of its VMs through their ports
//     (TestHostAgentProbesDIPs), spoofed sources
//     (TestSpoofedSourcesEndToEnd) and floods against both connection
//     tables (TestFloodEndToEnd);
//   - fleet_*: the lab's fleet (fleetlab.Fleet: two Muxes, two hosts, four
//     VMs): spread against weights, failures of a DIP and of a Mux,
//     reloads under traffic, real traffic with the kernel's offloads,
//     direct connections, IPv6 (TestFleet*); the fleet from its one
//     document in a real three-member etcd cluster, through the death
//     of its leader, of every member and their restart
//     (TestFleetEtcdFaults, fleet_etcd_linux_test.go: the members are
//     this test binary re-executed, TestEtcdMemberProcess); and a fleet
//     run from an embedded etcd, its document applied with xdplbctl,
//     whose host has two tenants' VMs with one address in two VNIs: one
//     stops, the other keeps its traffic, xdplbctl status shows both
//     (TestFleetOverlappingTenants, fleet_overlap_*); and a fleet on an
//     embedded etcd whose VIPs are each served by one host's VMs, where a
//     Host Agent drops as src_vip real packets claiming a VIP it knows
//     only from views.vips — one of the other host, and one added later
//     without its view changing (TestFleetEtcdOtherHostsVIPFiltered,
//     fleet_vipfilter_*);
//   - outbound_*: the fleet's VMs opening connections to an "internet"
//     namespace behind the router with the VIP as their source (source
//     NAT): 4,000 concurrent TCP connections, UDP, an ICMP error and
//     pings (TestOutboundSNAT), a small range exhausted and freed
//     (TestOutboundExhaustion), and, from etcd, a killed Host Agent's
//     ranges guarded from the other DIPs and taken back with a held
//     connection when it restarts (TestOutboundHostAgentRestart).
//
// The tests use only the library's exported API and internal/lab/…; the
// packages' own tests (mux, hostagent, …) stay beside their code.
//
// Every test needs root (network namespaces, XDP, AF_XDP) and skips with
// a message without it; those that need BIRD 2 (bird and birdc) skip
// without it too. They are Linux-only: on other systems the package holds
// no test. Addresses come from 198.18.0.0/15 and 2001:db8::/32 and exist
// only inside the namespaces, which are removed — XDP programs included —
// when a test ends, also when it fails.
package e2e
