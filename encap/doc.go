// Package encap holds the VXLAN stages of the data path: Encap, which
// tunnels the Mux's balanced packets to their backends' hosts, and Decap,
// which ends the tunnel on the Host Agent and hands each inner frame to
// its local endpoint. The next-hop stage that addresses the tunnel
// packets (and the Host Agent's direct-server-return replies, which are
// not encapsulated) is nexthop.Stage, in engine/nexthop.
//
//	Mux:        parse → balance → Encap → nexthop.Stage(OuterDst) → TX uplink
//	Host Agent: parse → Decap → nat inbound → TX endpoint port
//	            parse → nat return → nexthop.Stage(L3Dst) → TX uplink (DSR)
//
// Every stage works on whole batches, in place, without allocating.
//
// # The encapsulated frame
//
// Encap leaves the inner packet untouched — but for its TTL / hop limit
// with EncapConfig.DecrementTTL, which the Mux sets because it routes the
// packet: one less, the IPv4 header checksum updated incrementally, and a
// packet arriving with 1 or 0 dropped as ttl_exceeded (package guard) —
// and rebuilds only its Ethernet header: destination the backend's MAC, source the received one (or
// EncapConfig.InnerSrcMAC), no VLAN tags (the uplink's tags are not the
// tenant's), no Ethernet padding. In front of it go, per RFC 7348:
//
//   - Ethernet, addresses zero, for the next-hop stage to fill.
//   - IPv4 or IPv6, by the family of the backend's Host: source the Mux's
//     address of that family, destination the Host; TTL / hop limit from
//     the configuration; DSCP and ECN copied from the inner header (the
//     "normal mode" of RFC 6040, which Decap completes by propagating a
//     Congestion Experienced mark inward). IPv4 has DF set and ID 0: the
//     datagram is atomic (RFC 6864), and DF is set because a VXLAN tunnel
//     endpoint must not fragment (RFC 7348 section 4.3) — a path that
//     cannot carry the packet reports it instead of fragmenting it into
//     pieces the Host Agent would have to reassemble, and the later
//     fragments would carry no UDP ports for ECMP. IPv6 carries 20 bits
//     of the flow hash as its flow label (RFC 6438).
//   - UDP to EncapConfig.Port (4789), from a port in 49152–65535 derived
//     from the flow hash (SourcePort), so routers spread flows over ECMP
//     paths while each flow keeps one. The checksum is zero over IPv4
//     (RFC 7348 section 5) and computed over IPv6 unless
//     EncapConfig.IPv6ZeroChecksum (RFC 6935, RFC 6936).
//   - VXLAN with the I flag and the rule's VNI.
//
// # Packets that do not fit
//
// A packet whose encapsulation exceeds the uplink MTU is never fragmented.
// If an ICMP error may be sent about it — an IPv4 packet with DF set, an
// IPv6 packet, neither of them an ICMP error, a non-first fragment, sent
// to a link-layer broadcast or multicast address or from a source that is
// not unicast — and the stage's rate limit (a lock-free
// token bucket shared by its workers, EncapConfig.ICMPRate per second)
// allows, the packet itself becomes the error: an ICMPv4 "fragmentation
// needed" (type 3 code 4) or ICMPv6 "packet too big" (type 2) from the VIP
// to the client, announcing MTU − overhead (1450 or 1430 for a 1500-byte
// uplink), quoting the packet up to 576 (IPv4) or 1280 (IPv6) bytes, sent
// back out of the port it arrived on with its MAC addresses swapped
// (Batch.Emit: later stages do not see it). The client's stack lowers its
// path MTU and resends.
//
// Accounting: such a packet is not a drop. It is counted in
// EncapStats.ICMPSent and leaves as the worker's TX. Every other oversized
// packet is dropped with reason mtu_exceeded and counted in EncapStats as
// ICMPRateLimited or NoReply. An IPv4 packet without DF is dropped: the
// sender allowed fragmentation, but the Mux does not fragment (it would
// need new buffers per fragment); provision the uplink MTU as client MTU +
// OverheadIPv4 / OverheadIPv6 (1550 or 1570 for 1500-byte clients) and
// such packets never occur. EncapConfig.MTU must be at least MinMTU (1350)
// so that a 1280-byte IPv6 packet always fits: an announced MTU below
// 1280 would be ignored by IPv6 senders (RFC 8201 section 4).
//
// # Decapsulation and local endpoints
//
// Decap accepts only what a Mux sends: to one of the host's addresses
// (DecapConfig.Addrs), optionally only from the Muxes' prefixes
// (DecapConfig.Sources), not fragmented, UDP to the VXLAN port with a
// length equal to the IP payload's, VXLAN with the I flag. It finds the
// endpoint in an Endpoints snapshot by (VNI, inner destination MAC), strips
// the outer headers and parses the inner frame with engine.ParsePacket (so
// Packet.Key carries the VNI). Each failure has its own drop reason.
//
// The endpoint is recorded without a new Packet field: Packet.OutPort is
// its port and Packet.Backend its index in the Endpoints snapshot (Packet.Rule
// is nil, which tells a Host Agent packet from a balanced one). Because the
// EndpointTable may be swapped between two stages of one batch, a later stage
// resolves the endpoint with Endpoints.Of, which checks the index against the
// packet's VNI and inner destination MAC and looks it up again on a
// mismatch.
package encap
