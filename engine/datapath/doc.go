// Package datapath builds a node's AF_XDP data path from a description:
// the interfaces it serves and how many RX queues of each, a pipeline per
// input, the steering rules of every interface, the workers and the
// slow-path port. Both of xdplb's nodes (package mux, package hostagent)
// build theirs with it, and so can a custom node.
//
// # Spec, then live object
//
// A Spec is a plain value: Validate checks it without touching the system
// (names, duplicates, queue and worker counts, steering rules, the AF_XDP
// port template), and Spec.Layout says which port index means what. Open
// makes it live, in the network namespace of the calling thread and in
// this order:
//
//  1. each interface is resolved and its RX queues counted, and a steering
//     program (engine/steer) is loaded for it with the interface's rules;
//  2. the slow-path port (engine/rawip) is opened, when the spec asks;
//  3. an AF_XDP socket (engine/afxdp) is opened on each served queue of
//     each interface and registered in that interface's program;
//  4. Spec.Pipeline is called once per (interface, worker), and the
//     workers (engine.Worker) and their engine.Engine are made;
//  5. the programs are attached: from then on the steered traffic
//     reaches the sockets and waits in their rings until the workers run;
//  6. last, when building beside a running data path, the programs both
//     share take the new rules (see below).
//
// If any step fails, Open releases everything it made — programs
// detached and closed, sockets closed, slow path closed — and returns the
// error; a foreign XDP program on an interface fails step 5
// (steer.ErrForeignProgram). The caller runs DataPath.Engine and, once it
// has stopped, calls Close.
//
// # Port numbering
//
// Every worker numbers its ports the same way, so a packet's OutPort means
// the same interface in every worker and each worker transmits only on
// sockets it owns:
//
//   - port i (0 ≤ i < len(Spec.Interfaces)) is the socket of
//     Spec.Interfaces[i] on the worker's own queue: data ports first, in
//     spec order;
//   - port len(Spec.Interfaces) is the slow-path port, right after them,
//     when Spec.SlowPath is set;
//   - after that come receive-only sockets: an interface with more served
//     queues than there are workers has its queue q read by worker
//     q % workers, which transmits nothing on it.
//
// Worker w owns queue w of every interface, so there are at most as many
// workers as the interface with the fewest served queues has queues
// (Spec.Workers 0 means that many). Layout.Port and Layout.Slow give the
// numbers a pipeline's stages need (a next-hop stage's egress port, the
// slow path) before anything is opened.
//
// # Building beside a running data path
//
// Open with a running data path (beside) builds a new one next to it
// without stopping it: the interfaces both serve are shared — the new data
// path takes the running one's steering programs, attached, and its
// sockets, bound and registered, and only resyncs the programs' rules live
// to the new spec's (engine/steer Program.Sync keeps unchanged entries
// steered throughout), so nothing is detached or unbound at the swap and
// what arrives while the workers are replaced waits in the rings. What only
// the new spec serves is built whole while the running one forwards;
// whatever fails there (a foreign XDP program on a new interface, an
// interface without the queues, no memory for the rings) fails Open before
// anything of the running data path is touched: the shared programs'
// rules are resynced last, and set back if that fails. An interface both serve that was deleted and
// recreated, or whose queues changed, under the running data path cannot
// be shared (a queue takes one socket): Open fails with
// ErrInterfaceChanged.
//
// Then either the new data path wins — stop the running one's workers,
// call TakeOver (which releases what of the old one the new one does not
// share) and run the new workers — or it is dropped with Discard, which
// gives the shared programs their previous rules back and leaves the
// running one as it was. The slow-path port is never shared: each data
// path opens its own.
//
// # Platforms
//
// Open needs Linux (AF_XDP, XDP, raw sockets) and root or CAP_BPF,
// CAP_NET_ADMIN and CAP_NET_RAW; elsewhere it fails with the packages'
// ErrNotSupported errors. Spec, Validate and Layout work everywhere.
package datapath
