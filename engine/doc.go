// Package engine is xdplb's packet engine: the Packet and Batch types, the
// Stage and Pipeline abstractions, the Port interface with an in-memory
// implementation, and the Worker loop that moves whole batches from a port's
// receive side through a pipeline to the ports' transmit sides.
//
// # Model
//
// A Port receives frames into buffers it owns and transmits frames. A Worker
// polls its input ports; each received Batch (up to MaxBatch packets) runs
// through the input's Pipeline, a sequence of Stages. A Stage handles the
// whole batch in one call and marks packets it refuses with Batch.Drop and a
// DropReason; the pipeline removes dropped packets before the next stage, so
// every stage sees only live packets. Packets left at the end are grouped by
// Packet.OutPort and handed to those ports' Transmit; whatever a port did not
// take is released to the port that owns the frame.
//
// # Hot-path rules
//
// Nothing here allocates per packet: a Worker allocates its packets and batch
// once; frames are read and written in place through header views; a stage
// reads its configuration once per batch (see Snapshots). Counters are per
// worker, single-writer atomics updated once per batch and summed on read,
// so the data path shares no contended cache line.
//
// # Snapshots
//
// Configuration is immutable once published, and a node publishes one
// version of everything its data path reads as one value behind one
// atomic.Pointer. The worker loads it once per batch, before the pipeline
// (WorkerConfig.Snapshot), and hands it to every stage as Batch.Snapshot; a
// stage reads its rules with Batch.Rules and anything else by asserting
// the type its node publishes, and never loads configuration of its own
// while a worker snapshot is there. So every packet of a batch, through
// every stage, sees one version, and a reload is one pointer store. The
// Mux publishes its rules (VIP addresses' VNIs included) this way, the Host Agent its
// rules, local endpoints (encap.EndpointsSource) and NAT view
// (nat.ViewSource). Stages built with their own flow.Rules (or EndpointTable,
// or Translator state) fall back to loading it when run without a worker
// snapshot (tests, hand-made batches). Not yet in the snapshot: the source
// filters' prefix sets (guard), which change only with the infrastructure
// prefixes.
//
// # Frames and headroom
//
// A Packet views a frame inside a larger buffer: Data() is the frame; the
// bytes before it are headroom that Prepend grows into (encapsulation), and
// TrimFront gives bytes back (decapsulation). Ports reserve DefaultHeadroom
// bytes in front of every received frame.
package engine
