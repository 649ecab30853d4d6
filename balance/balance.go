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
// A packet that matches no rule may be a reply to a VM's source-NATed
// outbound connection: the stage looks it up in the range table of the
// batch's snapshot (Returns) and sends it to the owner of its port, not
// balanced; see Returns.
//
// # Fragments
//
// A non-first fragment carries no ports. It is balanced only by an
// all-ports rule (VIP port 0) whose mode is 3-tuple or 2-tuple, which
// hashes the first fragment and the rest alike; otherwise it is dropped
// with reason "fragment". A first fragment is balanced like any packet.
// Serve VIPs that must accept fragmented traffic with a 3-tuple or 2-tuple
// all-ports rule.
//
// # Floods
//
// Every new flow enters the connection table untrusted, whatever its first
// packet, and is promoted only by the trust rule of flow.ConnTable.Next (a
// later packet, not a SYN, FIN or RST, at least ProveAfter after the
// entry was stored). Untrusted entries are evictable and short-lived, so
// floods of spoofed SYNs, FINs, RSTs, ACKs or datagrams cannot push out
// proven flows. On top of that each VIP's untrusted entries are held to a
// share of the table (Config.VIPShare): every worker may enter
// VIPShare × Capacity / 2 / Workers new flows per VIP in each window of
// one untrusted timeout (entries of at most two windows are alive at
// once), a promotion gives its flow's place back, and a VIP past its share
// has its new flows forwarded to their Maglev pick without an entry
// (counted as share refusals). One attacked VIP thus cannot take the table
// from the others. Stage.Stats and Stage.VIPStats count inserts,
// evictions, promotions, refusals and share refusals.
package balance

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

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
	// Hasher must be configured with the fleet's seed. When Conns was
	// built with the same (flow.ConnTableConfig.Hasher), a 5-tuple rule's
	// packets are hashed once: the Maglev hash also places the flow in the
	// connection table (flow.ConnTable.PrepareHashed).
	Hasher flow.Hasher
	// DropOnConnFull drops new flows the connection table refuses;
	// otherwise (the default) they are forwarded to their Maglev pick
	// without an entry, and counted.
	DropOnConnFull bool
	// VIPShare is the share of the connection table's Capacity one VIP's
	// untrusted (new, not yet proven) flows may hold, in (0, 1]; 0 selects
	// DefaultVIPShare, 1 turns the limit off. A VIP past its share — under
	// a flood of spoofed new flows — has its further new flows forwarded
	// to their Maglev pick without an entry (counted as share_refused), so
	// that the other VIPs' new flows keep finding room. See "Floods" in the
	// package documentation.
	VIPShare float64
	// Workers is how many workers share the stage's budget (the Mux's
	// queues); 0 means 1. Each worker gets 1/Workers of every VIP's share.
	Workers int
	// Clock returns the table tick, read once per batch; nil means
	// Conns.Now. Tests drive time with it.
	Clock func() flow.Tick
}

// DefaultVIPShare is Config.VIPShare's default: one VIP's new flows may
// hold half the table's Capacity.
const DefaultVIPShare = 0.5

// Stats are a Stage's connection-table counters: of one VIP
// (Stage.VIPStats) or of all (Stage.Stats), summed over workers.
type Stats struct {
	Inserted     uint64 // new flows entered (always untrusted)
	Evicted      uint64 // of those, stored over another flow's idle or untrusted entry
	Promoted     uint64 // untrusted flows that proved themselves (flow.ConnTable.Next)
	Refused      uint64 // new flows the table could not store (both buckets full of proven flows, or busy)
	ShareRefused uint64 // new flows not entered because their VIP was past its share
}

func (s *Stats) add(c *[numStats]uint64) {
	s.Inserted += c[sInserted]
	s.Evicted += c[sEvicted]
	s.Promoted += c[sPromoted]
	s.Refused += c[sRefused]
	s.ShareRefused += c[sShareRefused]
}

// Stage is the balancing stage. It is safe for concurrent use by the
// workers of one engine.
//
// With a connection table, Process works in two passes over the batch so
// that the table's cache misses overlap: the first finds every packet's
// rule and hash and starts its lookup (flow.ConnTable.Prepare, or
// PrepareHashed with the rule's hash when that is the table's too), the
// second finishes the lookups and places the flows.
type Stage struct {
	cfg     Config
	oneHash bool   // Conns places keys by cfg.Hasher: a 5-tuple hash serves both
	budget  uint32 // new flows per VIP, per worker and window; 0: no limit
	window  flow.Tick
	clock   func() flow.Tick
	queries engine.PerWorker[[engine.MaxBatch]flow.ConnQuery]
	workers engine.PerWorker[workerState]
	other   workerState // batches made outside a worker (no index), under mu
	mu      sync.Mutex
}

