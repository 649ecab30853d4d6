package hostagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/node"
	"github.com/xdplb/xdplb/nat"
)

// DefaultNATCapacity is the NAT table's IPv4 capacity when
// Config.NAT.Capacity is 0.
const DefaultNATCapacity = 1 << 18

// DefaultSNATCapacity is the source NAT's IPv4 capacity (outbound
// connections) when Config.SNAT.Capacity is 0.
const DefaultSNATCapacity = 1 << 17

// Config is the Host Agent's process configuration; everything else comes
// from the desired-state document at ConfigPath.
type Config struct {
	// Uplink is the physical interface: VXLAN from the Muxes arrives and
	// DSR replies leave there.
	Uplink string
	// Host names this host in the document's hosts: a name or an
	// address. Empty means the document's node.name.
	Host string
	// ConfigPath is the desired-state document (YAML), watched for
	// changes; Reload re-reads it (SIGHUP). Used when Source is nil.
	ConfigPath string
	// Source, when set, is where the document comes from instead of
	// ConfigPath: e.g. the fleet's etcd (package fleet).
	Source control.Source
	// Workers is how many workers to run; 0 means as many as the
	// interface with the fewest queues (uplink or VM port) has, which is
	// also the most: each worker owns a transmit socket on every
	// interface, and a socket binds to one queue. Queues above the worker
	// count still get a socket each, read by worker queue % Workers.
	Workers int
	// Port is the template of every AF_XDP port (Ring, Mode, NumFrames,
	// ring sizes); Interface, Queue and Name are set per socket.
	Port afxdp.Config
	// XDPMode is how the steering programs are attached.
	XDPMode steer.AttachMode
	// NAT sizes the NAT table (Capacity default DefaultNATCapacity) and
	// sets its idle timeouts.
	NAT nat.TableConfig
	// SNAT sizes the source NAT of the VMs' outbound connections
	// (Capacity default DefaultSNATCapacity; Timeouts default NAT's) and
	// keys its port choice (Seed). Its Clock is ignored.
	SNAT nat.SNATConfig
	// Infra are infrastructure prefixes added to the document's
	// infra_prefixes (the host's own address is always one).
	Infra []netip.Prefix
	// TunnelSources, when not empty, are the prefixes VXLAN may come from
	// (the Muxes), in place of the document's mux_prefixes; other VXLAN
	// is dropped (bad_tunnel_source, encap.DecapConfig.Sources). With
	// neither, the agent refuses the document: VXLAN from anyone would
	// reach the VMs around the Muxes.
	TunnelSources []netip.Prefix
	// IdleSpins is passed to the workers (engine.WorkerConfig).
	IdleSpins int
	// Logger receives the agent's logs (default slog.Default()).
	Logger *slog.Logger
	// OnDIPHealth, when set, makes the agent probe its own DIPs — the VMs
	// of this host that back a VIP with a probe (Plan.Probes) — through
	// their VM ports, and report the verdicts: it is called with every
	// batch of changes, from one goroutine, never concurrently. A
	// document that adds DIPs to probe makes a call listing them, down
	// (Reason "not probed yet"); DIPs a document stops probing are not
	// reported, they are just gone from Agent.DIPHealth, which lists
	// exactly the DIPs probed now (OnDIPHealth may call it). The probes
	// leave from the host's own addresses, so the uplink's addresses (as
	// New finds them) are added to Infra: the VMs' answers go to the
	// kernel. Nil: the agent probes nothing (the Muxes probe).
	OnDIPHealth func([]DIPHealth)
	// OnForwarding, when set, is called once, when the first data path
	// forwards: its sockets open and its programs attached. A process
	// drops the privileges it no longer needs there (see
	// internal/node.DropCapabilities; a rebuild still loads programs,
	// opens sockets and attaches them); an error stops the agent.
	OnForwarding func() error
}

