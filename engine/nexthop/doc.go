// Package nexthop tells the data path where to send a frame: for a
// destination IP it returns the egress interface, the source MAC and the
// next hop's MAC, taken from the kernel's FIB (RTM_GETROUTE) and neighbour
// tables. The kernel stays the single source of routing truth (routes from
// BGP, static routes, ECMP); xdplb only caches its answers.
//
// # Hot path
//
// Resolver.Lookup (or Snapshot.Lookup, with the snapshot loaded once per
// batch) is one atomic load and one map read keyed by the 16-byte address:
// no lock, no allocation, never a wait. A miss returns false at once (the
// caller drops the packet with reason nexthop_unresolved) and queues the
// destination with a non-blocking send; the queue is drained and
// de-duplicated by Run, which publishes a new immutable snapshot
// (copy-on-write behind an atomic.Pointer) once per batch of changes.
//
// # Keeping it current
//
// Run subscribes to the kernel's neighbour, route and link notifications
// before it dumps the neighbour table, so its mirror of that table cannot
// miss a change. A neighbour update re-evaluates only the destinations
// using that neighbour, with no FIB lookup; a route update for prefix P
// re-resolves only the destinations (and gateways) inside P, after a short
// settle delay that folds a burst of route changes into one pass; a link
// update re-resolves the destinations leaving through that link. Every
// RefreshInterval all destinations are resolved again as a safety net, and
// if the kernel overruns a subscription socket Run resubscribes and resolves
// everything again.
//
// # Making the kernel resolve a neighbour
//
// Our frames bypass the kernel stack, so the kernel never has a packet that
// would make it send an ARP request or neighbour solicitation, nor traffic
// that would confirm an entry. The resolver asks for resolution through
// netlink (RTM_NEWNEIGH) in one of two ways, both verified on Linux 6.18:
//
//   - managed entries (default): an entry flagged NTF_EXT_MANAGED
//     (Linux ≥ 5.16, `ip neigh add ADDR dev DEV managed`). The kernel probes
//     at once and keeps re-probing, so the entry stays REACHABLE with no
//     traffic and tracks a changed MAC; an unanswered one stays INCOMPLETE
//     and keeps being probed. The resolver turns entries it made managed
//     back into ordinary ones when it forgets a destination and when Run
//     ends (an NTF_USE update clears the flag and keeps the entry's state).
//   - NTF_USE (Config.DisableManaged, or automatically on kernels without
//     managed entries): the equivalent of the kernel having a packet to
//     send: one probe sequence, ending REACHABLE, or FAILED after the
//     configured probes (about 3 s). The resolver retries FAILED and
//     INCOMPLETE neighbours every RetryInterval and re-probes STALE ones
//     every RefreshInterval.
//
// A destination whose neighbour is STALE, DELAY or PROBE is resolved (the
// kernel still holds a MAC for it), as the kernel itself would send to it.
//
// # Limits
//
// For a multipath route the kernel picks one path per destination (hashed
// on the addresses only), so all flows to one destination leave by the same
// next hop. Only Ethernet egress interfaces are supported. Resolution needs
// Linux; elsewhere NewResolver returns ErrNotSupported.
package nexthop
