// Package hostagent assembles the Host Agent role of an Ananta-style load
// balancer from xdplb's packages: it reads the same desired-state document
// as the Muxes (control) and keeps what concerns its host — the host's
// physical address and VXLAN port, the VMs (DIPs) it hosts with their
// ports, the VIP rules (flow.Rules) and the infrastructure prefixes — and
// runs the two halves of Direct Server Return:
//
//	uplink RX  → VXLAN Decap (VM port by VNI, inner MAC) → client filter → PartialChecksums → nat.Inbound (VIP→DIP) → TX VM port
//	VM port RX → Parse (the port's VNI) → client filter → TTL → PartialChecksums → nat.Return (DIP→VIP) → NextHop (L3Dst) → TX uplink
//
// Replies leave straight for the client's next hop: the Mux never sees
// them. Decap finds the VM port by (VNI, MAC); the NAT stages find the DIP
// by (VNI, address). A dual-stack VM — one MAC and one interface with an
// IPv4 and an IPv6 address, listed in the document once per family — is
// one Decap endpoint with two DIPs (Plan.Endpoints, Plan.DIPs).
// engine.PartialChecksums completes the TCP/UDP checksums that VMs
// and containers on the host — and clients on a Mux's machine — leave to
// offload, before NAT rewrites them; nothing on the interfaces needs to be
// configured. The packets of a direct connection to a DIP (not through a
// VIP; see package nat) leave nat.Return untranslated for the slow path,
// whose kernel routes them.
//
// # Spoofing and loops
//
// Decap accepts VXLAN only from the Muxes: the document's mux_prefixes, or
// Config.TunnelSources (-tunnel-sources) in their place; other VXLAN is
// dropped (bad_tunnel_source), and the agent refuses a document that gives
// neither (ErrNoTunnelSources), since anyone reaching the host's VXLAN
// port could otherwise put frames on its VMs' networks around the Muxes.
// The client filters (package guard) drop a request whose inner source, or
// a reply whose destination, is a VIP or a martian (src_vip, src_martian):
// a spoofed VIP:7 → VIP:7 datagram answered by an echo service would loop
// through the router and the Muxes. The host routes the VMs' packets, so
// the TTL stage takes one from their TTL / hop limit and drops those that
// arrive with 1 or 0 (ttl_exceeded), direct connections included.
//
// # Steering
//
// Only the data plane's traffic reaches the AF_XDP sockets; everything else
// goes to the kernel (engine/steer, one program per interface):
//
//   - the uplink steers VXLAN to the host's address and VXLAN port; ARP,
//     neighbour discovery, BGP, SSH and the host's own traffic pass;
//   - each VM port steers what the VM sends from a DIP endpoint that serves
//     a VIP (the backend's address and port: the translated replies),
//     unless it is addressed to an infrastructure prefix — the document's
//     infra_prefixes (health probers, Muxes), the host's own address and
//     Config.Infra — so replies to health probes reach the kernel, which
//     routes them. The VM's own traffic (outbound connections, DNS, ...)
//     passes too.
//
// # Workers and sockets
//
// The data path is built by engine/datapath from a spec of the plan: the
// uplink, then the VM ports, then the slow path. An AF_XDP socket binds to
// one queue of one interface and is driven by one worker. Worker w owns the
// sockets of queue w on every interface, numbered by the builder's rule —
// port 0 the uplink (UplinkPort), port 1+i VM port i (VMPort.Index), then
// the slow-path port — so a packet's out port names the same interface in
// every worker; the number of workers is therefore at most the smallest
// queue count of the uplink and the VM ports (Config.Workers). Sockets of
// the queues above it are extra receive-only inputs of worker queue %
// workers. Frames cross from the uplink's UMEM to a VM port's by one copy
// (engine.Port's ownership rule).
//
// # Configuration changes
//
// Plan is the document seen from this host, computed without privileges.
// A new version is applied whole or refused: the plan, the rules snapshot
// and the indexes are built first. When it keeps the data path's structure
// (same host address and VXLAN port, same VM ports and VNIs, same
// infrastructure prefixes and tunnel sources) the rules, endpoints, DIPs and steering rules
// are swapped live; otherwise the agent builds a new data path beside the
// running one, which keeps forwarding the previous version meanwhile, and
// swaps them. The new data path shares the interfaces both serve: their
// steering programs stay attached and their AF_XDP sockets stay bound, so
// what arrives while the workers are replaced waits in the sockets' rings
// and nothing is dropped or leaks to the kernel untranslated
// (TestFleetReloadNewDIPKeepsConnections asserts that the client
// retransmits nothing). What only the new version serves (a new VM port)
// is built whole — program loaded and attached, sockets opened — before
// the running data path is touched: if that fails (a foreign XDP program
// on the new port, say), the new parts are released, the running data
// path keeps forwarding, and the version is refused (logged,
// xdplb_config_error{reason="apply"}, xdplb_datapath_build_failures_total)
// and retried like any refused version (TestFleetReloadForeignXDPRefused).
// An interface both serve whose index or queue count changed under the
// agent cannot be shared (a queue takes one socket): such a version is
// refused too, and a restart serves the interface as it is. The NAT table
// survives rebuilds, so established connections keep their translation.
//
// # Failures
//
// Every worker checks its AF_XDP sockets every engine.DefaultCheckEvery
// (engine.Checker, afxdp.Port.Check): when an interface is deleted under
// the agent (a VM port or the uplink), its sockets fail, the worker stops
// with the error, Run logs it ("data path failed"), closes the rest
// (xdplb_datapath_up goes to 0) and returns it; examples/hostagent then
// exits with status 1 for its supervisor to restart it on the interfaces
// as they are. It does not re-attach by itself: a deleted interface's
// socket cannot be rebound, and a recreated one has a new index.
// Config.OnForwarding runs once the first data path forwards; the binary
// drops its capabilities there (internal/node.HostAgentCaps).
//
// # Limits
//
//   - A VM port is one interface per VM (the document enforces it), in
//     one VNI.
//   - ICMP errors a VM sends about a client's packet pass to the kernel
//     (the steering program can match a DIP's ICMP only together with all
//     its other traffic), so they leave untranslated; the NAT stages can
//     translate them (nat.Return), the steering cannot yet single them out.
//   - Backends' health is the Muxes' business: the agent translates what it
//     receives.
//
// Agent is the whole node, as examples/hostagent runs it.
package hostagent
