package engine

import "sync/atomic"

// Counters are one worker's packet counters. The worker accumulates into
// plain fields while it handles a batch and publishes them once per batch
// with single-writer atomic stores, so readers on other goroutines see
// consistent, race-free values and the data path pays no contended atomic.
type Counters struct {
	// Written by the worker during a batch.
	rx, tx, batches uint64
	drops           [MaxDropReasons]uint64
	dropped         bool // a drop was counted since the last publish

	// Published copies, read by Snapshot.
	pub struct {
		rx, tx, batches atomic.Uint64
		drops           [MaxDropReasons]atomic.Uint64
	}
}

// publish copies the worker-local counts to the published atomics.
func (c *Counters) publish() {
	c.pub.rx.Store(c.rx)
	c.pub.tx.Store(c.tx)
	c.pub.batches.Store(c.batches)
	if !c.dropped {
		return
	}
	c.dropped = false
	for i := range c.drops {
		if v := c.drops[i]; v != 0 && c.pub.drops[i].Load() != v {
			c.pub.drops[i].Store(v)
		}
	}
}

// countDrop counts one dropped packet.
func (c *Counters) countDrop(r DropReason) {
	c.drops[r]++
	c.dropped = true
}

// Stats is a point-in-time sum of counters.
type Stats struct {
	RX, TX, Batches uint64
	// Drops is indexed by DropReason.
	Drops [MaxDropReasons]uint64
}

// Dropped returns the total of all drops.
func (s *Stats) Dropped() uint64 {
	var t uint64
	for _, v := range s.Drops {
		t += v
	}
	return t
}

// DropsByName returns the non-zero drop counts keyed by reason name.
func (s *Stats) DropsByName() map[string]uint64 {
	m := map[string]uint64{}
	names := DropReasons()
	for i, v := range s.Drops {
		if v != 0 && i < len(names) {
			m[names[i]] = v
		}
	}
	return m
}

// Snapshot adds c's published values to s.
func (c *Counters) Snapshot(s *Stats) {
	s.RX += c.pub.rx.Load()
	s.TX += c.pub.tx.Load()
	s.Batches += c.pub.batches.Load()
	for i := range s.Drops {
		s.Drops[i] += c.pub.drops[i].Load()
	}
}
