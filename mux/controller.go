package mux

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/bgp"
	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/guard"
	"github.com/xdplb/xdplb/health"
)

// Announcer is what the controller needs of the BGP speaker: make the
// announced set exactly the given prefixes. *bgp.Announcer implements it.
type Announcer interface {
	Sync(want []netip.Prefix) error
}

// Steering is what the controller needs of the XDP steering program:
// replace the rule set. *steer.Program implements it, whole or not at all
// (it undoes a kernel error midway); for one that may leave a failed Sync
// between the two sets, Apply syncs the running set again before it
// refuses the version.
type Steering interface {
	Sync(desired steer.Config) error
}

// Checker is what the controller needs of the health checker.
// *health.Checker implements it.
type Checker interface {
	Set(targets []health.Target) error
	State(key string) (health.State, bool)
}

// Controller turns desired-state documents and health verdicts into the
// data path's configuration: it publishes rule snapshots (flow.Rules),
// keeps the health checker's targets, the steering program's VIP rules and
// the BGP announcements in step, and reports the version it runs.
//
// A VIP is announced while it has at least one backend that can take new
// flows (active, weight above 0, and healthy when probed). Backends of a
// probed VIP count as down until their first probe passes, so a Mux
// starting up announces a VIP only once it can serve it. Nothing is
// announced while the Mux is draining.
//
// Health verdicts cost what they change, not what the Mux serves:
// HealthChanged takes a batch of verdicts (the checker's OnChanges hands
// over everything that queued up while the previous batch was applied),
// rebuilds only the rules of the VIPs they name (flow.Snapshot.ReplaceRules:
// other rules, their Maglev tables and every backend ID are shared with
// the running snapshot) and publishes the result as one snapshot; BGP is
// told only when a VIP address becomes servable or stops being.
type Controller struct {
	sourcePrefixes func(*control.Document) (*guard.Prefixes, error)
	sources        *guard.Prefixes // the running version's (guarded by mu)
	node           string
	rules          *flow.Rules
	checker        Checker
	announce       Announcer // may be nil (no BGP)
	steering       Steering  // may be nil (no data path, tests)
	log            *slog.Logger
	// snapshot is what the data path runs with: the rules of one version,
	// VIP addresses' VNIs included (Snapshot).
	snapshot atomic.Pointer[muxSnapshot]

	mu       sync.Mutex
	doc      *control.Document
	plan     *Plan // of doc
	draining bool
	last     []netip.Prefix // last announced set
	// Of the snapshot last published (snap): the index of each VIP name in
	// doc.VIPs (which is its rule ID), and how many of its rules can take
	// new flows per VIP address, for announcements.
	snap     *flow.Snapshot
	vipIndex map[string]int
	servable map[netip.Prefix]int

	// External health (ControllerConfig.ExternalHealth): which probed
	// backends the hosts' reports decide (of doc), and the reports, by
	// host as given to SetDIPHealth. probes are the checker's targets.
	external bool
	ext      *extHealth
	reports  map[string]map[health.VerdictKey]bool
	probes   []health.Target

	// Outbound (outbound.go): the dynamic allocations as last given to
	// SetPortAllocations, the running range table (published with the
	// rules), and the counter index of every outbound address run so far.
	dynamic  []flow.PortAllocation
	returns  *balance.Returns
	outIndex map[netip.Addr]uint32
	// refused counts the allocations refused (xdplb_outbound_allocations_refused_total).
	refused atomic.Uint64
}

// ControllerConfig wires a Controller.
type ControllerConfig struct {
	// Node is the Mux's name: which node of a fleet document it is
	// (control.Document.ForNode); "" for per-node documents.
	Node      string
	Rules     *flow.Rules
	Checker   Checker
	Announcer Announcer
	Steering  Steering
	Logger    *slog.Logger
	// ExternalHealth: the backends of probed VIPs on hosts with a Host
	// Agent (listed in hosts[]) are decided by their hosts' reports
	// (SetDIPHealth), not probed by the Checker, which gets only the
	// other backends' targets. See Config.ExternalHealth.
	ExternalHealth bool
	// SourcePrefixes, when set, builds the source filter's prefix set of
	// a document (guard.NewPrefixes), published in the same snapshot as
	// its rules (guard.PrefixSource); an error refuses the document.
	SourcePrefixes func(*control.Document) (*guard.Prefixes, error)
}

