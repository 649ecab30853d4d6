// Package balance is the Mux's load-balancing stage: for each packet it
// finds the VIP's rule, then the flow's backend — the connection table
// first, so established flows stay where they are across reloads and
// backend changes, else a Maglev pick over the rule's active backends keyed
// by the rule's tuple mode — and records the decision in the packet
// (Packet.Rule, Packet.Backend, Packet.Hash) for the encapsulation stage.
//
// Every Mux with the same configuration and hash seed picks the same
// backend for a new flow, so a flow that moves to another Mux (ECMP
// rehash, a Mux going away) keeps its backend as long as the backend set
// did not change.
//
// # Fragments
//
// A non-first fragment carries no ports. It is balanced only by an
// all-ports rule (VIP port 0) whose mode is 3-tuple or 2-tuple, which
// hashes the first fragment and the rest alike; otherwise it is dropped
// with reason "fragment". A first fragment is balanced like any packet.
// Serve VIPs that must accept fragmented traffic with a 3-tuple or 2-tuple
// all-ports rule.
package balance

import (
	"errors"
	"math/bits"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// Drop reasons of the stage.
var (
	DropFragment = engine.RegisterDropReason("fragment")     // a non-first fragment no rule can place
	DropConnFull = engine.RegisterDropReason("conn_refused") // the connection table refused a new flow
)

// Config is the plain configuration of a Stage.
type Config struct {
	// Rules is the published configuration; loaded once per batch.
	Rules *flow.Rules
	// Conns is the connection table; nil balances statelessly (Maglev
	// only), which keeps flows in place only while the backend set is
	// unchanged.
	Conns *flow.ConnTable
	// Hasher must be configured with the fleet's seed.
	Hasher flow.Hasher
	// DropOnConnFull drops new flows the connection table refuses;
	// otherwise (the default) they are forwarded to their Maglev pick
	// without an entry, and counted.
	DropOnConnFull bool
}

// Stage is the balancing stage. It is safe for concurrent use by the
// workers of one engine.Engine (distinct Batch.Worker indices).
//
// It works on a batch in two passes: the first finds every packet's rule,
// computes its flow hash and prepares its connection-table lookup
// (flow.ConnTable.Prepare: the buckets' cache misses of the whole batch in
// flight together, and the independent hash computations overlapping); the
// second finishes the lookups and places the flows.
type Stage struct {
	cfg     Config
	queries engine.PerWorker[[engine.MaxBatch]flow.ConnQuery]
}

// New returns a Stage for cfg.
func New(cfg Config) (*Stage, error) {
	if cfg.Rules == nil {
		return nil, errors.New("balance: Config.Rules is nil")
	}
	return &Stage{cfg: cfg}, nil
}

// Process implements engine.Stage.
func (s *Stage) Process(b *engine.Batch) {
	snap := s.cfg.Rules.Load()
	pkts := b.Packets()
	ct := s.cfg.Conns
	if ct == nil {
		for _, p := range pkts {
			if r := s.stateless(snap, p); r != 0 {
				b.Drop(p, r)
			}
		}
		return
	}
	qs := s.queries.Get(b.Worker)
	if qs == nil {
		qs = new([engine.MaxBatch]flow.ConnQuery) // a hand-made batch: no worker index
	}
	now := ct.Now()
	// Pass 1: rule, hash and the prepared lookup of every packet; live
	// marks the packets pass 2 places.
	var live uint64
	for i, p := range pkts {
		r, reason := s.rule(snap, p)
		if reason != 0 {
			b.Drop(p, reason)
			continue
		}
		p.Rule = r
		p.Hash = s.cfg.Hasher.Hash(&p.Key, r.Mode)
		if p.Flags&engine.FlagFragment == 0 {
			ct.Prepare(&qs[i], &p.Key)
		}
		live |= 1 << uint(i)
	}
	// Pass 2: finish the lookups, place the flows.
	for ; live != 0; live &= live - 1 {
		i := bits.TrailingZeros64(live)
		p := pkts[i]
		if r := s.place(snap, p, &qs[i], now); r != 0 {
			b.Drop(p, r)
		}
	}
}

// rule finds p's rule, or why there is none.
func (s *Stage) rule(snap *flow.Snapshot, p *engine.Packet) (*flow.Rule, engine.DropReason) {
	r := snap.Lookup(&p.Key)
	if r == nil {
		return nil, engine.DropNoRule
	}
	if p.Flags&engine.FlagNonFirstFrag != 0 && (r.VIP.Port != 0 || r.Mode == flow.Tuple5) {
		// Only an all-ports rule hashing no ports can place it.
		return nil, DropFragment
	}
	return r, 0
}

// stateless balances p by its hash alone (no connection table).
func (s *Stage) stateless(snap *flow.Snapshot, p *engine.Packet) engine.DropReason {
	r, reason := s.rule(snap, p)
	if reason != 0 {
		return reason
	}
	p.Rule = r
	p.Hash = s.cfg.Hasher.Hash(&p.Key, r.Mode)
	idx, ok := r.Pick(p.Hash)
	if !ok {
		return engine.DropNoBackend
	}
	p.Backend = int32(idx)
	return 0
}

// place decides p's backend (p.Rule and p.Hash set, q prepared unless p is
// a fragment).
func (s *Stage) place(snap *flow.Snapshot, p *engine.Packet, q *flow.ConnQuery, now flow.Tick) engine.DropReason {
	r := p.Rule
	ct := s.cfg.Conns
	if p.Flags&engine.FlagFragment != 0 {
		// Fragments are placed by hash alone: the first fragment and the
		// rest must agree, and the rest have no ports to key an entry.
		idx, ok := r.Pick(p.Hash)
		if !ok {
			return engine.DropNoBackend
		}
		p.Backend = int32(idx)
		return 0
	}

	if p.Flags&engine.FlagICMPError != 0 {
		// An ICMP error goes where its flow goes; it neither creates nor
		// advances an entry.
		idx := -1
		if id, _, ok := ct.LookupPrepared(q, now); ok {
			if br, i, found := snap.Backend(id); found && br == r && r.Backends[i].State != flow.BackendDown {
				idx = i
			}
		}
		if idx < 0 {
			var ok bool
			if idx, ok = r.Pick(p.Hash); !ok {
				return engine.DropNoBackend
			}
		}
		p.Backend = int32(idx)
		return 0
	}

	class := p.StateClass()
	if id, cur, ok := ct.LookupPrepared(q, now); ok {
		if br, idx, found := snap.Backend(id); found && br == r && r.Backends[idx].State != flow.BackendDown {
			p.Backend = int32(idx)
			if next := cur.Advance(class); next != cur {
				ct.SetClassPrepared(q, next, now)
			}
			return 0
		}
		// The backend went away or down: the flow is re-placed below.
	}
	idx, ok := r.Pick(p.Hash)
	if !ok {
		return engine.DropNoBackend
	}
	p.Backend = int32(idx)
	p.Flags |= engine.FlagNewFlow
	if class == flow.ClassEstablished {
		// A flow first seen mid-connection (a Mux restarted, or ECMP moved
		// it here) starts untrusted like a SYN and is promoted by its next
		// packet, so a flood of stray ACKs cannot fill the table with
		// long-lived entries.
		class = flow.ClassUntrusted
	}
	if res := ct.InsertPrepared(q, r.Backends[idx].ID, class, now); !res.Stored() {
		if s.cfg.DropOnConnFull {
			return DropConnFull
		}
	}
	return 0
}
