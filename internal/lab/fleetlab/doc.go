// Package fleetlab builds whole xdplb fleets in network namespaces on one
// machine, for the lab demo (examples/lab), the end-to-end tests (package
// e2e) and the BGP announcer's tests. It stands on internal/lab/netlab
// (namespaces, veths, addresses, cleanup) and adds what those programs
// have in common:
//
//   - the star topology: a router namespace, and every other node joined
//     to it by a veth pair on a /24 of its own (Star, Star.Attach); the
//     fleet of the lab (Fleet: clients, two Muxes, two hosts with VMs);
//     VMs wired to their host's VM ports (WireVM; WireTenantVM for another
//     tenant's VM with the same address on the same host) and their servers
//     (ServeVM: HTTP and UDP echo answering with the VM's name); a
//     backend host without a Host Agent, a kernel vxlan device holding
//     the VIP (KernelVXLAN, Star.AttachKernelVXLAN, ServeKernelVXLAN); the
//     fleet made dual-stack (Fleet.AddIPv6, WireVM6: IPv6 on every link,
//     each VM's IPv6 address on the same eth0 and MAC, its gateway found
//     by neighbour discovery);
//   - the desired-state document of such a lab (Doc, FleetDoc, FleetDoc6
//     with an IPv6 VIP served by the VMs' IPv6 addresses), built as a
//     control.Document and marshalled, never templated by hand;
//   - BIRD 2 as the router: its configuration (BIRDConfig), the daemon
//     (StartBIRD) and birdc (BIRD.Birdc);
//   - processes in namespaces with captured output and an orderly stop
//     (Proc: SIGTERM, then SIGKILL after a grace period), the example
//     binaries built by the running toolchain (GoBuild);
//   - reading a node from inside the lab: its Prometheus /metrics
//     (Scrape), the router's ECMP next hops (NextHops), HTTP and UDP
//     through a VIP (HTTPClient, Get, UDPEcho).
//
// Everything here returns errors and never imports testing, so a program
// can use it; package fleetlabtest wraps it for tests (a failed step fails
// the test, every process stops at the test's cleanup).
//
// Addresses are in 198.18.0.0/15 and 2001:db8::/32 (netlab refuses
// anything else; the VMs' IPv6 gateway is the link-local fe80::1): the
// node on Attach's subnet N is 198.18.N.2 and its router 198.18.N.1, and
// with AddIPv6 also 2001:db8:0:N::2 and 2001:db8:0:N::1. The
// namespace parts are Linux-only; the document and BIRD configuration
// builders are not.
package fleetlab
