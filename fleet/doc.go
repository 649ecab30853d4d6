// Package fleet keeps a fleet of xdplb nodes on one desired-state document
// held in etcd, and lets every node say what it runs.
//
// One document (package control's format, with a nodes section for what
// each Mux sets for itself) serves every Mux and Host Agent. An operator
// writes it with Apply (the xdplbctl command): validated by the same
// parser as the nodes, refused unless its version is above the stored
// one, and written with a compare-and-swap transaction, so two operators
// cannot overwrite each other's change unseen; while etcd elects a new
// leader (a member died) Apply tries again, so an operator's apply goes
// through a member's death. Each node runs a Source
// (a control.Source): it reads the document at start, then watches it,
// and applies each newer version by the same rules as a file
// (control.Tracker). A Mux reads the whole document (but neither parses
// nor applies a version whose commit record says only the version
// changed: its content sum is the running one's); a Host Agent reads
// only its host's view of it (HostView: its VMs, the VIPs they serve with
// only its own backends, every VIP's address for its client filters, the
// outbound sections and inbound NAT rules it needs, as a document its
// parser accepts), which Apply writes beside the document for every
// host — a few kilobytes per host instead of the whole document per
// host, and a VIP added rewrites only its backends' hosts' views. A node never goes backwards: a document of a lower
// version, or of an older etcd revision than the running one (a store
// restored from an old backup), is refused and reported. A node that
// loses etcd keeps forwarding on its last applied version — the data path
// never waits for the control plane — and catches up when etcd returns.
//
// Every node reports what it runs with a Reporter: a status key under a
// lease (a node gone is a key gone), holding its role, applied version
// and revision, when it applied it, its sync delay, its last error and
// the state of its data path. Status reads them all, with the document,
// so that an operator sees which version is live where ("version 12:
// 9/10 Muxes, 40/40 hosts").
//
// # Keys
//
// Under a prefix (DefaultPrefix, "/xdplb/"):
//
//	document            the document, as written (YAML)
//	document.commit     JSON: version, committed_at, by, sum (the text's, version line left out) — written in the same transaction
//	views/<host>        YAML, gzip-compressed: the host's view of the document (HostView), of the version that last changed it
//	views.sums/<host>   the view's sum (its version left out), written with it, read by Apply only
//	views.vips          YAML, gzip-compressed: every view's last key, vip_addresses (every VIP's address), stored once
//	views.commit        JSON, like document.commit — written in the document's transaction, after the views
//	apply.claim         JSON: who applies, under the applier's lease, while views go in several transactions
//	status/<role>/<name> JSON NodeStatus, under the node's lease
//	health/<host>/<vni>/<dip>/<port> JSON health.Verdict, under the host's lease (HealthPublisher)
//	ports/claims/<vip>/<first> JSON PortClaim, under the holder's lease (PortAllocator)
//	ports/guards/<vip>/<first> JSON PortClaim, no lease; a cooling lease once the claim is gone
//	ports.sweeper/<lease> a PortAllocator's host name, under its lease: the sweeper election (the first created sweeps)
//
// The sync delay a node reports is its apply time minus committed_at,
// which the writer's clock records: the writer's and the node's clocks
// must agree (NTP) for it to mean much.
//
// # Views
//
// Apply writes a view only when it changed (its sum, version left out,
// differs from the stored one's), and deletes the views of hosts the
// document no longer lists. When the views that changed fit in the
// document's transaction (MaxTxnOps operations, a megabyte), everything
// is one transaction. Otherwise Apply takes apply.claim (create-only,
// under a lease it keeps alive; another Apply meanwhile gets
// ErrApplyInProgress), writes the views in transactions within the
// limits, each on condition that the claim is still its own, and then
// writes the document, document.commit and views.commit in one
// transaction on condition that the document and the claim are as it
// found them, deleting the claim. A Host Agent's Source watches
// views.commit; on each commit it reads its view as of the commit's
// revision (views written since belong to an apply under way, or to one
// that died half way, which the next apply writes over), so it never
// runs half of a set. When etcd has compacted its history past that
// revision (an apply died half way, and the cluster compacted since), its
// view as committed is gone: the Source then reads the document, which
// Apply wrote in the commit's transaction, and runs the view it makes
// from it (HostView) — a whole document read once, where a view is read
// otherwise; only if the document is not the one committed with the
// views (written around Apply) is there nothing complete to run: the
// Source says so (ErrNoCommittedView) and waits for an apply to complete. The Source reads its view followed by views.vips:
// every view ends with the same list of VIP addresses, which Apply stores
// once, so that a VIP added or removed rewrites that key and the views of
// the VIP's backends' hosts, not every view; a host whose view was not
// rewritten runs it with the new addresses, as the commit's version. A
// view and addresses the commit left as they were are neither read nor
// parsed again: the Source compares their revisions in the transaction
// that reads the commit, and advances the running view to the commit's
// version (control.Tracker.Advance), so the host reports the fleet's
// version. Versions stay monotonic: a commit of a lower version, or an
// older revision, is refused like a stale document.
//
// # Outbound port ranges
//
// A VM's outbound connections are translated to its VIP's address with
// ports of ranges its DIP holds: the document's static ranges, and
// ranges its Host Agent claims in etcd with a PortAllocator. The Muxes
// follow the claims with an AllocationWatcher and send the replies on a
// port to the host of the DIP holding it.
//
// A range is one unit of the VIP's pool (control.Outbound), unit-aligned,
// never a static one. It has two keys, written together in one
// transaction: its claim, under the claiming Host Agent's lease, and its
// guard, the same record without a lease. The transaction is
// create-only: it succeeds only if no claim and no guard lies in the
// range's ports, so a range has one holder at a time; a host that loses
// the race counts a conflict and tries another range (hosts start at
// random places in the pool, so they seldom race).
//
// A Host Agent claims before it needs: every DIP holds MinRanges ranges
// before its first connection, so that no first packet waits for etcd;
// when the ports in use (distinct ports, from the Host Agent's usage
// callback: a port serves many connections to different remote
// endpoints) pass HighWater of a DIP's ports, it claims enough units to
// be under the mark again. A range without a connection for Idle is
// returned: withdrawn from the Host Agent first, then, if the usage read
// after that still shows no connection on it, its claim and guard are
// deleted (compared on the claim's revision) and it is free at once; a
// return etcd gave no answer to may have taken effect, so its range stays
// withdrawn and the delete is tried again. A range with a connection is
// never returned.
//
// The guard is what keeps a dead Host Agent's ports from another DIP
// while its connections' packets may still come back. When its lease
// ends (the Host Agent died, or was cut off from etcd for a TTL), etcd
// deletes its claims; its guards stay, naming its host and DIP. The Muxes
// keep sending those ranges' replies to its host for as long as the
// guards live. Another host that needs a range and finds such a guard
// starts its guard time: it puts the guard again, unchanged, under a new
// lease of Guard = TTL + MaxConnTimeout (the NAT's longest connection
// timeout) that nobody keeps alive, on condition that the guard is as it
// read it and no claim lies in its ports; when etcd expires that lease
// it deletes the guard, and only then is the range free. No clock of
// ours decides it: the guard time is counted by etcd's leader, the
// timer that expires the Host Agents' own leases, which the rest of the
// fleet trusts already; and it starts only after the holder's lease has
// ended (the claim was gone when the claimer looked), so a connection of
// the dead holder is at least TTL + MaxConnTimeout older than any
// claim by another DIP of its port. A leader change only lengthens a
// lease (etcd renews them all on election), never shortens it.
//
// A guard in a pool nobody claims from any more — its outbound section
// removed from the document, or its dead host removed while the pool's
// other DIPs hold what they need — would wait for such a claimer
// forever: the Muxes would keep its range as the dead host's, and a pool
// added back would find it guarded. So the fleet's sweeper, one
// PortAllocator, sweeps the fleet's guards now and then (Sweep, 10
// minutes on average) and starts the guard time of those whose claim is
// gone and that no one cools yet, as a claimer would (counted in Swept),
// on the same conditions: the guard as it read it, no claim in its
// ports. The sweeper is elected in etcd (a concurrency.Election under
// ports.sweeper, every allocator a candidate under its own lease):
// when it stops or its lease is lost, another is elected and sweeps.
// A sweep reads every claim and guard key of the fleet, so one sweeper,
// not every Host Agent, keeps the fleet's cost at one sweep per Sweep
// however many hosts there are; its read of the keys and its writes
// compare its election key, so an allocator that lost its lease sweeps no more even
// before it knows (Counters says which allocator sweeps). A sweep
// starts no guard time sooner than a claimer could, so it hands no port
// to another DIP sooner; a Host Agent away for longer than a sweep and a
// guard time may find its ranges gone even in a pool with room, and
// claims others.
//
// The same host and DIP may take its guarded ranges back at once, cooling
// or not: its ports go back to the DIP whose connections hold them. That
// is how a Host Agent that restarts (a new lease) keeps its connections:
// it takes back every range whose claim (under its old lease, still
// alive if it came back within a TTL) or guard names it. A Host Agent
// that stops does not revoke its lease, so a restart within the TTL is
// not seen by the Muxes at all. A Host Agent cut off from etcd keeps
// translating with the ranges it had and takes them back when it gets a
// new lease; a range another DIP got meanwhile (only after a guard time)
// is withdrawn then.
//
// A VIP's unit should not change under running claims: ranges of the
// old size stay until returned, and while every claimer's read leaves
// their ports out, the create-only compare covers only keys that start
// within the new range's ports, so a Host Agent still on the old
// document claiming a larger range at the same moment could overlap.
// Change the unit together with the pool's ports, or drain the claims
// first.
//
// While etcd is away nothing changes: the Host Agent keeps its ranges and
// claims no more (its DIPs' connections get ports while their ranges
// have some); the Muxes keep the last allocations.
//
// # Scale
//
// A Mux reads the whole document on every version, a Host Agent its view
// when it changed and a small commit record otherwise:
// BenchmarkFleetScale (1,000 Host Agents, 10,000 DIPs, 16 Muxes in one
// process; benchmarks/README.md) measures what that costs, and what a
// DIP's failure costs the Muxes.
package fleet
