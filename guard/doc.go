// Package guard holds the data path's defences against spoofed sources
// and forwarding loops, as engine stages both roles compose:
//
//   - Sources drops a packet whose client address — the source of a
//     request, or the destination of a reply on the Host Agent's return
//     path — is a VIP (src_vip), a martian (src_martian: 0.0.0.0/8,
//     127.0.0.0/8, 224.0.0.0/4, 255.255.255.255; ::, ::1, ff00::/8,
//     ::ffff:0:0/96), the node's own address (src_node) or in an
//     infrastructure prefix (src_infra). The VIP set is the rules
//     snapshot's (flow.Snapshot.HasVIPAddr), loaded once per batch, so a
//     reload that adds or removes a VIP changes the filter in the same
//     pointer store that changes the rules. The node and infrastructure
//     prefixes are an immutable set swapped whole (SetPrefixes). A
//     packet from an acceptable client but sent to a link-layer broadcast
//     or multicast address is dropped too (link_group): a router must not
//     forward it (RFC 1812 5.3.4), and every node on the segment would
//     forward a copy.
//   - TTL decrements the IPv4 TTL (updating the header checksum
//     incrementally, RFC 1624) or the IPv6 hop limit of every packet the
//     node routes, and drops with ttl_exceeded the ones whose TTL or hop
//     limit is 1 or 0. Check and Decrement are the same two steps for a
//     stage that needs something in between (encap.Encap checks before,
//     and decrements after, its MTU check, so that a fragmentation needed
//     error quotes the packet as it arrived, as a router does).
//
// Why: one spoofed UDP datagram VIP:7 → VIP:7 makes the DIP's echo
// service answer VIP:7 → VIP:7, which the Host Agent sends to the router,
// which sends it to a Mux, which balances it to a DIP again: without a
// filter and without a TTL that goes down, it loops for ever. Sources
// breaks the loop where it starts (the Mux, and the Host Agent's inbound
// and return paths); TTL bounds any loop nobody thought of.
//
// # ICMP time exceeded
//
// A packet whose TTL runs out is dropped and counted (ttl_exceeded); no
// ICMP time-exceeded message is sent. The data path has no address of its
// own on the client's network to send one from but the VIP, whose echo the
// Mux already answers, and a Mux that answered expiring packets would give
// a spoofer a reflector with a rate limit as its only bound. Traceroute
// through a VIP therefore shows no hop for the Mux or the Host Agent.
//
// # ICMP errors from infrastructure
//
// An ICMP error (destination unreachable, packet too big, time exceeded,
// parameter problem) whose source is in an infrastructure prefix is not
// dropped: a router on the path sends those about VIP flows (path MTU
// discovery for the DSR replies), and routers' link addresses are often in
// the infrastructure prefixes. An ICMP error from a VIP, a martian or the
// node itself is dropped like any packet.
//
// Both stages are safe for concurrent use by the workers of an engine and
// allocate nothing per packet.
package guard