// Counter indexes.
const (
	sInserted = iota
	sEvicted
	sPromoted
	sRefused
	sShareRefused
	numStats
)

type counters [numStats]atomic.Uint64

func (c *counters) load() (out [numStats]uint64) {
	for i := range c {
		out[i] = c[i].Load()
	}
	return out
}

// workerState is one worker's counters and per-VIP budgets. Only its
// worker writes it; rebind swaps its slices under Stage.mu, so that Stats
// and VIPStats read them under Stage.mu.
type workerState struct {
	c counters // all VIPs

	snap  *flow.Snapshot // the snapshot used and vips are indexed for
	start flow.Tick      // the current window's start
	used  []uint32       // new flows entered in this window, by Rule.ID
	vips  []counters     // by Rule.ID
	// retired are the counters of rules no longer in the snapshot, by
	// rule name.
	retired map[string][numStats]uint64
}

// New returns a Stage for cfg.
func New(cfg Config) (*Stage, error) {
	if cfg.Rules == nil {
		return nil, errors.New("balance: Config.Rules is nil")
	}
	if cfg.VIPShare == 0 {
		cfg.VIPShare = DefaultVIPShare
	}
	if !(cfg.VIPShare > 0 && cfg.VIPShare <= 1) {
		return nil, fmt.Errorf("balance: Config.VIPShare must be in (0, 1], got %v", cfg.VIPShare)
	}
	if cfg.Workers < 0 {
		return nil, fmt.Errorf("balance: Config.Workers must not be negative, got %d", cfg.Workers)
	}
	s := &Stage{cfg: cfg, clock: cfg.Clock}
	if ct := cfg.Conns; ct != nil {
		if s.clock == nil {
			s.clock = ct.Now
		}
		if h := ct.Hasher(); h != nil && h.Seed() == cfg.Hasher.Seed() {
			s.oneHash = true
		}
		if cfg.VIPShare < 1 {
			// Untrusted entries live at most one untrusted timeout from
			// their insert (lookups do not extend it), so the entries of
			// at most two windows are alive at once: a window's budget is
			// half the share.
			w := max(cfg.Workers, 1)
			s.budget = uint32(max(1, int(cfg.VIPShare*float64(ct.Config().Capacity)/2)/w))
		}
		s.window = max(flow.Ticks(ct.Config().Timeouts.Untrusted), 1)
	}
	return s, nil
}

// count adds one to counter k of rule r and of the total.
func (st *workerState) count(r *flow.Rule, k int) {
	st.c[k].Add(1)
	st.vips[r.ID][k].Add(1)
}

// admit reports whether rule r may enter one more new flow at now, and
// counts it; false counts a share refusal.
func (s *Stage) admit(st *workerState, r *flow.Rule, now flow.Tick) bool {
	if s.budget == 0 {
		return true
	}
	if now-st.start >= s.window {
		clear(st.used)
		st.start = now
	}
	if st.used[r.ID] >= s.budget {
		st.count(r, sShareRefused)
		return false
	}
	st.used[r.ID]++
	return true
}

// release gives back the budget of a flow of rule r that proved itself:
// its entry no longer counts against the VIP's untrusted share. (A flow
// entered in an earlier window gives back some of this window's budget,
// which errs by at most the promotions of one window.)
func (s *Stage) release(st *workerState, r *flow.Rule) {
	if s.budget != 0 && st.used[r.ID] > 0 {
		st.used[r.ID]--
	}
}

// rebind indexes st's budgets and counters for snap (a reload): rules keep
// their window's use and their counters by name; the counters of removed
// rules are kept by name.
func (s *Stage) rebind(st *workerState, snap *flow.Snapshot, locked bool) {
	if !locked {
		s.mu.Lock()
		defer s.mu.Unlock()
	}
	if st.snap != nil && sameIDs(st.snap, snap) {
		// A health change (flow.Snapshot.ReplaceRules) keeps every rule
		// at its ID: nothing to move, nothing to allocate.
		st.snap = snap
		return
	}
	used := make([]uint32, snap.Len())
	vips := make([]counters, snap.Len())
	if st.snap != nil {
		byName := make(map[string]*flow.Rule, snap.Len())
		for _, r := range snap.Rules() {
			byName[r.Name] = r
		}
		for _, old := range st.snap.Rules() {
			c := st.vips[old.ID].load()
			if nr := byName[old.Name]; nr != nil {
				used[nr.ID] = st.used[old.ID]
				for i := range c {
					vips[nr.ID][i].Store(c[i])
				}
				continue
			}
			if c != ([numStats]uint64{}) {
				if st.retired == nil {
					st.retired = map[string][numStats]uint64{}
				}
				sum := st.retired[old.Name]
				for i := range c {
					sum[i] += c[i]
				}
				st.retired[old.Name] = sum
			}
		}
	}
	st.snap, st.used, st.vips = snap, used, vips
}

