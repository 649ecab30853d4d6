package nat

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// Drop reasons of the NAT stages.
var (
	// DropNoNATRule: an inbound packet's (VNI, proto, VIP, port) matches no
	// rule.
	DropNoNATRule = engine.RegisterDropReason("nat_no_rule")
	// DropNoLocalBackend: the rule has no backend hosted here whose MAC is
	// the frame's destination.
	DropNoLocalBackend = engine.RegisterDropReason("nat_no_local_backend")
	// DropNoState: a reply has no NAT state and does not match exactly one
	// rule (Stats.Ambiguous counts the "more than one" part).
	DropNoState = engine.RegisterDropReason("nat_no_state")
	// DropInfra: the client side of the packet is an infrastructure
	// address (health prober, Mux), which is never translated.
	DropInfra = engine.RegisterDropReason("nat_infra")
	// DropFragment: a non-first fragment whose translation is not unique
	// (see the package documentation).
	DropFragment = engine.RegisterDropReason("nat_fragment")
	// DropDirect: a packet of a direct connection (not through the VIP)
	// and no Config.Direct port to pass it on untranslated.
	DropDirect = engine.RegisterDropReason("nat_direct")
)

// Config is the plain configuration of a Translator.
type Config struct {
	// Rules is the published rule configuration (VIPs and their pools);
	// required. It is loaded once per batch.
	Rules *flow.Rules
	// Table holds the NAT state; required. Share one Table between the
	// Translator's two stages and all workers.
	Table *Table
	// DIPs are the DIPs this node hosts at start; SetDIPs replaces
	// them.
	DIPs []DIP
	// Uplink is the port index replies leave on (Packet.OutPort set by
	// Return).
	Uplink uint16
	// Direct, when set, is the port index on which Return hands the
	// packets of direct connections — to a DIP's service port without the
	// VIP, from a neighbour VM, another host or an operator — to the next
	// hop untranslated: the slow path, whose kernel routes them. Without
	// it such packets are dropped (DropDirect). See the package
	// documentation, "Direct connections".
	Direct    uint16
	HasDirect bool
	// Infra are the infrastructure prefixes (health probers, Muxes, the
	// node's own addresses): traffic whose client side is inside one is
	// never translated (DropInfra). The steering program passes it to the
	// kernel before it reaches the stages; this is the backstop.
	Infra []netip.Prefix
	// SetHash makes both stages store in Packet.Hash the symmetric flow hash
	// (Hasher.SymmetricHash) of the connection's client-facing key, client
	// ↔ VIP: the same value for both directions of a connection, for a next
	// stage that spreads flows (an ECMP next hop, a software steering
	// ring). Off by default: it costs a hash per packet.
	SetHash bool
	// Hasher is used when SetHash is on.
	Hasher flow.Hasher
	// Clock returns the table tick, read once per batch; nil means
	// Table.Now. Tests inject synthetic time.
	Clock func() flow.Tick
	// SNAT, when set, is the source NAT of the outbound connections of
	// the DIPs in its outbound sections: Return hands it the packets of
	// an outbound DIP that no DSR connection claims, Inbound the packets
	// to a VIP address that no rule matches (replies on a pool port).
	// It keeps its own state and clock (SNAT.Now): Clock does not drive
	// it. See the package documentation, "Outbound connections".
	SNAT *SNAT
}

// Stats are a Translator's counters, summed over workers.
type Stats struct {
	Inbound      uint64 // packets translated VIP:vport → DIP:dport
	Return       uint64 // replies translated DIP:dport → VIP:vport from state
	Stateless    uint64 // replies without state translated by their unique rule
	Ambiguous    uint64 // replies without state matching more than one rule (dropped)
	Stale        uint64 // replies whose state named a backend no longer here (then stateless)
	Fragments    uint64 // non-first fragments translated by address (both directions)
	NewFlows     uint64 // connections entered in the table (untrusted)
	Evicted      uint64 // of those, stored over another connection's idle or untrusted entry
	Promoted     uint64 // untrusted connections that proved themselves (flow.ConnTable.Next)
	TableRefused uint64 // connections the table could not store (table full of proven entries, or busy)
	ICMPErrors   uint64 // ICMP errors translated through their quote (both directions)
	Direct       uint64 // packets of direct connections (not through a VIP) passed on untranslated
	DirectFlows  uint64 // direct connections recognised (a SYN-ACK without NAT state)
}