// ErrNoTunnelSources is returned (wrapped) by the agent for a document
// without mux_prefixes when Config.TunnelSources is empty too.
var ErrNoTunnelSources = errors.New("no tunnel sources: the document has no mux_prefixes and -tunnel-sources " +
	"(Config.TunnelSources) is empty, so VXLAN from anyone would reach the VMs; add the prefixes the Muxes " +
	"send VXLAN from at the document's top level, e.g. \"mux_prefixes: [198.18.1.0/24]\", or give -tunnel-sources")

// Agent is a running Host Agent node.
type Agent struct {
	cfg       Config
	log       *slog.Logger
	rules     *flow.Rules
	table     *nat.Table
	snat      *nat.SNAT // shared by every data path, like table
	endpoints encap.EndpointTable
	snapshot  atomic.Pointer[agentSnapshot] // the workers' (publish)
	watcher   control.Source
	rebuild   chan *rebuild // a document changes the data path's structure: to Run
	runDone   chan struct{} // closed when Run returns (doneOnce)
	doneOnce  sync.Once

	mu      sync.Mutex
	plan    *Plan            // the running document's plan
	snap    *flow.Snapshot   // its rules
	locals  *encap.Endpoints // plan.Endpoints, indexed
	dips    *nat.DIPs        // plan.DIPs, indexed
	dp      *dataPath        // nil while no data path runs
	retired engine.Stats
	retNAT  nat.Stats
	builds  uint64
	failed  uint64 // rebuilds that failed: their versions were refused

	// The outbound ranges in force: the running document's static ones
	// and those given to SetOutboundAllocations.
	outStatic, outGiven []flow.PortAllocation

	partialMu sync.Mutex
	partial   map[string]*engine.PartialChecksums // by input interface

	probe *dipProber // nil unless Config.OnDIPHealth is set
}

// New checks cfg and prepares an Agent; Run starts it.
func New(cfg Config) (*Agent, error) {
	if cfg.Uplink == "" {
		return nil, errors.New("hostagent: Config.Uplink is empty")
	}
	if cfg.ConfigPath == "" && cfg.Source == nil {
		return nil, errors.New("hostagent: Config.ConfigPath is empty (and no Config.Source)")
	}
	if cfg.Workers < 0 {
		return nil, errors.New("hostagent: Config.Workers must not be negative")
	}
	for _, p := range append(append([]netip.Prefix(nil), cfg.Infra...), cfg.TunnelSources...) {
		if !p.IsValid() {
			return nil, fmt.Errorf("hostagent: invalid prefix %v", p)
		}
	}
	if cfg.OnDIPHealth != nil {
		// The probes leave from the host's own addresses: the VMs'
		// answers to them must reach the kernel, never the NAT.
		cfg.Infra = append(slices.Clone(cfg.Infra), uplinkPrefixes(cfg.Uplink)...)
	}
	if cfg.NAT.Capacity == 0 {
		cfg.NAT.Capacity = DefaultNATCapacity
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	table, err := nat.NewTable(cfg.NAT)
	if err != nil {
		return nil, fmt.Errorf("hostagent: %w", err)
	}
	if cfg.SNAT.Capacity == 0 {
		cfg.SNAT.Capacity = DefaultSNATCapacity
	}
	if cfg.SNAT.Timeouts == (flow.Timeouts{}) {
		cfg.SNAT.Timeouts = cfg.NAT.Timeouts
	}
	cfg.SNAT.Clock = nil
	snat, err := nat.NewSNAT(cfg.SNAT)
	if err != nil {
		return nil, fmt.Errorf("hostagent: %w", err)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, rules: flow.NewRules(), table: table, snat: snat,
		rebuild: make(chan *rebuild), runDone: make(chan struct{})}
	if cfg.OnDIPHealth != nil {
		if a.probe, err = newDIPProber(cfg.OnDIPHealth, cfg.Logger, nil); err != nil {
			return nil, err
		}
	}
	a.watcher = cfg.Source
	if a.watcher == nil {
		a.watcher = control.NewWatcher(cfg.ConfigPath, control.WatcherOptions{Logger: cfg.Logger})
	}
	return a, nil
}

// DIPHealth returns the verdict of every DIP the agent probes, sorted by
// VNI, address and port (nil unless Config.OnDIPHealth is set).
func (a *Agent) DIPHealth() []DIPHealth {
	if a.probe == nil {
		return nil
	}
	return a.probe.verdicts()
}

// probeDIPs makes plan's DIPs the probed ones, when the agent probes.
func (a *Agent) probeDIPs(plan *Plan) {
	if a.probe == nil {
		return
	}
	if err := a.probe.set(plan); err != nil {
		// The document's probes passed health.Spec.Validate: cannot
		// happen. The previous DIPs stay probed.
		a.log.Error("hostagent: DIP probes", "version", plan.Version, "err", err)
	}
}

// Reload re-reads the document (what SIGHUP does).
func (a *Agent) Reload() { a.watcher.Reload() }

// Status returns the document source's status (version, errors).
func (a *Agent) Status() control.Status { return a.watcher.Status() }

// Plan returns the plan of the running document (nil before the first).
func (a *Agent) Plan() *Plan {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.plan
}

// Rules returns the published VIP rules.
func (a *Agent) Rules() *flow.Rules { return a.rules }

// Table returns the NAT table.
func (a *Agent) Table() *nat.Table { return a.table }

// SNAT returns the source NAT of the VMs' outbound connections.
func (a *Agent) SNAT() *nat.SNAT { return a.snat }

// SetOutboundAllocations sets the outbound port ranges this host's DIPs
// hold besides the document's static ones (those a port allocator
// claimed, fleet.PortAllocator): the source NAT uses both. A range no
// longer given keeps its connections until they end (see nat.SNAT). It
// implements node.OutboundAgent.
func (a *Agent) SetOutboundAllocations(allocs []flow.PortAllocation) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.outGiven = slices.Clone(allocs)
	a.setAllocations()
}

