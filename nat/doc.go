// Package nat is the Host Agent's stateful NAT (Ananta's host agent):
// two pipeline stages that translate a VIP's traffic to the local DIP that
// serves it and back, so that VMs see their own address while clients only
// ever see the VIP, and replies go straight to the client without passing
// through a Mux (Direct Server Return); and the source NAT (SNAT) of the
// connections VMs open to the outside with a VIP as their source.
//
//	uplink RX → parse → vxlan decap → Inbound  (VIP:vport → DIP:dport) → TX VM port
//	                                    └ no rule: SNAT in  (VIP:vport → DIP:sport, an outbound connection's reply)
//	VM RX     → parse (VM's VNI)    → Return   (DIP:dport → VIP:vport) → next hop → TX uplink
//	                                    └ no DSR connection: SNAT out (DIP:sport → VIP:vport, or untranslated to a local prefix)
//
// A Translator (New) holds what both stages share: the rules (flow.Rules,
// the same versioned VIP → pool configuration the Muxes run), the DIPs this
// node hosts (DIPs, keyed by VNI and address), the connection Table, the
// infrastructure prefixes and the counters. Its Inbound and Return stages
// are engine.Stages, safe for concurrent use by every worker.
//
// # Inbound
//
// After decapsulation the packet's key is (VNI, client:cport → VIP:vport).
// The rule is the one the Mux used (Snapshot.Lookup: exact port, then the
// VIP's all-ports rule). Its backend is the one hosted here (a Local in the
// rule's VNI) whose MAC is the inner Ethernet destination: the Mux writes the
// chosen backend's MAC there, and it is the only trace of the Mux's choice
// when several DIPs of a pool share this host. A backend configured without a
// MAC matches any frame, after the backends whose MAC matches; give
// backends MACs when several DIPs of one pool may share a host. The
// destination becomes DIP:dport, dport being Backend.Port, or the VIP port
// when that is 0, and the connection is recorded.
//
// # State
//
// The Table is a flow.ConnTable keyed by the connection's return key, the
// key the VM's replies parse to: (VNI, proto, DIP:dport → client:cport). Its
// value is the backend's ID, which flow.Snapshot keeps stable across
// reloads, so state survives rule changes that keep the backend. The VIP
// address comes from the backend's rule; the VIP port is the rule's port,
// or, for an all-ports rule, the DIP port when the backend preserves ports.
// An all-ports rule whose backend has a fixed port maps many VIP ports to
// one, so those connections also keep the VIP port in a side table (see
// Table). Every connection is entered untrusted, whatever its first packet,
// and earns its class as on the Mux (flow.ConnTable.Next): a client packet
// that is not a SYN, FIN or RST arriving ProveAfter (200 ms) or more after
// the entry was stored promotes it to established (TCP) or udp (other
// protocols); a proven connection moves to closing on a FIN or RST from
// either side. The VM's packets never promote: its RST answering a flood's
// spoofed ACK leaves that entry untrusted. Untrusted entries are evictable
// and live one untrusted timeout from their insert, so floods of spoofed
// SYNs, FINs, RSTs, ACKs or datagrams cannot fill the table with
// long-lived entries, and proven entries are capped
// (flow.ConnTableConfig.ProvenShare) so new connections always find room.
// The Host Agent has no per-VIP share of its own: the Mux's limits a VIP's
// new flows before they reach a host (those it forwards without an entry
// still arrive, and are untrusted here).
//
// # Return
//
// A reply is looked up by its own key. On a hit the backend must still
// exist, be local and be the packet's source, else the entry is stale. On a
// miss (the agent restarted, the entry expired, or it is stale) the reply is
// translated statelessly when exactly one rule has a local backend whose
// address and port are the reply's source, in the VM port's VNI and the
// reply's protocol; its VIP port must be derivable (not an all-ports rule
// with a fixed backend port), and a TCP SYN without ACK, which opens a
// connection, is never taken for a reply, nor a SYN-ACK, which answers a
// direct connection (below). No rule or several: dropped,
// nat_no_state (several also count in Stats.Ambiguous). The stateless path records
// nothing: the client's next packet does, through Inbound.
//
// # Infrastructure
//
// Traffic whose client side (the source inbound, the destination on return;
// for an ICMP error, the client of the connection it quotes) is inside
// Config.Infra — health probers, Muxes, the node itself — is never
// translated, by state or statelessly: the steering program passes it to the
// kernel, and a packet that reaches a stage anyway is dropped as nat_infra.
//
// # Tenants
//
// Every key carries the VNI: the rules', the table's, the locals' and the
// stateless index's. Two tenants may use the same VIP and DIP addresses in
// different VNIs and never see each other's translations or state.
//
// # Fragments
//
// A first fragment carries the ports and is translated like a whole packet
// (the incremental checksum update is right for the reassembled datagram).
// A non-first fragment has no ports, so it names no rule and no connection;
// it is translated by address when the address is unambiguous: inbound,
// (VNI, proto, VIP, inner destination MAC) must map to one local DIP address
// (the Mux sends all fragments of a datagram to one DIP only with a 3- or
// 2-tuple rule, see package balance); on return, (VNI, proto, DIP) must be a
// local backend of rules of one VIP address. Otherwise it is dropped as
// nat_fragment. (engine.Parse currently refuses a first UDP fragment, whose
// UDP Length exceeds the fragment.)
//
// # ICMP errors
//
// ICMP and ICMPv6 errors (destination unreachable, fragmentation needed or
// packet too big, time exceeded, parameter problem) are translated through
// the packet they quote, in both directions, so that path MTU discovery
// works across the NAT. Inbound, an error a router sends about a VIP reply
// (forwarded by the Mux to the connection's DIP, see package balance)
// quotes VIP:vport → client:cport: the outer destination and the quoted
// source become the DIP endpoint, chosen like the connection's packets. On
// return, an error the VM sends about a client packet quotes client:cport →
// DIP:dport: the outer source and the quoted destination become the VIP
// endpoint, found by state or statelessly. The quoted IPv4 header checksum,
// the quoted TCP or UDP checksum (when the quote holds it whole) and the
// ICMP checksum stay right. An IPv6 quote's ports are found behind its
// extension headers (destination options, a first fragment's Fragment
// header, ...), as in a packet itself. Errors never create or change state.
// A quote too short for the ports, a quoted non-first fragment or an IPv6
// quote whose extension chain is cut, too long or malformed is dropped as
// bad_l4.
//
// # Direct connections
//
// A DIP's service port is also reached without the VIP: by a neighbour VM
// (east-west, on the same host or another), by other hosts, by operators.
// Such a connection's packets towards the VM never pass Inbound (they are
// not in VXLAN from a Mux: the host's kernel forwards them), but the
// steering program sends the VM's answers from its service port to Return
// like any reply. Rule: a TCP SYN-ACK without NAT state answers a SYN that
// did not come through the VIP — through the VIP, Inbound would have
// recorded it — so Return remembers the connection as direct (its entry
// holds flow.ReservedID, in the established class, closing on FIN or RST;
// like any promotion within the table's cap on proven entries, and
// untrusted, evictable, while the cap is reached, so that a VM's SYN-ACKs
// never take the room new connections need) and passes it and every later packet of it untranslated to
// Config.Direct — the slow path, whose kernel routes them — counted in
// Stats.Direct and Stats.DirectFlows; without Config.HasDirect they are
// dropped as nat_direct. A client packet of the same 5-tuple arriving
// through the VIP later makes it a VIP connection again.
//
// Limits: the rule needs to see the handshake. A direct connection already
// open when the agent (re)started, and a direct UDP exchange with a VIP
// service port, have no SYN-ACK to tell them apart from VIP traffic whose
// state was lost: they take the stateless path and are translated, which
// breaks them. Conversely, a VIP connection whose SYN-ACK leaves the VM
// while its state is missing (the agent restarted between the SYN and the
// SYN-ACK, or the table refused the entry) is taken for a direct one; the
// client's retransmitted SYN through the VIP restores it.
//
// # Outbound connections
//
// A SNAT (Config.SNAT) translates the connections that VMs listed in an
// outbound section open: source DIP:sport becomes VIP:vport, vport a port
// of a range allocated to the DIP (SNAT.SetAllocations: a Host Agent's
// static ranges from the document and those it claimed in etcd). Outbound
// packets leave on the uplink like DSR replies, straight to the router;
// the replies reach a Mux, whose range table sends them to this host
// (VXLAN in the DIP's VNI), and come back through Inbound. See SNAT for
// its state, how ports are chosen and reused (unique per remote
// endpoint), and how connections are tracked and expire.
//
// Return hands the SNAT an outbound DIP's packet that no DSR connection
// claims: a TCP SYN at once (a SYN is never a reply); any other packet
// first by the SNAT's state, then, if it has none, after the stateless
// DSR match failed (a DIP's reply on its service port stays DSR), when
// it connects. A destination in the section's local prefixes is
// east-west traffic: never translated, passed to Config.Direct (the
// kernel) as it is, counted in SNATStats.Local. Inbound hands the SNAT a
// packet to a VIP address that no rule matches (a pool port: the pool
// never holds the address's inbound ports); without state it is dropped
// as snat_no_state when the address is an outbound VIP, as nat_no_rule
// otherwise. Translated packets carry engine.FlagOutbound. A DIP that is
// a backend of an all-ports rule (ports preserved) and outbound is
// ambiguous for the first packet of a connection that is not a TCP SYN
// (a UDP datagram): the stateless DSR match takes it.
//
// The SNAT translates TCP and UDP, and ICMP and ICMPv6 echo (ping): an
// echo request's identifier is its port, taken from the same ranges and
// rewritten (the ICMP checksum updated); the echo reply to the VIP, which
// a Mux's range table sends by its identifier, gets the VM's identifier
// back. An echo request is never a DSR reply (a ping is answered by echo
// replies), so an outbound DIP's ping is the SNAT's even when the DIP
// backs a VIP's ICMP rule. An ICMP or ICMPv6 error to an outbound VIP
// that quotes an outbound connection's packet (VIP:vport → remote:rport,
// or a ping: VIP → remote with identifier vport) — fragmentation needed
// or packet too big, destination or port unreachable, time exceeded — is
// translated to the DIP like the DSR errors above: the outer destination
// and the quoted source (a quoted echo's identifier too), every checksum
// kept right, the state untouched. An IPv6 quote's extension headers
// are skipped as for the DSR errors, and the quotes those drop are
// dropped alike; so is (bad_l4) a quote cut before the end of the echo
// header, like one cut before the ports. An outbound DIP's packets of
// other protocols (and ICMP messages other than echo requests) leave
// untranslated on Config.Direct (SNATStats.Passed), as its traffic did
// before it was steered to the data path; errors the VM itself sends
// about an outbound connection's packets are not translated
// (nat_no_state). New connections without a free port
// are dropped (snat_exhausted), the table's refusals too
// (snat_table_full); counters in SNATStats, flushed per batch with the
// stages' own. Non-first fragments of outbound connections are not
// translated by the source NAT: without ports they cannot be told from a
// DSR reply's fragments, so where the DIP is the local backend of rules
// of a single VIP address in that VNI and protocol they leave with that
// VIP's address, as a reply's would, and otherwise they are dropped
// (nat_fragment).
//
// # Workers and hashing
//
// The two directions of a connection arrive on different ports (uplink and
// VM port) and, with RSS (which cannot be steered at all on veth), on
// whichever queues and workers the NICs choose. The stages are correct
// whatever worker sees whichever direction: the Table is shared and
// lock-free, so the worker handling a reply reads the entry another worker
// wrote. Nothing is sharded per worker. For a later stage that does need a
// per-flow choice that agrees for both directions (an ECMP next hop, a
// software steering ring), Config.SetHash makes both stages store in
// Packet.Hash the symmetric hash (flow.Hasher.SymmetricHash) of the
// client-facing key, client ↔ VIP, which is the same value for a request and
// its reply.
//
// # Configuration changes
//
// Each stage loads the rules snapshot and the locals once per batch and uses
// a view precomputed from that pair: the local backends of each rule, the
// stateless index and the fragment maps. Translator.Sync builds the view of
// a new pair from the control plane; otherwise the first worker to see it
// builds it, and the others keep using the previous view, which is
// consistent in itself, until it is published. A batch never mixes two
// configurations.
//
// # Hot path
//
// Per packet the stages do one VIP lookup and one table lookup (inbound),
// or one table lookup and one backend-ID lookup (return), plus the
// checksum-preserving rewrite from package header. Nothing allocates;
// counters are added to a per-worker stripe once per batch; drops carry a
// reason (nat_no_rule, nat_no_local_backend, nat_no_state, nat_infra,
// nat_fragment, nat_direct, snat_exhausted, snat_no_state,
// snat_table_full, and the engine's bad_l4 for an unreadable ICMP
// quote). An outbound connection's packet costs a DSR table miss (or a
// rule miss) and one SNAT table lookup, plus one of the other
// direction's entry every 1/64 of its timeout.
//
// # Limits
//
// No NAT64: a backend whose address family differs from its VIP's is never
// chosen (and never local). The backends' health state is the Mux's
// business: the host translates what it receives, for draining and down
// backends too.
package nat