// Translator is the Host Agent's stateful DSR NAT: the shared configuration,
// state and counters behind its two stages, Inbound (VIP → DIP, towards the
// VM) and Return (DIP → VIP, replies towards the client). It is safe for
// concurrent use by any number of workers.
type Translator struct {
	rules   *flow.Rules
	table   *Table
	uplink  uint16
	direct  uint16
	hasDir  bool
	infra   prefixes
	setHash bool
	hasher  flow.Hasher
	clock   func() flow.Tick
	snat    *SNAT

	locals atomic.Pointer[DIPs]
	view   atomic.Pointer[view]
	build  sync.Mutex // held while building a view

	stripes []statStripe

	// Per-worker scratch of the Return and Inbound stages' two passes:
	// a batch's prepared connection-table queries (and Inbound's keys).
	scratch engine.PerWorker[batchScratch]
}

// batchScratch holds the Return and Inbound stages' prepared queries, one
// per packet of a batch, and Inbound's return keys, local backends and
// VIP ports between its two passes.
type batchScratch struct {
	q     [engine.MaxBatch]flow.ConnQuery
	ret   [engine.MaxBatch]flow.Key
	lb    [engine.MaxBatch]*localBackend
	vport [engine.MaxBatch]uint16
}

// scratchFor returns worker w's scratch (a fresh one for a hand-made batch
// whose index no worker has).
func (t *Translator) scratchFor(w int) *batchScratch {
	if s := t.scratch.Get(w); s != nil {
		return s
	}
	return new(batchScratch)
}

// statStripes is the number of counter stripes; worker w adds into stripe
// w % statStripes, once per batch.
const statStripes = 16

// statStripe is one worker's counters on cache lines of their own.
type statStripe struct {
	c [numCounts]atomic.Uint64
	_ [128 - numCounts*8%128]byte
}

// counts are a batch's counters, kept on the stack and added to the
// stripe once per batch: the Translator's, then the SNAT's (from cSNAT).
type counts [cSNAT + numSNATCounts]uint64

// Indexes into counts and statStripe.c, in Stats order.
const (
	cInbound = iota
	cReturn
	cStateless
	cAmbiguous
	cStale
	cFragments
	cNewFlows
	cEvicted
	cPromoted
	cRefused
	cICMPErrors
	cDirect
	cDirectFlows
	numCounts

	cSNAT = numCounts // the SNAT's counters start here (sOut...)
)

// New validates cfg and returns a Translator. It builds the first view of
// the current rules and cfg.DIPs.
func New(cfg Config) (*Translator, error) {
	if cfg.Rules == nil {
		return nil, errors.New("nat: Config.Rules is nil")
	}
	if cfg.Table == nil {
		return nil, errors.New("nat: Config.Table is nil")
	}
	infra, ok := compilePrefixes(cfg.Infra)
	if !ok {
		return nil, fmt.Errorf("nat: invalid Config.Infra prefix in %v", cfg.Infra)
	}
	locals, err := NewDIPs(cfg.DIPs)
	if err != nil {
		return nil, err
	}
	t := &Translator{
		rules:   cfg.Rules,
		table:   cfg.Table,
		uplink:  cfg.Uplink,
		direct:  cfg.Direct,
		hasDir:  cfg.HasDirect,
		infra:   infra,
		setHash: cfg.SetHash,
		hasher:  cfg.Hasher,
		clock:   cfg.Clock,
		snat:    cfg.SNAT,
		stripes: make([]statStripe, statStripes),
	}
	if t.clock == nil {
		t.clock = cfg.Table.Now
	}
	t.locals.Store(locals)
	t.Sync()
	return t, nil
}

// SNAT returns the source NAT the Translator hands outbound traffic to,
// or nil.
func (t *Translator) SNAT() *SNAT { return t.snat }

// Table returns the Translator's state table.
func (t *Translator) Table() *Table { return t.table }