// OutboundUsage appends to dst how much of each outbound range in force,
// and of each withdrawn range still holding connections, the source NAT
// uses (nat.SNAT.Usage). It implements node.OutboundAgent.
func (a *Agent) OutboundUsage(dst []flow.PortRangeUse) []flow.PortRangeUse {
	return a.snat.Usage(dst)
}

// setAllocations gives the source NAT the static and the given ranges.
// Called with a.mu held.
func (a *Agent) setAllocations() {
	all := make([]flow.PortAllocation, 0, len(a.outStatic)+len(a.outGiven))
	all = append(append(all, a.outStatic...), a.outGiven...)
	a.snat.SetAllocations(all)
}

// Forwarding reports whether the data path runs.
func (a *Agent) Forwarding() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dp != nil
}

// Stats returns the data path's counters since the agent started.
func (a *Agent) Stats() engine.Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.retired
	if a.dp != nil {
		addStats(&s, a.dp.live.Engine().Stats())
	}
	return s
}

// NATStats returns the NAT stages' counters since the agent started.
func (a *Agent) NATStats() nat.Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.retNAT
	if a.dp != nil {
		s = addNAT(s, a.dp.nat.Stats())
	}
	return s
}

func addStats(s *engine.Stats, o engine.Stats) {
	s.RX += o.RX
	s.TX += o.TX
	s.Batches += o.Batches
	for i := range s.Drops {
		s.Drops[i] += o.Drops[i]
	}
}

func addNAT(s, o nat.Stats) nat.Stats {
	s.Inbound += o.Inbound
	s.Return += o.Return
	s.Stateless += o.Stateless
	s.Ambiguous += o.Ambiguous
	s.Stale += o.Stale
	s.Fragments += o.Fragments
	s.NewFlows += o.NewFlows
	s.Evicted += o.Evicted
	s.Promoted += o.Promoted
	s.TableRefused += o.TableRefused
	s.ICMPErrors += o.ICMPErrors
	s.Direct += o.Direct
	s.DirectFlows += o.DirectFlows
	return s
}

// hostOf returns the name or address that selects this host in doc.
func (a *Agent) hostOf(doc *control.Document) (string, error) {
	if a.cfg.Host != "" {
		return a.cfg.Host, nil
	}
	if doc.Node.Name != "" {
		return doc.Node.Name, nil
	}
	return "", errors.New("hostagent: no host: set Config.Host (-host) or the document's node.name")
}