// NewController returns a Controller; Apply gives it its first document.
func NewController(cfg ControllerConfig) (*Controller, error) {
	if cfg.Rules == nil || cfg.Checker == nil {
		return nil, errors.New("mux: a controller needs Rules and a Checker")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Controller{sourcePrefixes: cfg.SourcePrefixes, node: cfg.Node, rules: cfg.Rules, checker: cfg.Checker, announce: cfg.Announcer,
		steering: cfg.Steering, log: cfg.Logger, external: cfg.ExternalHealth}, nil
}

// SetAnnouncer sets (or clears) the BGP announcer, for a BGP speaker
// started after the first document, and resynchronises.
func (c *Controller) SetAnnouncer(a Announcer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.announce = a
	c.last = nil
	return c.syncAnnouncements()
}

// SetSteering sets (or clears) the steering program the controller keeps
// in step with the running document — for a data path opened after the
// first document (engine/datapath) — and syncs it to the running
// version's rules.
func (c *Controller) SetSteering(s Steering) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.steering = s
	if s == nil || c.plan == nil {
		return nil
	}
	return s.Sync(c.plan.Steering)
}

// Plan returns the plan of the running document (nil before the first).
func (c *Controller) Plan() *Plan {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.plan
}

// Apply makes doc the running document, whole or not at all: the rule
// snapshot is built first, and on error nothing changes. Once the version
// is published it is applied: announcements BGP does not take then are
// logged and asked for again at the next change.
func (c *Controller) Apply(doc *control.Document) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	version := doc.Version
	doc, err := doc.ForNode(c.node)
	if err != nil {
		return fmt.Errorf("mux: version %d: %w", version, err)
	}
	plan, err := NewPlan(doc, c.node)
	if err != nil {
		return fmt.Errorf("mux: version %d: %w", doc.Version, err)
	}
	var ext *extHealth
	probes := plan.Probes
	if c.external {
		ext, probes = externalTargets(doc, plan.Probes)
	}
	// A target the checker is about to start over (checker.Set: a new
	// address or port) has no verdict yet, whatever it says of the old
	// place now.
	up := c.healthOf(doc, ext)
	if moved := movedTargets(c.probes, probes); moved != nil {
		probed := up
		up = func(vip, backend string) (bool, bool) {
			if moved[targetKey(vip, backend)] { // a target, so probed
				return false, true
			}
			return probed(vip, backend)
		}
	}
	snap, err := flow.NewSnapshot(doc.Version, doc.Rules(up), c.rules.Load())
	if err != nil {
		return fmt.Errorf("mux: version %d: %w", doc.Version, err)
	}
	returns, refusals := c.buildReturns(plan, c.dynamic)
	if returns == nil {
		return fmt.Errorf("mux: version %d: outbound: %w", doc.Version, errors.Join(refusals...))
	}
	sources := c.sources
	if c.sourcePrefixes != nil {
		if sources, err = c.sourcePrefixes(doc); err != nil {
			return fmt.Errorf("mux: version %d: source prefixes: %w", doc.Version, err)
		}
	}
	if err := c.checker.Set(probes); err != nil {
		return fmt.Errorf("mux: version %d: health targets: %w", doc.Version, err)
	}
	if c.steering != nil {
		if err := c.steering.Sync(plan.Steering); err != nil {
			// Whole or not at all: the running version keeps its probes,
			// and its steering rules (steer.Program.Sync undoes a failure
			// itself; another Steering may have left the two sets mixed).
			if rerr := c.checker.Set(c.probes); rerr != nil {
				c.log.Error("mux: restoring the running version's probe targets", "err", rerr)
			}
			var running steer.Config
			if c.plan != nil {
				running = c.plan.Steering
			}
			if rerr := c.steering.Sync(running); rerr != nil {
				c.log.Error("mux: restoring the running version's steering rules", "err", rerr)
			}
			return fmt.Errorf("mux: version %d: steering: %w", doc.Version, err)
		}
	}
	var diff PlanDiff
	c.plan.diffVIPs(plan, &diff)
	c.sources, c.returns = sources, returns
	c.logRefusals(doc.Version, refusals)
	c.publish(snap, doc)
	c.plan, c.ext, c.probes = plan, ext, probes
	c.log.Info("mux: applied configuration", "version", doc.Version, "vips", len(doc.VIPs),
		"added", len(diff.AddedVIPs), "removed", len(diff.RemovedVIPs), "changed", len(diff.ChangedVIPs), "tables", len(diff.Tables),
		"outbound", len(plan.Outbound), "allocations", returns.Len())
	// The version runs: an error from here on must not refuse it. The
	// announcements not taken are asked for again at the next change.
	if err := c.syncAnnouncements(); err != nil {
		c.log.Error("mux: BGP announcements", "version", doc.Version, "err", err)
	}
	return nil
}

