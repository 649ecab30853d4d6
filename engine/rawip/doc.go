// Package rawip is an engine.Port that hands IP packets to the kernel's
// own IP output through raw sockets (IPPROTO_RAW, header included): the
// kernel routes each packet, resolves the next hop's MAC (queueing the
// packet while it asks), and sends it. It is the data path's slow path for
// frames it cannot address itself — above all the first packets to a
// destination the next-hop resolver has not resolved yet, which would
// otherwise be dropped (nexthop.StageConfig.SlowPath).
//
// Transmit strips the Ethernet header (and any 802.1Q tags) and sends the
// IPv4 or IPv6 packet as it is: addresses, TTL and checksums are the
// data path's; the kernel fills in only the IPv4 header checksum. One
// system call per packet: meant for a trickle, not for line rate. The port
// never receives. It is safe for concurrent use: one Port may serve every
// worker.
//
// Raw sockets need CAP_NET_RAW, and the packets leave from the network
// namespace the Port was opened in. On other systems than Linux, Open
// fails with ErrNotSupported.
package rawip
