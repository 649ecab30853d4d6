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
//     passes too — unless the DIP is listed in an outbound section
//     (Plan.Outbound): then its port steers everything the DIP sends (a
//     source rule of any port), except to the infrastructure prefixes
//     and to multicast, broadcast and link-local destinations, and
//     nat.Return hands what no DSR connection claims to the source NAT
//     (nat.SNAT): connections leave with the VIP and a port of the DIP's
//     ranges as their source, straight to the router; east-west traffic
//     (the section's local prefixes) and protocols other than TCP and
//     UDP go to the slow path untranslated, for the host to route.
//
// # Outbound connections
//
// The source NAT lives as long as the agent (like the NAT table, across
// data path rebuilds). Its ranges are the document's static ones
// (Plan.OutboundStatic) plus those given to SetOutboundAllocations — by a
// port allocator in etcd (internal/node's Fleet.AllocatePorts, which
// reads OutboundUsage to claim more or return idle ones). Replies reach a
// Mux, whose range table sends them here in VXLAN in the DIP's VNI; the
// uplink's nat.Inbound translates them back. Counters: SNAT().Stats(),
// xdplb_outbound_*. Limits: an outbound DIP's packets to a VIP address
// (another service of the fleet) are dropped by the client filter
// (src_vip), as the VIP's source would not tell them from a spoofer's.
//
// # Probing its own DIPs
//
// With Config.OnDIPHealth set (examples/hostagent -probe-dips) the agent
// probes the VMs of its host that back a VIP with a probe (Plan.Probes:
// one target per VNI, DIP and probed port, with the document's probe) and
// reports the verdicts (DIPHealth, which is health.Verdict; also
// Agent.DIPHealth and xdplb_dip_health{vni,dip,port}). A probe reaches
// exactly that tenant's VM whatever its address, since it is an ordinary
// kernel TCP connection (or HTTP over one) whose socket is bound to the
// DIP's VM port (SO_BINDTODEVICE) and sent from the host's own address:
//
//   - out: the kernel sends the SYN out of the VM port and resolves the
//     DIP by ARP on that port (neighbour entries are per interface). For
//     IPv4 no route is needed: a socket bound to an interface with no
//     route to the DIP through it takes the DIP as on-link there, so two
//     VMs with one address in two VNIs, behind two ports, are both
//     reached although the host can route that address to one port only;
//   - back: the VM answers the host's address through its gateway (the
//     host side of its port, as for any traffic it sends); the host's
//     address is an infrastructure prefix, so the port's steering program
//     passes the answer to the kernel even when it matches a DIP rule
//     (the probed port serving a VIP), and the kernel hands it to the
//     bound socket. Nothing in the data path changes.
//
// Limits: a probe of an IPv6 DIP needs a route to the DIP through its port
// (IPv6 has no on-link fallback for a bound socket), so two tenants' VMs
// with the same IPv6 address behind two ports of one host need a route
// each (e.g. one per port with different metrics). A strict reverse-path
// filter on a VM port (rp_filter 1) drops the answer of a VM whose address
// the host routes to another port; the kernel's default (0) and the loose
// filter (2, systemd's default) pass it. Probes of the other family than
// the host's address leave from the kernel's choice of source. Binding
// needs CAP_NET_RAW, which the agent keeps (internal/node.HostAgentCaps).
//
// The checker runs the probes (package health: rise, fall, a timeout that
// may exceed the interval); OnDIPHealth gets every batch of changes from
// one goroutine. A document that adds DIPs to probe makes one call
// listing them down ("not probed yet"); a DIP a document stops probing is
// not reported again, it is only gone from Agent.DIPHealth, which lists
// exactly the DIPs probed now. Without OnDIPHealth the agent probes
// nothing: the Muxes probe (mux.Config.ExternalHealth off).
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
//   - The agent translates what it receives whatever its DIPs' health:
//     health decides where the Muxes send new flows (its own verdicts
//     reach them through OnDIPHealth and whatever the caller publishes).
//
// Agent is the whole node, as examples/hostagent runs it.
package hostagent