// sameIDs reports whether a and b have the same rule, by name, at every
// ID.
func sameIDs(a, b *flow.Snapshot) bool {
	ra, rb := a.Rules(), b.Rules()
	if len(ra) != len(rb) {
		return false
	}
	for i := range ra {
		if ra[i].ID != rb[i].ID || ra[i].Name != rb[i].Name {
			return false
		}
	}
	return true
}

// Add adds o's counters to s.
func (s *Stats) Add(o Stats) {
	s.Inserted += o.Inserted
	s.Evicted += o.Evicted
	s.Promoted += o.Promoted
	s.Refused += o.Refused
	s.ShareRefused += o.ShareRefused
}

// SumVIPStats sums the VIPStats of several stages (a node's workers each
// have one), by VIP name.
func SumVIPStats(stages ...*Stage) map[string]Stats {
	out := map[string]Stats{}
	for _, st := range stages {
		for name, v := range st.VIPStats() {
			sum := out[name]
			sum.Add(v)
			out[name] = sum
		}
	}
	return out
}

// HashesOnce reports whether the stage hands the connection table the
// hash it computed for a 5-tuple rule's Maglev pick, so that such a
// packet's key is hashed once, not twice: Config.Conns was built with
// the fleet's flow hash of Config.Hasher's seed
// (flow.ConnTableConfig.Hasher).
func (s *Stage) HashesOnce() bool { return s.oneHash }

// Conns returns the stage's connection table (Config.Conns), nil when it
// balances statelessly.
func (s *Stage) Conns() *flow.ConnTable { return s.cfg.Conns }

// Now returns the stage's current tick (Config.Clock, or the connection
// table's clock), as Begin reads it for a batch; 0 without a connection
// table.
func (s *Stage) Now() flow.Tick {
	if s.clock == nil {
		return 0
	}
	return s.clock()
}

// Stats sums the counters of every VIP and worker.
func (s *Stage) Stats() Stats {
	var out Stats
	s.workers.Range(func(_ int, st *workerState) bool {
		c := st.c.load()
		out.add(&c)
		return true
	})
	s.mu.Lock()
	c := s.other.c.load()
	s.mu.Unlock()
	out.add(&c)
	return out
}

// VIPStats returns the counters by VIP (rule name), over every worker,
// including VIPs removed since (by their last name).
func (s *Stage) VIPStats() map[string]Stats {
	out := map[string]Stats{}
	s.mu.Lock()
	defer s.mu.Unlock()
	add := func(name string, c *[numStats]uint64) {
		if *c == ([numStats]uint64{}) {
			return
		}
		v := out[name]
		v.add(c)
		out[name] = v
	}
	each := func(st *workerState) {
		for name, c := range st.retired {
			add(name, &c)
		}
		if st.snap == nil {
			return
		}
		for _, r := range st.snap.Rules() {
			c := st.vips[r.ID].load()
			add(r.Name, &c)
		}
	}
	s.workers.Range(func(_ int, st *workerState) bool { each(st); return true })
	each(&s.other)
	return out
}

// Process implements engine.Stage.
func (s *Stage) Process(b *engine.Batch) {
	var ps Pass
	s.Begin(b, &ps)
	defer ps.End()
	ps.Run(b.Packets())
}

// Pass is the stage's run over one batch, for a caller that runs the
// stage packet by packet among other stages' work (the Mux's fused
// stage): Begin; Prepare for every packet, in batch order; then Place,
// in the same order, for every packet Prepare asked to place (Run does
// both); End. Process is exactly that. Between Begin and End the worker's counters
// and budgets are the pass's.
type Pass struct {
	s      *Stage
	b      *engine.Batch
	snap   *flow.Snapshot
	qs     *[engine.MaxBatch]flow.ConnQuery
	now    flow.Tick
	ret    batchReturns // the range table, loaded at the first packet without a rule
	st     *workerState
	locked bool // st is s.other, under s.mu
	// settled marks, by index, the packets Place found in an entry of
	// their own class that the packet left as it was (Settled); seen
	// holds, for those, the entry's last-seen tick after the lookup.
	settled uint64
	seen    [engine.MaxBatch]flow.Tick
}