// publish makes snap, built from doc, the running snapshot, with the
// indexes the health path needs. Called with c.mu held.
func (c *Controller) publish(snap *flow.Snapshot, doc *control.Document) {
	c.store(snap)
	if doc != c.doc || c.vipIndex == nil {
		c.vipIndex = make(map[string]int, len(doc.VIPs))
		for i := range doc.VIPs {
			c.vipIndex[doc.VIPs[i].Name] = i
		}
	}
	c.servable = make(map[netip.Prefix]int)
	for _, r := range snap.Rules() {
		if servable(r) {
			c.servable[bgp.HostPrefix(r.VIP.Addr)]++
		}
	}
	c.snap, c.doc = snap, doc
}

// HealthChanged applies health verdicts: it rebuilds the rules of the VIPs
// the events name (by their target keys, "vip/backend"), reading each of
// their backends' current state from the checker, and publishes them as
// one snapshot; events for targets no longer in the document are ignored.
// Applying events together or one by one ends in the same snapshot.
func (c *Controller) HealthChanged(evs ...health.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]string, len(evs))
	for i := range evs {
		keys[i] = evs[i].Key
	}
	c.healthChanged(keys)
}

// healthChanged rebuilds the rules of the VIPs of the target keys
// ("vip/backend") whose health changed, and publishes them as one
// snapshot: the path both the checker's verdicts (HealthChanged) and the
// hosts' reports (SetDIPHealth) take. Called with c.mu held.
func (c *Controller) healthChanged(keys []string) {
	if c.doc == nil || len(keys) == 0 {
		return
	}
	ids := make([]int, 0, len(keys))
	for _, k := range keys {
		vip, _, _ := strings.Cut(k, "/") // VIP names have no '/'
		if id, ok := c.vipIndex[vip]; ok {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	cur := c.rules.Load()
	var snap *flow.Snapshot
	if cur == c.snap {
		rules := make([]flow.Rule, len(ids))
		for k, id := range ids {
			rules[k] = c.doc.Rule(id, c.vipHealth(&c.doc.VIPs[id]))
		}
		var err error
		if snap, err = cur.ReplaceRules(cur.Version, rules); err != nil {
			// The rules come from the document cur was built from, with
			// other states: cannot happen. Rebuild in full below.
			c.log.Error("mux: replacing rules after a health change", "err", err)
			snap = nil
		}
	}
	if snap == nil {
		// Someone else published a snapshot: rebuild everything.
		var err error
		snap, err = flow.NewSnapshot(c.doc.Version, c.doc.Rules(c.healthOf(c.doc, c.ext)), cur)
		if err != nil {
			// The document was valid; only states changed. Cannot happen.
			c.log.Error("mux: rebuilding rules after a health change", "err", err)
			return
		}
		c.publish(snap, c.doc)
		if err := c.syncAnnouncements(); err != nil {
			c.log.Error("mux: BGP after a health change", "err", err)
		}
		return
	}
	c.store(snap)
	c.snap = snap
	changed := false
	for _, id := range ids {
		was, is := servable(cur.Rule(uint32(id))), servable(snap.Rule(uint32(id)))
		if was == is {
			continue
		}
		p := bgp.HostPrefix(snap.Rule(uint32(id)).VIP.Addr)
		n := c.servable[p]
		if is {
			c.servable[p] = n + 1
			changed = changed || n == 0
		} else {
			c.servable[p] = n - 1
			changed = changed || n == 1
		}
	}
	if changed {
		if err := c.syncAnnouncements(); err != nil {
			c.log.Error("mux: BGP after a health change", "err", err)
		}
	}
}

// SetDraining withdraws every VIP (on) or announces the healthy ones
// again (off), while the data path keeps forwarding.
func (c *Controller) SetDraining(on bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.draining = on
	return c.syncAnnouncements()
}

// Version returns the version of the document last applied (0 before
// the first). A newer version whose text differs only in its version
// line is not applied (fleet's Source advances the node's
// control.Tracker without it), so the node's status — what it reports to
// etcd and as xdplb_config_version — may be higher.
func (c *Controller) Version() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.doc == nil {
		return 0
	}
	return c.doc.Version
}

// Document returns the running document.
func (c *Controller) Document() *control.Document {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.doc
}

// Announced returns the prefixes the controller last asked BGP to announce.
func (c *Controller) Announced() []netip.Prefix {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]netip.Prefix(nil), c.last...)
}