// apply is the watcher's callback. It applies doc whole or not at all:
// everything that can fail (the plan, the rule snapshot, the indexes, the
// steering maps, a new data path) is done before anything is published. A
// document that keeps the data path's structure is swapped in live; one
// that changes it (a VM port added or removed, the host's address, the
// infrastructure prefixes) gets a new data path, built beside the running
// one, which keeps forwarding the previous version until the new one
// replaces it — or, if the build fails, keeps forwarding, and apply
// refuses the version (the watcher logs it, counts it and sets
// xdplb_config_error{reason="apply"}; xdplb_datapath_build_failures_total
// counts the failed builds).
func (a *Agent) apply(doc *control.Document) error {
	host, err := a.hostOf(doc)
	if err != nil {
		return err
	}
	plan, err := NewPlan(doc, host, a.cfg.Infra)
	if err != nil {
		return fmt.Errorf("version %d: %w", doc.Version, err)
	}
	if len(a.cfg.TunnelSources) > 0 {
		plan.TunnelSources = slices.Clone(a.cfg.TunnelSources)
	}
	if len(plan.TunnelSources) == 0 {
		return fmt.Errorf("hostagent: %s: version %d: %w", a.cfg.ConfigPath, doc.Version, ErrNoTunnelSources)
	}
	locals, err := encap.NewEndpoints(plan.Endpoints)
	if err != nil {
		return fmt.Errorf("hostagent: version %d: %w", doc.Version, err)
	}
	dips, err := nat.NewDIPs(plan.DIPs)
	if err != nil {
		return fmt.Errorf("hostagent: version %d: %w", doc.Version, err)
	}
	a.mu.Lock()
	prev := a.snap
	if prev == nil {
		prev = a.rules.Load()
	}
	// The client filters drop every VIP of the fleet: a view's (package
	// fleet) VIPs are this host's, VIPAddresses all of them.
	snap, err := flow.NewSnapshotAddrs(doc.Version, doc.Rules(nil), doc.VIPAddresses, prev)
	if err != nil {
		a.mu.Unlock()
		return fmt.Errorf("hostagent: version %d: %w", doc.Version, err)
	}
	v := &version{plan: plan, snap: snap, locals: locals, dips: dips}
	switch {
	case a.dp == nil:
		// The first data path is built from it.
		a.set(v)
		a.mu.Unlock()
	case a.dp.plan.SameStructure(plan):
		err := a.dp.steer(plan)
		if err == nil {
			a.set(v)
			a.publish()
			a.dp.plan = plan
			a.dp.nat.SetDIPs(dips) // also builds the NAT view of the new rules
		}
		// A refusal leaves every interface on the running rules:
		// datapath.DataPath.Steer is whole or not at all.
		a.mu.Unlock()
		if err != nil {
			return fmt.Errorf("hostagent: version %d: steering: %w", doc.Version, err)
		}
	default:
		// Refuse a version whose VM ports do not exist: the new data
		// path could not open them.
		for _, vp := range plan.Ports {
			if _, err := net.InterfaceByName(vp.Interface); err != nil {
				a.mu.Unlock()
				return fmt.Errorf("hostagent: version %d: VM port %s: %w", doc.Version, vp.Interface, err)
			}
		}
		a.mu.Unlock()
		// Run builds the new data path beside the running one and swaps
		// them, or refuses.
		r := &rebuild{v: v, done: make(chan error, 1)}
		select {
		case a.rebuild <- r:
		case <-a.runDone:
			return errors.New("hostagent: stopping")
		}
		if err := <-r.done; err != nil {
			return fmt.Errorf("hostagent: version %d: %w", doc.Version, err)
		}
		a.probeDIPs(plan)
		a.log.Info("hostagent: applied configuration", "version", doc.Version, "host", plan.Host.Name,
			"address", plan.Host.Address, "vm_ports", len(plan.Ports), "dips", len(plan.DIPs),
			"vips", snap.Len(), "data_path", "rebuilt")
		return nil
	}
	a.probeDIPs(plan)
	a.log.Info("hostagent: applied configuration", "version", doc.Version, "host", plan.Host.Name,
		"address", plan.Host.Address, "vm_ports", len(plan.Ports), "dips", len(plan.DIPs),
		"vips", snap.Len(), "data_path", dataPathAction(a.Forwarding()))
	return nil
}