// Begin readies ps for batch b: its rules, its time, the worker's state.
func (s *Stage) Begin(b *engine.Batch, ps *Pass) {
	*ps = Pass{s: s, b: b, snap: b.Rules(s.cfg.Rules)}
	if s.cfg.Conns == nil {
		return
	}
	ps.qs = s.queries.Get(b.Worker)
	if ps.qs == nil {
		ps.qs = new([engine.MaxBatch]flow.ConnQuery) // a hand-made batch: no worker index
	}
	ps.now = s.clock()
	if ps.st = s.workers.Get(b.Worker); ps.st == nil {
		s.mu.Lock()
		ps.st, ps.locked = &s.other, true
	}
	if ps.st.snap != ps.snap {
		s.rebind(ps.st, ps.snap, ps.locked)
	}
}

// End releases what Begin took.
func (ps *Pass) End() {
	if ps.locked {
		ps.s.mu.Unlock()
	}
}

// Prepare is the first half of the stage's work on p, the i-th packet of
// the batch: it finds p's rule and hash and starts its connection-table
// lookup, and reports whether p goes on to Place; or it places p by
// itself (a reply to an outbound connection, or any packet of a stage
// without a connection table), or returns why p must be dropped, which
// the caller does (Batch.Drop).
func (ps *Pass) Prepare(i int, p *engine.Packet) (engine.DropReason, bool) {
	s := ps.s
	ct := s.cfg.Conns
	if ct == nil {
		r := s.stateless(ps.snap, p)
		if r == engine.DropNoRule {
			r = s.returning(&ps.ret, ps.b, p) // a reply to an outbound connection: to its owner
		}
		return r, false
	}
	r, reason := s.rule(ps.snap, p)
	if reason == engine.DropNoRule {
		reason = s.returning(&ps.ret, ps.b, p) // a reply to an outbound connection: to its owner, not balanced
	}
	if reason != 0 || r == nil {
		return reason, false // r nil: placed by returning
	}
	p.Rule = r
	p.Hash = s.cfg.Hasher.Hash(&p.Key, r.Mode)
	switch {
	case p.Flags&engine.FlagFragment != 0:
	case s.oneHash && r.Mode == flow.Tuple5:
		ct.PrepareHashed(&ps.qs[i], &p.Key, p.Hash) // the key is hashed once
	default:
		ct.Prepare(&ps.qs[i], &p.Key)
	}
	return 0, true
}

// Run is the stage's work on pkts, the batch's packets in order (an
// index into pkts is the packet's i for Prepare and Place): Prepare for
// every packet still to be transmitted (one an earlier step dropped or
// emitted is skipped), then Place for every packet Prepare asked to
// place, so that the connection-table lookups of the whole batch overlap;
// what either refuses is dropped (Batch.Drop).
func (ps *Pass) Run(pkts []*engine.Packet) {
	b := ps.b
	// Pass 1: rule, hash and the prepared lookup of every packet; live
	// marks the packets pass 2 places.
	var live uint64
	for i, p := range pkts {
		if p.Verdict != engine.VerdictTX {
			continue
		}
		r, place := ps.Prepare(i, p)
		if r != 0 {
			b.Drop(p, r)
		}
		if place {
			live |= 1 << uint(i)
		}
	}
	// Pass 2: finish the lookups, place the flows.
	for ; live != 0; live &= live - 1 {
		i := bits.TrailingZeros64(live)
		p := pkts[i]
		if r := ps.Place(i, p); r != 0 {
			b.Drop(p, r)
		}
	}
}

// Place is the second half of the stage's work on p, the i-th packet of
// the batch, which Prepare asked to place: it finishes the lookup and
// decides p's backend, or returns why p must be dropped.
func (ps *Pass) Place(i int, p *engine.Packet) engine.DropReason {
	r, seen, settled := ps.s.place(ps.st, ps.snap, p, &ps.qs[i], ps.now)
	if settled {
		ps.settled |= 1 << uint(i)
		ps.seen[i] = seen
	}
	return r
}

// Settled reports whether Place placed p, the i-th packet of the batch,
// by a proven flow's connection-table entry — established TCP or UDP, at
// a backend that is up — whose class p's own (engine.Packet.StateClass)
// leaves as it is: the next packets of the flow of that class will be
// placed the same way, by the same entry, as long as the snapshot holds
// and the entry is refreshed (flow.ConnTable.RefreshAfter). The Mux's
// fast path keeps such decisions.
func (ps *Pass) Settled(i int) bool { return ps.settled&(1<<uint(i)) != 0 }