// vipHealth returns the health function for doc.Rule of VIP v of the
// running document: nil (the document's states) when v has no probe, else
// the verdicts, as healthOf.
func (c *Controller) vipHealth(v *control.VIP) func(vip, backend string) (bool, bool) {
	if v.Probe == nil {
		return nil
	}
	return func(vip, backend string) (bool, bool) {
		return c.probedUp(c.ext, vip, backend), true
	}
}

// healthOf returns the health function for doc.Rules, with ext the
// external targets of doc (nil: the checker decides every probed
// backend): a probed backend is up only when its probe, or its host's
// report, says Up (Unknown, or no report, counts as down); an unprobed
// one keeps the document's state.
func (c *Controller) healthOf(doc *control.Document, ext *extHealth) func(vip, backend string) (bool, bool) {
	probed := map[string]bool{}
	for i := range doc.VIPs {
		if doc.VIPs[i].Probe != nil {
			probed[doc.VIPs[i].Name] = true
		}
	}
	return func(vip, backend string) (bool, bool) {
		if !probed[vip] {
			return false, false
		}
		return c.probedUp(ext, vip, backend), true
	}
}

// movedTargets returns the keys of the targets of next that the checker
// runs now (running) at another address or port: checker.Set starts them
// over, Unknown, so the verdict it holds until then is the old place's.
func movedTargets(running, next []health.Target) map[string]bool {
	if len(running) == 0 || len(next) == 0 {
		return nil
	}
	at := make(map[string]netip.AddrPort, len(running))
	for _, t := range running {
		at[t.Key] = t.Addr
	}
	var moved map[string]bool
	for _, t := range next {
		if a, ok := at[t.Key]; ok && a != t.Addr {
			if moved == nil {
				moved = map[string]bool{}
			}
			moved[t.Key] = true
		}
	}
	return moved
}

// syncAnnouncements announces the VIPs that have a backend able to take
// new flows, and every outbound address (its replies must reach the
// Muxes whatever the health of its inbound backends). Called with c.mu
// held.
func (c *Controller) syncAnnouncements() error {
	if c.announce == nil || c.doc == nil {
		return nil
	}
	want := []netip.Prefix{}
	if !c.draining {
		for p, n := range c.servable {
			if n > 0 {
				want = append(want, p)
			}
		}
		if c.plan != nil {
			for i := range c.plan.Outbound {
				if p := bgp.HostPrefix(c.plan.Outbound[i].Address); !slices.Contains(want, p) {
					want = append(want, p)
				}
			}
		}
		slices.SortFunc(want, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	}
	if equalPrefixes(want, c.last) && c.last != nil {
		return nil
	}
	if err := c.announce.Sync(want); err != nil {
		return err
	}
	if !equalPrefixes(want, c.last) {
		c.log.Info("mux: announcing", "prefixes", want)
	}
	c.last = want
	return nil
}

// servable reports whether r has a backend that takes new flows.
func servable(r *flow.Rule) bool {
	for i := range r.Backends {
		if b := &r.Backends[i]; b.State == flow.BackendActive && b.Weight > 0 {
			return true
		}
	}
	return false
}

func equalPrefixes(a, b []netip.Prefix) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func targetKey(vip, backend string) string { return vip + "/" + backend }

// targets lists the probe targets of doc: every backend of every probed
// VIP, at the backend's address and port (the probe's port, when set,
// overrides it; a backend port of 0 probes the VIP port).
func targets(doc *control.Document) []health.Target {
	n := 0
	for i := range doc.VIPs {
		if doc.VIPs[i].Probe != nil {
			n += len(doc.VIPs[i].Backends)
		}
	}
	if n == 0 {
		return nil
	}
	ts := make([]health.Target, 0, n) // sized: growing it was a third of an Apply at 10,000 backends
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		if v.Probe == nil {
			continue
		}
		for j := range v.Backends {
			ts = append(ts, target(v, &v.Backends[j]))
		}
	}
	return ts
}

