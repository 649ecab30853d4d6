// Package steer is the XDP program that decides which received packets
// reach xdplb's AF_XDP sockets: the data plane's traffic is redirected into
// the socket of its RX queue, everything else (ARP, neighbour discovery,
// BGP, SSH, health probes, the node's own traffic) passes to the kernel.
//
// One program serves the three roles; the map entries decide what it does:
//
//   - Mux uplink: destination rules (DstRule) name the VIPs, optionally
//     narrowed to a protocol and a destination port.
//   - Host Agent uplink: VXLAN rules (VXLANRule) name the local address and
//     UDP port (4789 by default) of VXLAN to this host.
//   - VM port: source rules (SrcRule) name the DIPs (and source ports)
//     whose DSR return traffic the Host Agent rewrites; infrastructure
//     prefixes (Config.Infra) veto them, so a DIP's replies to a health
//     prober or to the host itself reach the kernel.
//
// # Maps
//
//	steer_rules   hash       {kind, proto, port, addr[16]} -> 1; kind is
//	                         dst, vxlan or src, each for IPv4 and IPv6
//	steer_infra   LPM trie   {prefixlen, family, addr[16]} -> 1
//	steer_config  array[1]   which classes of rules exist, so the program
//	                         skips lookups that cannot hit
//	steer_xsks    XSKMAP     RX queue -> AF_XDP socket
//	steer_stats   per-CPU    counters (Stats)
//
// # Matching order
//
// Per packet, first hit wins:
//
//  1. Parse Ethernet with at most one 802.1Q tag (a second tag or a QinQ
//     outer tag is "not IP"), then IPv4 (IHL honoured, tot_len checked
//     against the frame) or IPv6: the fixed header (payload length
//     checked), then up to 8 hop-by-hop, routing, destination options and
//     fragment headers, in any order, each within the payload length, to
//     the upper-layer header — the same set and bound as the data path's
//     parser (header.IPv6.TransportHeader). A header that does not fit or
//     does not add up passes as Malformed, and so does a ninth extension
//     header; so does a TCP or UDP packet whose first fragment does not
//     hold the whole TCP (20 bytes) or UDP (8 bytes) header, or an ICMPv6
//     message shorter than 4 bytes. Nothing is steered unless it parsed.
//  2. ICMPv6 neighbour discovery and MLD (types 130-137, 143) always pass,
//     behind extension headers too (an MLD report carries a hop-by-hop
//     Router Alert).
//  3. Destination rules, most specific first: (dst, proto, dport), then
//     (dst, proto, any port), then (dst, any).
//  4. VXLAN rules: UDP (dst, dport).
//  5. Source rules: (src, sport), then (src, any). On a hit the destination
//     is looked up in the infrastructure trie; a hit there passes the
//     packet (Stats.Infra). That is the same verdict as checking the trie
//     first for role 3, but only packets from a DIP pay for the trie walk.
//     The trie does not affect destination or VXLAN rules.
//  6. Anything else passes (Stats.NoMatch).
//
// A steered packet goes to bpf_redirect_map(steer_xsks, rx_queue_index,
// XDP_PASS): a queue without a socket passes the packet to the kernel
// (Stats.NoSocket), so steering never drops — unless SetDropNoSocket asks
// for it (Stats.NoSocketDropped): a Host Agent's VM ports, where a reply
// passed to the kernel would leave untranslated.
//
// Ports and fragments: only TCP and UDP have ports. A non-first IPv4
// fragment (offset != 0) has none, so it matches only (dst, proto, any
// port), (dst, any) and (src, any) entries; a VIP that receives fragmented
// traffic needs such an entry, or its later fragments go to the kernel.
// IPv6 is the same once the extension headers are walked: a first fragment
// (or an atomic one) has its ports; after a fragment header with a
// non-zero offset the walk stops, and the fragment header's next header is
// the protocol, without ports. Behind an extension header the program does
// not walk (AH, mobility, HIP, shim6, the experimental 253 and 254) the
// upper protocol is unknown and only (dst, any) and (src, any) entries
// match. Other protocols (ICMP, ESP, ...) match (dst, proto, any port) and
// the address-wide entries.
//
// # Lifecycle
//
// Config is the plain spec; Program is the live object. Load creates the
// maps and program (CAP_BPF), Attach hooks it to an interface through a
// bpf_link, RegisterSocket fills the XSKMAP, Sync (or the Steer/Unsteer
// methods) changes rules live, Close detaches and frees everything. A
// bpf_link disappears with the process that holds it, so a crash leaves
// no program behind; a program attached the old way (netlink) by an older
// or crashed run is replaced by Attach. See Program.Attach.
//
// # Build
//
// bpf/steer.c is compiled by bpf2go (see gen.go) into steer_bpfel.go and
// steer_bpfel.o, both committed: building needs no clang. Only the
// little-endian object is generated, so the package builds on
// little-endian architectures (amd64, arm64, ...). The C source is
// dual-licensed GPL-2.0-only OR BSD-2-Clause and declares "Dual BSD/GPL"
// to the kernel (no GPL-only helper is used today; the declaration keeps
// them available); the Go code is Apache-2.0 like the rest of xdplb.
package steer