// Seen returns, for a packet Settled reports, the entry's last-seen tick
// as the lookup left it (refreshed, or as it was). The next lookup of the
// flow refreshes the entry once it lags by more than
// flow.ConnTable.RefreshAfter from this tick, not from the lookup's: a
// caller keeping the decision looks up again by then, so that the entry
// is last seen when it would be with a lookup for every packet. (Not
// later than the entry's tick: when another worker's clock wrote it
// after this pass read its own, the pass's tick.)
func (ps *Pass) Seen(i int) flow.Tick { return ps.seen[i] }

// rule finds p's rule, or why there is none. A rule an earlier stage left
// in p.Rule (the Mux's uplink VNI stage) is taken when it is the one
// Lookup would find (flow.Snapshot.LookupHint).
func (s *Stage) rule(snap *flow.Snapshot, p *engine.Packet) (*flow.Rule, engine.DropReason) {
	r := snap.LookupHint(&p.Key, p.Rule)
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
// a fragment); settled reports what Pass.Settled does, seen what
// Pass.Seen does.
func (s *Stage) place(st *workerState, snap *flow.Snapshot, p *engine.Packet, q *flow.ConnQuery, now flow.Tick) (_ engine.DropReason, seen flow.Tick, settled bool) {
	r := p.Rule
	ct := s.cfg.Conns
	if p.Flags&engine.FlagFragment != 0 {
		// Fragments are placed by hash alone: the first fragment and the
		// rest must agree, and the rest have no ports to key an entry.
		idx, ok := r.Pick(p.Hash)
		if !ok {
			return engine.DropNoBackend, 0, false
		}
		p.Backend = int32(idx)
		return 0, 0, false
	}

	if p.Flags&engine.FlagICMPError != 0 {
		// An ICMP error goes where its flow goes; it neither creates nor
		// advances an entry, nor keeps one alive: anyone who knows a
		// flow's addresses and ports can send errors that quote it.
		idx := -1
		if e, _, ok := ct.PeekPrepared(q, now); ok {
			if i, found := snap.Place(r, e); found && r.Backends[i].State != flow.BackendDown {
				idx = i
			}
		}
		if idx < 0 {
			var ok bool
			if idx, ok = r.Pick(p.Hash); !ok {
				return engine.DropNoBackend, 0, false
			}
		}
		p.Backend = int32(idx)
		return 0, 0, false
	}

	class := p.StateClass()
	if e, cur, age, last, ok := ct.LookupPreparedSeen(q, now); ok {
		// The entry names the backend by ID and where it was
		// (flow.Rule.Entry): one comparison while it is still there.
		idx, found := r.EntryIndex(e) // inlined; the lookup by ID when a reload moved the backend
		if !found {
			idx, found = snap.Place(r, e)
		}
		if found && r.Backends[idx].State != flow.BackendDown {
			p.Backend = int32(idx)
			if cur == class && (cur == flow.ClassEstablished || cur == flow.ClassUDP) {
				// A proven flow's packet of its own class: Next leaves
				// the entry as it is; last is its last-seen now.
				return 0, last, true
			}
			if next := ct.Next(cur, class, age); next != cur {
				if ct.SetClassPrepared(q, next, now) && cur == flow.ClassUntrusted {
					st.count(r, sPromoted)
					s.release(st, r)
				}
			}
			return 0, 0, false
		}
		// The backend went away or down: the flow is re-placed below.
	}
	idx, ok := r.Pick(p.Hash)
	if !ok {
		return engine.DropNoBackend, 0, false
	}
	p.Backend = int32(idx)
	p.Flags |= engine.FlagNewFlow
	// Every new flow starts untrusted, whatever its first packet, and
	// earns a long-lived class only by proving itself (ConnTable.Next):
	// spoofed SYN, FIN, RST, ACK or UDP floods fill the table with
	// evictable entries only. A VIP past its share is not entered at all.
	if !s.admit(st, r, now) {
		return 0, 0, false
	}
	switch res := ct.InsertPrepared(q, r.Entry(idx), flow.ClassUntrusted, now); {
	case res.Stored():
		st.count(r, sInserted)
		if res == flow.InsertEvicted {
			st.count(r, sEvicted)
		}
	default:
		st.count(r, sRefused)
		if s.cfg.DropOnConnFull {
			return DropConnFull, 0, false
		}
	}
	return 0, 0, false
}
