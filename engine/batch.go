package engine

// Batch is up to MaxBatch packets that move through a pipeline together,
// with the context a stage needs: the worker it runs on and the time read
// once for the whole batch.
type Batch struct {
	pkts  [MaxBatch]*Packet
	n     int
	drops int // packets marked dropped and not yet removed

	dropped [MaxBatch]*Packet // removed by Compact, released after TX
	nd      int

	// Worker is the index of the worker running the batch.
	Worker int
	// Now is the time the batch was received, in nanoseconds of the
	// worker's monotonic clock (Clock); stages read it instead of the clock.
	Now int64
	// Counters are the running worker's counters.
	Counters *Counters
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

// Compact removes dropped packets from the live set, counting their
// reasons. Pipelines call it after every stage; it costs nothing when no
// packet was dropped.
func (b *Batch) Compact() {
	if b.drops == 0 {
		return
	}
	j := 0
	for i := 0; i < b.n; i++ {
		p := b.pkts[i]
		if p.Verdict == VerdictDrop {
			if b.Counters != nil {
				b.Counters.countDrop(p.Reason)
			}
			b.dropped[b.nd] = p
			b.nd++
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

// Reset empties the batch, keeping its context.
func (b *Batch) Reset() {
	b.n, b.nd, b.drops = 0, 0, 0
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
