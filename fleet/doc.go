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
// (control.Tracker). A node never goes backwards: a document of a lower
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
//	document.commit     JSON: version, committed_at, by — written in the same transaction
//	status/<role>/<name> JSON NodeStatus, under the node's lease
//	health/<host>/<vni>/<dip>/<port> JSON health.Verdict, under the host's lease (HealthPublisher)
//
// The sync delay a node reports is its apply time minus committed_at,
// which the writer's clock records: the writer's and the node's clocks
// must agree (NTP) for it to mean much.
//
// # Scale
//
// Every node reads the whole document on every version, so one etcd
// member sends it once per node: BenchmarkFleetScale (1,000 Host Agents,
// 10,000 DIPs, 16 Muxes in one process; benchmarks/README.md) measures
// what that costs, and what a DIP's failure costs the Muxes.
package fleet
