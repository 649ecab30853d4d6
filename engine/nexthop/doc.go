// Package nexthop tells the data path where to send a frame: for a
// destination IP it returns the egress interface, the source MAC and the
// next hop's MAC, taken from the kernel's FIB (RTM_GETROUTE) and neighbour
// tables. The kernel stays the single source of routing truth (routes from
// BGP, static routes, ECMP); xdplb only caches its answers.
//
// # The stage
//
// Stage is the data path's next-hop stage, for both node roles: per
// packet it resolves the outer destination (OuterDst: what a Mux's
// encap.Encap wrote) or the packet's own L3 destination (L3Dst: the client
// of a Host Agent's direct-server-return reply) through a Source — a
// *Resolver in production — writes the hop's MACs, and picks the worker
// port of the hop's interface (StageConfig.Ports). A miss is dropped with
// nexthop_unresolved while the resolver resolves the address, or handed
// to the kernel through a slow-path port (StageConfig.SlowPath,
// engine/rawip). Answers are cached per worker while the Source's
// version holds. Static is a Source with fixed answers, for tests,
// examples and data paths whose next hops never change.
//
// # Hot path
//
// Resolver.Lookup (or Snapshot.Lookup, with the snapshot loaded once per
// batch) is one atomic load and a few reads of immutable tables: no lock,
// no allocation, never a wait. A miss returns false at once (the caller
// drops the packet with reason nexthop_unresolved, or sends it through the
// kernel) and queues the destination with a non-blocking send; the queue
// is drained and de-duplicated by Run, which publishes a new immutable
// snapshot behind an atomic.Pointer once per batch of changes.
//
// A snapshot holds two kinds of entries:
//
//   - prefix entries, one answer for every destination in a prefix, in a
//     multibit trie per family (8-bit strides, prefixes expanded over the
//     slots they cover). A lookup walks one node per byte of the longest
//     cached prefix on its path and keeps the last entry seen: the
//     longest match, at most 4 steps for IPv4 however many prefixes are
//     cached. The tries are rebuilt when a prefix entry changes; there are
//     tens to hundreds of them.
//   - destination entries, in a persistent hash trie: a keyed hash
//     (random secrets, so spoofed sources cannot pile up in one place)
//     picks one of 256 directories and one of its 256 leaves, a small
//     open-addressed array. A change copies one leaf, one directory and
//     the 2 KiB top array, so a publish costs O(entries changed) whatever
//     the number cached; older snapshots stay intact for their readers.
//
// Lookup tries the prefix entries first, then the destination entries.
//
// # Prefix entries
//
// A Host Agent resolves the destination of every reply: the client's
// address. Clients are the Internet, a million of them within an idle
// timeout, nearly all behind one or two gateway routes. One entry per
// client would cost a netlink round trip and an entry each; instead, when
// a destination's route has a gateway, Run asks the kernel which FIB entry
// matched (RTM_GETROUTE with RTM_F_FIB_MATCH, Linux ≥ 4.13; checked on
// 6.18) and caches the answer for a prefix: every other client inside is
// answered by Lookup at once, with no miss and no netlink request.
//
// The prefix is not simply the route's. A longer route inside it (a
// connected subnet, the host's own addresses in the local table, a route
// in another table, a policy rule selecting by destination) changes the
// kernel's answer for part of it. Run mirrors the destination prefixes of
// all routes of all tables (dumped when it subscribes, then followed
// through the route notifications) and of the rules (read when it
// subscribes and on every refresh), in a binary trie; the entry's prefix
// is the shortest one around the destination, inside the matched route,
// that holds none of them. With a default route, the connected
// 198.18.1.0/24 and the loopback routes, a client at 10.1.2.3 gets
// 0.0.0.0/2: a quarter of the Internet in one entry (a million random
// clients take about 50 IPv4 entries). Prefix entries therefore never
// overlap a route boundary, nor each other once Run has settled. The
// mirror counts the routes it holds and errs only on the safe side: a
// prefix kept too long (a route deleted without notification, as the
// kernel does for IPv4 routes of a downed link) only cuts entries smaller.
//
// Prefix caching applies only to single-path unicast gateway routes whose
// FIB entry agrees with the answer for the destination. Destinations stay
// entries of their own when they are on-link (each is its own neighbour),
// behind a multipath route (the kernel picks the path per destination,
// with a hash we cannot reproduce), or cannot be resolved (no route,
// local, blackhole...). Config.DisablePrefixCache turns prefix entries
// off altogether.
//
// Assumptions: the answer the kernel gives a route lookup by destination
// alone holds for every address of a prefix entry. That is true of
// routes and of rules selecting by destination (both split prefixes);
// rules selecting by source, mark or interface are not considered, as
// with destination entries (RTM_GETROUTE is asked with the destination
// only). Rule changes are seen at the next refresh, not at once (the
// kernel's rule notifications are not followed). ICMP redirects accepted
// into the kernel's routing cache change the gateway of single
// destinations: a prefix entry ignores them (set accept_redirects=0, or
// disable prefix caching). For IPv6 without a preferred source on the
// route, Hop.Src is the source the kernel chose for the representative
// destination; the kernel may choose another for other destinations
// (RFC 6724 rule 8). The mirror of route prefixes costs about 24 bytes
// per bit of prefix not shared with another route: negligible for a host,
// tens of megabytes with a full Internet table.
//
// # Keeping it current
//
// Run subscribes to the kernel's neighbour, route and link notifications
// before it dumps the neighbour table and the routes, so its mirrors
// cannot miss a change. A neighbour update re-evaluates only the entries
// using that neighbour (a gateway's MAC updates every prefix entry through
// it), with no FIB lookup. A route update for prefix P re-resolves, after
// a short settle delay that folds a burst of route changes into one pass,
// the entries overlapping P (a prefix entry containing P or inside it)
// and those whose gateway is inside P; a prefix entry is resolved again
// through its representative, the destination it was learned from, and
// gives way to whatever that answer is (a smaller prefix cut around a
// new route, the route's prefix again once a route inside it is gone).
// Destinations the new answer no longer covers miss once and are resolved
// again as new. A prefix entry that overlaps a newly learned one, or
// holds a destination the kernel now answers for alone, is resolved again
// at once. So no answer a route change made wrong outlives the settle
// delay. A link update re-resolves the entries leaving through that link.
// A change of nexthop objects (routes added with `nhid N`: with
// net.ipv4.nexthop_compat_mode=0 the kernel sends no route notification
// for the routes using a changed object) re-resolves every entry after
// the settle delay.
// Every RefreshInterval every entry is resolved again and the mirror is
// reloaded (the rules always, the routes when there are at most 65536 of
// them), as a safety net; if the kernel overruns a subscription socket
// Run resubscribes, dumps again and resolves everything again. A route
// query that fails without an answer (EINTR, ENOBUFS, a socket error; not
// the kernel's "no route", cached like any answer) changes nothing cached:
// an entry keeps its answer, a new destination stays a miss, so that the
// next Lookup asks again, and either is asked again at the next
// RetryInterval tick (Stats.RouteErrors counts such failures). Entries of
// both kinds not looked up for IdleTimeout are forgotten; every idle sweep
// publishes a new version, so that data-path caches (Stage's) look up
// again, and mark as used, the destinations they keep sending to.
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
// next hop; such destinations are cached one by one. A kernel without
// RTM_F_FIB_MATCH answers with the destination's own /32 or /128, so every
// destination is cached on its own. Only Ethernet egress interfaces are
// supported. Resolution needs Linux; elsewhere NewResolver returns
// ErrNotSupported.
package nexthop