// version is an accepted document, prepared: its plan, rule snapshot and
// indexes.
type version struct {
	plan   *Plan
	snap   *flow.Snapshot
	locals *encap.Endpoints
	dips   *nat.DIPs
}

// set makes v the agent's version (not published yet). Called with a.mu
// held.
func (a *Agent) set(v *version) {
	a.plan, a.snap, a.locals, a.dips = v.plan, v.snap, v.locals, v.dips
	if err := a.snat.SetOutbound(v.plan.Outbound); err != nil {
		// The document was validated; only the SNAT's ID space (65535
		// DIPs over its life) can refuse. The previous sections stay.
		a.log.Error("hostagent: outbound sections not applied", "version", v.plan.Version, "err", err)
	}
	a.outStatic = v.plan.OutboundStatic
	a.setAllocations()
}

// rebuild asks Run for a data path for v; Run answers on done (nil: it
// forwards v).
type rebuild struct {
	v    *version
	done chan error
}

func dataPathAction(running bool) string {
	if !running {
		return "not running yet"
	}
	return "updated live"
}

// publish makes the accepted version the data path's: rules and
// endpoints. Called with a.mu held.
func (a *Agent) publish() {
	a.rules.Store(a.snap)
	a.endpoints.Store(a.locals)
	a.snapshot.Store(&agentSnapshot{rules: a.snap, endpoints: a.locals, nat: nat.NewView(a.snap, a.dips)})
}

// agentSnapshot is one version of what the Host Agent's data path runs
// with — the rules, the local endpoints Decap delivers to and the NAT's
// view of rules and local DIPs — loaded by each worker once per batch
// (engine.Batch.Snapshot), so that every stage of a batch sees one
// version.
type agentSnapshot struct {
	rules     *flow.Snapshot
	endpoints *encap.Endpoints
	nat       *nat.View
}

// RuleSnapshot implements engine.RuleSource.
func (s *agentSnapshot) RuleSnapshot() *flow.Snapshot {
	if s == nil {
		return nil
	}
	return s.rules
}

// BatchEndpoints implements encap.EndpointsSource.
func (s *agentSnapshot) BatchEndpoints() *encap.Endpoints {
	if s == nil {
		return nil
	}
	return s.endpoints
}

// NATView implements nat.ViewSource.
func (s *agentSnapshot) NATView() *nat.View {
	if s == nil {
		return nil
	}
	return s.nat
}

// The sources the stages read an agentSnapshot through.
var (
	_ engine.RuleSource     = (*agentSnapshot)(nil)
	_ encap.EndpointsSource = (*agentSnapshot)(nil)
	_ nat.ViewSource        = (*agentSnapshot)(nil)
)

// batchSnapshot is the workers' engine.WorkerConfig.Snapshot.
func (a *Agent) batchSnapshot() any { return a.snapshot.Load() }