// DIPs returns the local DIPs in force.
func (t *Translator) DIPs() *DIPs { return t.locals.Load() }

// SetDIPs replaces the set of local DIPs (a VM was added or removed) and
// rebuilds the view. Existing state whose backend is no longer local stops
// matching; those replies fall back to the stateless path.
func (t *Translator) SetDIPs(l *DIPs) {
	if l == nil {
		l = MustDIPs()
	}
	t.locals.Store(l)
	t.Sync()
}

// Sync builds the stages' view of the current rules snapshot and local
// DIPs now, if it is not built yet. Call it after Rules.Update from the
// control plane: otherwise the first worker to see the new snapshot builds
// the view (O(backends), allocating) inside a batch, while the other
// workers keep using the previous, self-consistent view until it is ready.
func (t *Translator) Sync() {
	t.build.Lock()
	defer t.build.Unlock()
	snap, loc := t.rules.Load(), t.locals.Load()
	if v := t.view.Load(); v != nil && v.snap == snap && v.locals == loc {
		return
	}
	t.view.Store(buildView(snap, loc))
}

// View is the stages' translation view of one rules snapshot and one set
// of local DIPs, built off the data path (NewView) and published in a
// node's batch snapshot (engine.Batch.Snapshot, through ViewSource), so
// that the NAT stages of a batch translate with the rules and locals of
// that batch's version.
type View struct{ v *view }

// NewView builds the view of snap and l (nil l: no local DIPs). It
// allocates, O(backends): call it when a configuration is published.
func NewView(snap *flow.Snapshot, l *DIPs) *View {
	if l == nil {
		l = MustDIPs()
	}
	return &View{v: buildView(snap, l)}
}

// ViewSource is a batch snapshot that carries the NAT view.
type ViewSource interface{ NATView() *View }

// viewFor returns the view of batch b: its snapshot's, when that is a
// ViewSource, else the Translator's own (current).
func (t *Translator) viewFor(b *engine.Batch) *view {
	if vs, ok := b.Snapshot.(ViewSource); ok {
		if nv := vs.NATView(); nv != nil {
			return nv.v
		}
	}
	return t.current()
}

// current returns the view for this batch: the published one if it is up
// to date, else a fresh one built by this worker, or, when another worker
// is building, the previous view (consistent in itself).
func (t *Translator) current() *view {
	v := t.view.Load()
	if v.snap == t.rules.Load() && v.locals == t.locals.Load() {
		return v
	}
	if !t.build.TryLock() {
		return v
	}
	snap, loc := t.rules.Load(), t.locals.Load()
	if v = t.view.Load(); v.snap != snap || v.locals != loc {
		v = buildView(snap, loc)
		t.view.Store(v)
	}
	t.build.Unlock()
	return v
}

// Stats sums the counters of all workers.
func (t *Translator) Stats() Stats {
	var c [numCounts]uint64
	for i := range t.stripes {
		for j := range c {
			c[j] += t.stripes[i].c[j].Load()
		}
	}
	return Stats{
		Inbound: c[cInbound], Return: c[cReturn], Stateless: c[cStateless],
		Ambiguous: c[cAmbiguous], Stale: c[cStale], Fragments: c[cFragments],
		NewFlows: c[cNewFlows], Evicted: c[cEvicted], Promoted: c[cPromoted], TableRefused: c[cRefused], ICMPErrors: c[cICMPErrors],
		Direct: c[cDirect], DirectFlows: c[cDirectFlows],
	}
}

// flush adds a batch's counts to the worker's stripe.
func (t *Translator) flush(worker int, c *counts) {
	s := &t.stripes[uint(worker)%statStripes]
	for i, v := range c[:numCounts] {
		if v != 0 {
			s.c[i].Add(v)
		}
	}
	if t.snat != nil {
		t.snat.flush(worker, c)
	}
}

// Inbound returns the inbound stage (VIP → DIP).
func (t *Translator) Inbound() *Inbound { return &Inbound{t: t} }

// Return returns the return stage (DIP → VIP).
func (t *Translator) Return() *Return { return &Return{t: t} }
