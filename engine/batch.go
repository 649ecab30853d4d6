package engine

import "github.com/xdplb/xdplb/flow"

// Batch is up to MaxBatch packets that move through a pipeline together,
// with the context a stage needs: the worker it runs on and the time read
// once for the whole batch.
type Batch struct {
	pkts  [MaxBatch]*Packet
	n     int
	drops int // packets marked dropped or emitted and not yet removed

	dropped [MaxBatch]*Packet // removed by Compact, released after TX
	nd      int
	emitted [MaxBatch]*Packet // finished early (Emit), transmitted after the pipeline
	ne      int

	// Worker is the index of the worker running the batch.
	Worker int
	// Now is the time the batch was received, in nanoseconds of the
	// worker's monotonic clock (Clock); stages read it instead of the clock.
	Now int64
	// Counters are the running worker's counters.
	Counters *Counters
	// Snapshot is the configuration the batch runs with: loaded by the
	// worker once per batch (WorkerConfig.Snapshot) before the pipeline
	// runs, nil without one. Stages read their configuration from it —
	// the rules through Batch.Rules, anything else by asserting the type
	// their node publishes — so that every packet of a batch, through
	// every stage, sees one version (see "Snapshots" in the package
	// documentation).
	Snapshot any
}

// RuleSource is a Batch.Snapshot that carries the rule snapshot
// (*flow.Snapshot is one; a node's own snapshot type is another).
type RuleSource interface{ RuleSnapshot() *flow.Snapshot }

// Rules returns the rule snapshot of the batch: its Snapshot's, when that
// is a RuleSource, else own's current one (a stage built with its own
// flow.Rules and run without a worker snapshot: tests, hand-made batches);
// nil if neither.
func (b *Batch) Rules(own *flow.Rules) *flow.Snapshot {
	if rs, ok := b.Snapshot.(RuleSource); ok {
		if s := rs.RuleSnapshot(); s != nil {
			return s
		}
	}
	if own == nil {
		return nil
	}
	return own.Load()
}

// Packets returns the live packets of the batch. Stages may reorder the
// slice's elements but not grow it.
func (b *Batch) Packets() []*Packet { return b.pkts[:b.n] }

// Len returns the number of live packets.
func (b *Batch) Len() int { return b.n }

// Drop marks p dropped with reason r. The pipeline removes it from the
// batch after the stage returns and counts the reason.
func (b *Batch) Drop(p *Packet, r DropReason) {
	if p.Verdict != VerdictDrop {
		p.Verdict = VerdictDrop
		p.Reason = r
		b.drops++
	}
}

// Emit finishes p early: it leaves the batch after the stage returns and is
// transmitted on p.OutPort without running the later stages.
func (b *Batch) Emit(p *Packet) {
	if p.Verdict == VerdictTX {
		p.Verdict = VerdictEmit
		b.drops++
	}
}

// Compact removes dropped and emitted packets from the live set, counting
// drop reasons. Pipelines call it after every stage; it costs nothing when
// no packet was dropped or emitted.
func (b *Batch) Compact() {
	if b.drops == 0 {
		return
	}
	j := 0
	for i := 0; i < b.n; i++ {
		p := b.pkts[i]
		switch p.Verdict {
		case VerdictDrop:
			if b.Counters != nil {
				b.Counters.countDrop(p.Reason)
			}
			b.dropped[b.nd] = p
			b.nd++
			continue
		case VerdictEmit:
			b.emitted[b.ne] = p
			b.ne++
			continue
		}
		b.pkts[j] = p
		j++
	}
	b.n = j
	b.drops = 0
}

// Dropped returns the packets removed by Compact since the batch was reset.
func (b *Batch) Dropped() []*Packet { return b.dropped[:b.nd] }

// Emitted returns the packets finished early with Emit.
func (b *Batch) Emitted() []*Packet { return b.emitted[:b.ne] }

// Finish moves emitted packets back into the live set, for transmission.
// The worker calls it after the pipeline.
func (b *Batch) Finish() {
	for _, p := range b.emitted[:b.ne] {
		p.Verdict = VerdictTX
		b.pkts[b.n] = p
		b.n++
	}
	b.ne = 0
}

// Reset empties the batch, keeping its context.
func (b *Batch) Reset() {
	b.n, b.nd, b.ne, b.drops = 0, 0, 0, 0
}

// add appends p; ports call Append through the Receive contract.
func (b *Batch) Append(p *Packet) bool {
	if b.n == MaxBatch {
		return false
	}
	b.pkts[b.n] = p
	b.n++
	return true
}

// Cap returns how many more packets fit.
func (b *Batch) Cap() int { return MaxBatch - b.n }