// Run runs the Host Agent until ctx is done. It waits for the first
// document, builds the data path (steering programs on the uplink and on
// every VM port, AF_XDP sockets, workers) and forwards; a document that
// changes the data path's structure makes it build a new data path beside
// the running one and swap them (the NAT table survives), or, if the
// build fails, keep the running one and refuse the version. On return
// every program is detached and every socket closed.
func (a *Agent) Run(ctx context.Context) error {
	done := func() { a.doneOnce.Do(func() { close(a.runDone) }) }
	defer done()
	if _, err := net.InterfaceByName(a.cfg.Uplink); err != nil {
		return fmt.Errorf("hostagent: uplink: %w", err)
	}
	resolver, err := nexthop.NewResolver(nexthop.Config{Logger: a.log})
	if err != nil {
		return fmt.Errorf("hostagent: next-hop resolver: %w", err)
	}
	defer resolver.Close()

	side := node.NewSide(a.log, "hostagent")
	defer side.Stop()
	// Before side.Stop waits for the watcher: an apply waiting for this
	// loop returns.
	defer done()
	side.Go("next-hop resolver", resolver.Run)
	side.Go("NAT table ager", func(ctx context.Context) error {
		return node.Sweep(ctx, a.table.Conns().Cap(), func(budget int) { a.table.Age(a.table.Now(), budget) })
	})
	side.Go("SNAT ager", func(ctx context.Context) error {
		out, _ := a.snat.Tables()
		return node.Sweep(ctx, out.Cap(), func(budget int) { a.snat.Age(a.snat.Now(), budget) })
	})
	side.Go("SNAT exhaustion log", func(ctx context.Context) error { return a.logExhaustion(ctx, exhaustionLogEvery) })
	if a.probe != nil {
		side.Go("DIP prober", a.probe.checker.Run)
	}

	watchErr := make(chan error, 1)
	side.Go("config watcher", func(c context.Context) error {
		err := a.watcher.Run(c, func(doc *control.Document) error { return a.apply(doc) })
		watchErr <- err
		return err
	})
	select {
	case <-a.watcher.Ready():
	case err := <-watchErr:
		return fmt.Errorf("hostagent: first configuration: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}

	dp, err := a.start(resolver)
	if err != nil {
		return err
	}
	onFwd := a.cfg.OnForwarding
	for {
		engCtx, stopEngine := context.WithCancel(context.Background())
		engDone := make(chan error, 1)
		go func() { engDone <- dp.live.Engine().Run(engCtx) }()

		var runErr error
		if onFwd != nil {
			runErr = onFwd()
			onFwd = nil
			if runErr != nil {
				runErr = fmt.Errorf("hostagent: %w", runErr)
				a.log.Error("hostagent: stopping", "err", runErr)
			}
		}
		var (
			req  *rebuild
			next *dataPath
		)
	wait:
		for runErr == nil {
			select {
			case <-ctx.Done():
				break wait
			case runErr = <-engDone:
				// A port's socket or interface failed (engine.Checker):
				// the agent stops with the error (xdplb_datapath_up 0)
				// for a supervisor to restart it on the interfaces as
				// they are now.
				a.log.Error("hostagent: data path failed", "err", runErr)
				engDone <- runErr
			case req = <-a.rebuild:
				// Built while dp forwards; dp is untouched on failure.
				var err error
				if next, err = a.build(req.v, resolver, dp); err != nil {
					req.done <- err
					req = nil
					continue
				}
				break wait
			}
		}
		stopEngine()
		if err := <-engDone; err != nil && runErr == nil {
			runErr = err
		}
		if req == nil || runErr != nil {
			if req != nil {
				_ = next.live.Discard()
				req.done <- errors.New("hostagent: the data path stopped")
			}
			a.stop(dp)
			return runErr
		}
		a.swap(dp, next, req.v)
		req.done <- nil
		dp = next
	}
}

// start builds the first data path, for the current plan, and publishes
// it.
func (a *Agent) start(resolver *nexthop.Resolver) (*dataPath, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	dp, err := a.open(a.plan, a.dips, resolver, nil)
	if err != nil {
		return nil, err
	}
	a.publish()
	a.dp = dp
	a.builds++
	a.logForwarding(dp)
	return dp, nil
}

func (a *Agent) logForwarding(dp *dataPath) {
	a.log.Info("hostagent: forwarding", "uplink", a.cfg.Uplink, "host", dp.plan.Host.Address,
		"vxlan_port", dp.plan.Host.VXLANPort, "vm_ports", len(dp.plan.Ports), "workers", len(dp.live.Engine().Workers()),
		"sockets", dp.live.Sockets(), "ports", dp.live.Layout().String(), "version", dp.plan.Version)
}

// build builds the data path of v beside run, which keeps forwarding
// (see open). A failure is logged and counted; run is untouched.
func (a *Agent) build(v *version, resolver *nexthop.Resolver, run *dataPath) (*dataPath, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	next, err := a.open(v.plan, v.dips, resolver, run)
	if err != nil {
		a.failed++
		a.log.Error("hostagent: the new data path failed to build; the running one keeps forwarding its version",
			"version", v.plan.Version, "running", run.plan.Version, "err", err)
		return nil, err
	}
	return next, nil
}

// swap retires run, whose workers have stopped, and makes next, built
// beside it for v, the data path: v is published and next's workers may
// start. Nothing here can fail.
func (a *Agent) swap(run, next *dataPath, v *version) {
	a.mu.Lock()
	defer a.mu.Unlock()
	addStats(&a.retired, run.live.Engine().Stats())
	a.retNAT = addNAT(a.retNAT, run.nat.Stats())
	next.live.TakeOver() // releases what of run next does not share
	a.set(v)
	a.publish()
	a.dp = next
	a.builds++
	a.logForwarding(next)
}

// stop retires a stopped data path: its counters are kept, its sockets
// closed and its programs detached.
func (a *Agent) stop(dp *dataPath) {
	a.mu.Lock()
	defer a.mu.Unlock()
	addStats(&a.retired, dp.live.Engine().Stats())
	a.retNAT = addNAT(a.retNAT, dp.nat.Stats())
	if a.dp == dp {
		a.dp = nil
	}
	if err := dp.live.Close(); err != nil {
		a.log.Error("hostagent: closing the data path", "err", err)
	}
}

// uplinkPrefixes returns the uplink's global unicast addresses as host
// prefixes (none if the interface is not there yet).
func uplinkPrefixes(name string) []netip.Prefix {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok || !ip.IsGlobalUnicast() {
			continue
		}
		ip = ip.Unmap()
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return out
}

// exhaustionLogEvery is how often the agent looks for outbound
// connections refused for want of a port.
const exhaustionLogEvery = 5 * time.Second

// logExhaustion warns, at most once per every, when the source NAT
// dropped new outbound connections because their VM's ranges had no free
// port towards their remote endpoint (nat.SNATStats.Exhausted grew; the
// count is also xdplb_outbound_packets_total{outcome="exhausted"}). It
// names the VMs whose ranges hold the most ports in use, where more
// ranges (etcd) or a larger static range would help.
func (a *Agent) logExhaustion(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	last := a.snat.Stats().Exhausted
	var use []flow.PortRangeUse
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n := a.snat.Stats().Exhausted
		if n > last {
			use = a.snat.Usage(use[:0])
			a.log.Warn("hostagent: outbound connections dropped: no free port in their VM's ranges (snat_exhausted)",
				"dropped", n-last, "total", n, "busiest", busiestDIPs(use, 3))
		}
		last = n
	}
}

// busiestDIPs describes the k DIPs with the largest share of their
// ranges' ports in use: "198.18.31.1 8/8 ports, 9 connections".
func busiestDIPs(use []flow.PortRangeUse, k int) []string {
	type dipUse struct {
		dip                netip.Addr
		ports, size, conns int
	}
	byDIP := map[netip.Addr]*dipUse{}
	for _, u := range use {
		d := byDIP[u.Owner.DIP]
		if d == nil {
			d = &dipUse{dip: u.Owner.DIP}
			byDIP[u.Owner.DIP] = d
		}
		d.ports += u.Ports
		d.size += int(u.Last) - int(u.First) + 1
		d.conns += u.Conns
	}
	ds := slices.SortedFunc(maps.Values(byDIP), func(x, y *dipUse) int {
		return cmp.Compare(y.ports*x.size, x.ports*y.size) // larger share first
	})
	var out []string
	for _, d := range ds[:min(k, len(ds))] {
		out = append(out, fmt.Sprintf("%v %d/%d ports, %d connections", d.dip, d.ports, d.size, d.conns))
	}
	return out
}