// target is the probe target of backend b of VIP v.
func target(v *control.VIP, b *control.Backend) health.Target {
	port := b.Port
	if port == 0 {
		port = v.Port
	}
	return health.Target{Key: targetKey(v.Name, b.Name), Addr: netip.AddrPortFrom(b.Address, port), Spec: *v.Probe}
}

// steerConfig is the steering program's view of doc: every VIP, by
// address, protocol and port (0: all ports), and ICMP to every VIP address
// (echo requests the Mux answers, errors it forwards to the flow's DIP);
// then every port of TCP and UDP to the address of each outbound section
// (the replies to source-NATed connections, whose ports the program
// cannot tell from others: the data path drops the ports of no VIP and
// no allocation), and its ICMP (echo replies, errors about outbound
// connections).
func steerConfig(doc *control.Document) steer.Config {
	var cfg steer.Config
	icmp := map[netip.Addr]bool{}
	addICMP := func(a netip.Addr) {
		if !icmp[a] {
			icmp[a] = true
			proto := uint8(flow.ProtoICMP)
			if a.Is6() {
				proto = flow.ProtoICMPv6
			}
			cfg.Dst = append(cfg.Dst, steer.DstRule{Addr: a, Proto: proto})
		}
	}
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		cfg.Dst = append(cfg.Dst, steer.DstRule{Addr: v.Address, Proto: v.Protocol, Port: v.Port})
		addICMP(v.Address)
	}
	for i := range doc.Outbound {
		a := doc.Outbound[i].Address
		cfg.Dst = append(cfg.Dst, steer.DstRule{Addr: a, Proto: flow.ProtoTCP}, steer.DstRule{Addr: a, Proto: flow.ProtoUDP})
		addICMP(a)
	}
	return cfg
}

// muxSnapshot is one version of what the Mux's data path runs with,
// loaded by each worker once per batch (engine.Batch.Snapshot): every
// stage of a batch sees the same rules, and the VNI of every VIP address
// with them (flow.Snapshot.VIPAddrVNI).
type muxSnapshot struct {
	rules   *flow.Snapshot
	sources *guard.Prefixes  // the source filter's set (guard.PrefixSource)
	returns *balance.Returns // the range table of outbound allocations (balance.ReturnSource)
}

var _ balance.ReturnSource = (*muxSnapshot)(nil)

// Returns implements balance.ReturnSource.
func (s *muxSnapshot) Returns() *balance.Returns {
	if s == nil {
		return nil
	}
	return s.returns
}

// SourcePrefixes implements guard.PrefixSource.
func (s *muxSnapshot) SourcePrefixes() *guard.Prefixes {
	if s == nil {
		return nil
	}
	return s.sources
}

var _ engine.RuleSource = (*muxSnapshot)(nil)

// RuleSnapshot implements engine.RuleSource.
func (s *muxSnapshot) RuleSnapshot() *flow.Snapshot {
	if s == nil {
		return nil
	}
	return s.rules
}

// store publishes snap as the running rules and as the data path's
// snapshot. Called with c.mu held.
func (c *Controller) store(snap *flow.Snapshot) {
	c.rules.Store(snap)
	c.snapshot.Store(&muxSnapshot{rules: snap, sources: c.sources, returns: c.returns})
}

// Snapshot returns the data path's current snapshot, for
// engine.WorkerConfig.Snapshot (nil before the first document).
func (c *Controller) Snapshot() any { return c.snapshot.Load() }
