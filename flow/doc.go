// Package flow holds what the load balancer's data path knows about flows:
// how a flow is named, hashed, assigned to a backend, remembered, and which
// configuration it is judged against.
//
// # Keys
//
// A Key names a flow: VNI (tenant), IP protocol, source and destination
// address and port. It is a fixed-size comparable value (addresses are
// 16-byte arrays, IPv4 in the first four bytes), filled without allocation
// by Key.SetIPv4 and Key.SetIPv6 from header bytes, and Key.Reverse gives
// the other direction.
//
// # Hashing
//
// Hasher computes the fleet-wide flow hash, a named and versioned algorithm
// (HashVersion, "xdplb-hash-v2": four 64×64→128-bit multiply-mixes with
// keys drawn from a configured seed, over a fixed 42-byte layout of the
// key). Every Mux of a fleet must use the same seed,
// so that they all send a flow to the same backend and a flow survives
// ECMP moving it between Muxes. Hasher.Hash covers the 5-, 3- or 2-tuple
// (TupleMode); Hasher.SymmetricHash gives both directions of a flow the
// same hash by ordering the endpoints before hashing. Neither allocates.
//
// # Maglev
//
// Maglev is a weighted Maglev consistent-hashing table (Eisenbud et al.,
// NSDI '16), also named and versioned (MaglevVersion, "maglev-v1"): built
// from (Name, Weight) pairs, it maps a flow hash to a backend so that load
// follows weights, every Mux builds the same table from the same set in any
// order, and removing a backend moves few flows of the others. A weight of
// 0 drains a backend. Lookup is one multiply and one load. A rule without a
// table size gets MaglevAutoSize(pool size): at least 4093 slots and 100
// per listed backend, on a ladder of primes, so that many VIPs stay small
// and a health change never resizes a table.
//
// # Connection table
//
// ConnTable remembers which backend each established flow was sent to, so
// that flows keep their backend when the Maglev table changes (a backend
// added, drained or reweighted). It is lock-free for readers, allocated
// once for its Capacity, uses only as much of that as its flows need (the
// part in use grows with them, so a few flows stay in a few pages), and
// ages entries by protocol state. Built with the fleet's Hasher
// (ConnTableConfig.Hasher) it places a key by the key's 5-tuple flow hash,
// so a stage that has hashed the key for Maglev hands that hash over
// (ConnTable.PrepareHashed) and each packet is hashed once. Large tables
// ask the kernel for transparent huge pages.
//
// # Rules
//
// Rules is the data path's view of configuration: an immutable, versioned
// Snapshot of VIP → pool rules published with an atomic pointer; it also
// knows every VIP address and its VNI (HasVIPAddr, VIPAddrVNI). A worker
// loads the snapshot once per batch, finds a packet's Rule by VIP
// (Snapshot.Lookup: exact port first, then the VIP's all-ports rule) and
// picks a backend for a new flow with Rule.Pick. Rules.Update applies a new
// version whole or not at all, rebuilding only the Maglev tables whose
// backends changed. Snapshot.ReplaceRules is the cheap path for health:
// it replaces some rules' backend states and shares everything else (other
// rules, their tables, backend IDs) with the running snapshot.
//
// The balance step of a Mux, per packet, is therefore: find the rule
// (snap.Lookup(&key); nil means the packet is not for a VIP), keep the
// backend the ConnTable remembers for the flow if any, else pick one with
// rule.Pick(hasher.Hash(&key, rule.Mode)) and remember it.
package flow
