// Package mux assembles the Mux role of an Ananta-style load balancer
// from xdplb's packages: it reads the desired-state document (control),
// probes the backends (health), publishes rule snapshots (flow), steers
// VIP traffic of the uplink into AF_XDP sockets (engine/steer,
// engine/afxdp; the data path is built by engine/datapath, port 0 the
// uplink's socket, port 1 the slow path), runs one worker per RX queue
// through the pipeline
//
//	Parse → source filter → partial checksums → uplink VNI → ICMP → balance → VXLAN encap (TTL) → next hop → account
//
// (the source filter drops packets from a VIP, an infrastructure or Mux
// prefix of the document, the Mux's own addresses or a martian, and the
// encapsulation decrements the inner TTL / hop limit, since the Mux routes
// the packet: see package guard; the partial-checksum stage completes the
// TCP/UDP checksums that senders on the same machine leave to offload; see
// engine.PartialChecksums; the worker runs these stages fused as one, with
// the same output, in fewer loops over a batch: see fused.go; and a packet
// of an established flow whose whole decision the worker keeps is
// encapsulated from it, with the same output: see fastpath.go)
// and announces the VIPs that can be served over BGP (bgp).
//
// # Returning traffic of outbound connections
//
// A VM's outbound connection leaves its host source-NATed to VIP:port
// (the document's outbound sections: per VIP address, its VMs, the port
// pool, the allocation unit and static allocations). The replies reach a
// Mux: the steering program sends it every TCP, UDP and ICMP packet to an
// outbound address, and such an address is announced whatever the health
// of its VIPs. The balance stage sends a packet that matches no rule by
// the range table published in the same snapshot as the rules
// (balance.Returns): to the owner of its destination port — VXLAN to the
// owner's host, the owner's VNI, its MAC as the inner destination —
// counted per address (xdplb_vip_return_packets_total,
// xdplb_vip_return_bytes_total); a pool port nobody holds is dropped
// (outbound_unallocated). ICMP errors quoting an outbound connection (or
// a VM's ping) and echo replies whose identifier is allocated go the same
// way; echo requests to a VIP stay answered by the Mux. The table holds
// the document's static allocations, each owner's host, VNI and MAC from
// hosts[], and the dynamic ones a fleet's allocator gives
// Controller.SetPortAllocations, which refuses (counts, logs, and
// names in its error) those the document does not allow. See
// outbound.go.
//
// # Failures and privileges
//
// Every worker checks its AF_XDP socket every engine.DefaultCheckEvery
// (afxdp.Port.Check). When one fails — its interface was deleted or moved
// — the worker stops with the error and Run withdraws every VIP at once
// (bgp.Announcer.Drain, no grace period: nothing forwards any more), sets
// xdplb_datapath_up to 0, logs "data path failed", closes the sessions
// and returns the error; examples/mux exits with status 1 so that its
// supervisor restarts it on the interface as it is then (a deleted
// interface's socket cannot be rebound, and a recreated interface has a
// new index). Config.OnForwarding runs once the data path forwards; the
// binary drops its capabilities there (internal/node.MuxCaps).
//
// A reload whose BGP settings need a restart of the speaker, or that
// changes hash_seed (the data path hashes flows with the first
// document's), is refused whole (see apply), so the running version is
// the one reported. Once Run has begun to shut the speaker down, or
// withdrawn every VIP because the data path failed, a reload starts none
// (see shutdownBGP, withdrawAll).
//
// Controller is the part that needs no privileges (documents and health
// verdicts in, rules, steering rules and announcements out); Mux is the
// whole node, as examples/mux runs it. Health verdicts reach it in batches
// (health.CheckerConfig.OnChanges: whatever queued up while the previous
// batch was applied) and rebuild only the rules of the VIPs they name.
//
// # Who probes
//
// By default (and in a file-only setup) the Mux probes every backend of
// every probed VIP itself. With Config.ExternalHealth the Host Agents
// probe the DIPs on their own hosts, through the VM ports, so tenants with
// the same DIP address are told apart (hostagent.Config.OnDIPHealth), and
// the Mux applies their reports (Mux.SetDIPHealth, Controller.SetDIPHealth)
// through the same batching path: a backend on a host listed in hosts[]
// takes new flows only while that host reports its (VNI, DIP, probed port)
// up. No report, or a host whose reports are gone (its agent died and its
// leased keys expired), means down: a DIP without a live health report
// gets no new flows (Ananta's rule); established flows keep their
// backend. The grace before a silent host's backends go down is the
// lifetime of its reports in the store that carries them (an etcd lease's
// TTL), not a timer of the Mux. Backends on hosts without a Host Agent
// (not in hosts[]) are still probed by the Mux.
package mux

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/bgp"
	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/datapath"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/guard"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/internal/node"
)

// Config is the Mux's process configuration; everything else comes from
// the desired-state document at ConfigPath.
type Config struct {
	// Interface is the uplink: VIP traffic arrives and VXLAN leaves there.
	Interface string
	// Node is the Mux's name: which node of a fleet document's nodes
	// section it is (control.Document.ForNode). "" runs per-node
	// documents only.
	Node string
	// Queues is how many RX queues to serve (0: all of the interface).
	Queues int
	// ConfigPath is the desired-state document (YAML), watched for
	// changes; Reload re-reads it (SIGHUP). Used when Source is nil.
	ConfigPath string
	// Source, when set, is where the document comes from instead of
	// ConfigPath: e.g. the fleet's etcd (package fleet).
	Source control.Source
	// Port is the template of every AF_XDP port (Ring, Mode, NumFrames,
	// ring sizes); Interface, Queue and Name are set per queue.
	Port afxdp.Config
	// XDPMode is how the steering program is attached.
	XDPMode steer.AttachMode
	// Conns sizes the connection table (Capacity default 1<<20 flows).
	Conns flow.ConnTableConfig
	// VIPShare is the share of the connection table one VIP's new,
	// unproven flows may hold (balance.Config.VIPShare; 0: the default,
	// 1: no limit).
	VIPShare float64
	// SourceV4 and SourceV6 are the outer VXLAN source addresses; the
	// default is the uplink's first global address of each family.
	SourceV4, SourceV6 netip.Addr
	// MTU is the uplink's IP MTU (default: the interface's).
	MTU int
	// ProbeSource is the address health probes are sent from (default:
	// the kernel's choice).
	ProbeSource netip.Addr
	// ExternalHealth makes the Host Agents' reports decide the health of
	// the backends of probed VIPs that sit on hosts listed in the
	// document's hosts[] (SetDIPHealth): the Mux does not probe those.
	// Such a backend takes new flows only while the host the document
	// puts it on reports its (VIP's VNI, address, probed port) up; until
	// its host's first report, and once the host's reports are gone
	// (SetDIPHealth with none: its agent died and its keys expired), it
	// counts as down, as a backend the Mux probes does until its first
	// probe passes (Ananta's rule: no live health report, no new flows).
	// Flows already in the connection table keep their backend. Backends
	// on hosts without a Host Agent (not in hosts[], e.g. a kernel vxlan
	// device) are still probed by the Mux. Off (the default, and what a
	// file-only setup uses): the Mux probes every backend itself.
	ExternalHealth bool
	// IdleSpins is passed to the workers (engine.WorkerConfig).
	IdleSpins int
	// Logger receives the Mux's logs (default slog.Default()).
	Logger *slog.Logger
	// OnForwarding, when set, is called once the data path forwards:
	// every socket is open and the steering program attached. A process
	// drops the privileges it no longer needs there (see
	// internal/node.DropCapabilities); an error stops the Mux.
	OnForwarding func() error
}

// Mux is a running Mux node.
type Mux struct {
	cfg     Config
	log     *slog.Logger
	rules   *flow.Rules
	checker *health.Checker
	ctl     *Controller
	watcher control.Source

	mu sync.Mutex
	// conns is the connection table, built by connTable once the hash
	// seed is known (nil before).
	conns *flow.ConnTable
	// icmp and enc are the ICMP and encapsulation stages, built by
	// icmpStages and shared by every worker's pipeline, so that their
	// ICMP rate limits are the Mux's (nil before).
	icmp      *balance.ICMP
	enc       *encap.Encap
	resolver  *nexthop.Resolver // set by Run
	announcer *bgp.Announcer
	// unstarted is the stopped speaker of a version refused after its
	// speaker started, kept for the next try (apply; the watcher's
	// goroutine only).
	unstarted *bgp.Announcer
	// bgpDown is set by shutdownBGP and withdrawAll: from then on no
	// speaker starts (apply), and one an apply already in progress
	// started is shut down by that apply instead of becoming the
	// announcer.
	bgpDown   bool
	dp        *datapath.DataPath // the data path, set by Run once open
	accounts  []*balance.Account // one per pipeline (worker), read by the collector
	balancers []*balance.Stage   // one per pipeline (worker), read by the collector
	fastPaths []*fastPath        // one per pipeline (worker) that has one, read by the collector
	// partial completes the partial checksums of frames from senders on
	// this machine; shared by every worker's pipeline.
	partial *engine.PartialChecksums
	// sources is the source filter, shared by every worker's pipeline:
	// the VIPs come from the rules, and the prefix set — the node
	// addresses (nodeAddrs, set by Run before the first document), the
	// document's infrastructure and Mux prefixes — from the batch's
	// snapshot (sourcePrefixes, published by the Controller with the
	// rules of the same version).
	sources   *guard.Sources
	nodeAddrs []netip.Addr
	// seed is the hash_seed of the first document applied (seeded): the
	// one the connection table and every pipeline hash flows with. A
	// reload that changes it is refused (ErrRestartRequired).
	seed   uint64
	seeded bool
	// forwarding is true from the moment the data path runs until it
	// fails or stops (xdplb_datapath_up).
	forwarding atomic.Bool

	// SetDIPHealth's reports waiting to be applied, and the lock of the
	// caller applying them.
	extMu      sync.Mutex
	extPending map[string][]health.Verdict
	extApply   sync.Mutex
}

// New checks cfg and prepares a Mux; Run starts it.
func New(cfg Config) (*Mux, error) {
	if cfg.Interface == "" {
		return nil, errors.New("mux: Config.Interface is empty")
	}
	if cfg.ConfigPath == "" && cfg.Source == nil {
		return nil, errors.New("mux: Config.ConfigPath is empty (and no Config.Source)")
	}
	if cfg.Queues < 0 {
		return nil, errors.New("mux: Config.Queues must not be negative")
	}
	if cfg.Conns.Capacity == 0 {
		cfg.Conns.Capacity = 1 << 20
	}
	if !(cfg.VIPShare >= 0 && cfg.VIPShare <= 1) {
		return nil, fmt.Errorf("mux: Config.VIPShare must be in [0, 1] (0: the default), got %v", cfg.VIPShare)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// The table itself is built with the data path (connTable), once the
	// document's hash seed is known.
	if err := cfg.Conns.Check(); err != nil {
		return nil, fmt.Errorf("mux: %w", err)
	}
	m := &Mux{cfg: cfg, log: cfg.Logger, rules: flow.NewRules(), partial: engine.NewPartialChecksums()}
	var err error
	if m.sources, err = guard.NewSources(guard.SourcesConfig{Rules: m.rules}); err != nil {
		return nil, fmt.Errorf("mux: %w", err)
	}
	m.checker, err = health.NewChecker(health.CheckerConfig{Logger: cfg.Logger, Source: cfg.ProbeSource,
		OnChanges: func(evs []health.Event) { m.ctl.HealthChanged(evs...) }})
	if err != nil {
		return nil, fmt.Errorf("mux: %w", err)
	}
	m.ctl, err = NewController(ControllerConfig{SourcePrefixes: m.sourcePrefixes, Node: cfg.Node, Rules: m.rules, Checker: m.checker, Logger: cfg.Logger,
		ExternalHealth: cfg.ExternalHealth})
	if err != nil {
		return nil, err
	}
	m.watcher = cfg.Source
	if m.watcher == nil {
		m.watcher = control.NewWatcher(cfg.ConfigPath, control.WatcherOptions{Logger: cfg.Logger})
	}
	return m, nil
}

// Reload re-reads the document (what SIGHUP does).
func (m *Mux) Reload() { m.watcher.Reload() }

// Controller returns the Mux's controller (version, announcements).
func (m *Mux) Controller() *Controller { return m.ctl }

// Rules returns the published rules.
func (m *Mux) Rules() *flow.Rules { return m.rules }

// Conns returns the connection table, or nil before Run has built it
// (with the first document's hash seed).
func (m *Mux) Conns() *flow.ConnTable {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.conns
}

// connTable returns the Mux's connection table, built on the first call
// from Config.Conns with the fleet's flow hash of seed (the document's
// hash_seed): the hash the balance stage computes for a 5-tuple rule's
// Maglev pick is then where the table places the key, and each packet's
// key is hashed once (balance.Stage.HashesOnce, TestConnTableFleetHash).
// Later calls return the same table, whatever their seed.
func (m *Mux) connTable(seed uint64) (*flow.ConnTable, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conns == nil {
		ct, err := newConnTable(m.cfg.Conns, seed)
		if err != nil {
			return nil, fmt.Errorf("mux: %w", err)
		}
		m.conns = ct
	}
	return m.conns, nil
}

// icmpStages returns the ICMP and encapsulation stages, built on the
// first call and shared by every worker's pipeline after it: their rate
// limits (echo replies, fragmentation needed / packet too big) are the
// Mux's, as their configurations say, not each worker's.
func (m *Mux) icmpStages() (*balance.ICMP, *encap.Encap, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.icmp == nil {
		icmp, err := balance.NewICMP(balance.ICMPConfig{Rules: m.rules})
		if err != nil {
			return nil, nil, err
		}
		enc, err := encap.NewEncap(encap.EncapConfig{SourceV4: m.cfg.SourceV4, SourceV6: m.cfg.SourceV6, MTU: m.cfg.MTU,
			DecrementTTL: true})
		if err != nil {
			return nil, nil, err
		}
		m.icmp, m.enc = icmp, enc
	}
	return m.icmp, m.enc, nil
}

// newConnTable builds a connection table of cfg placing keys by the
// fleet's flow hash of seed (flow.ConnTableConfig.Hasher).
func newConnTable(cfg flow.ConnTableConfig, seed uint64) (*flow.ConnTable, error) {
	h := flow.NewHasher(seed)
	cfg.Hasher = &h
	return flow.NewConnTable(cfg)
}

// Status returns the document source's status (version, errors).
func (m *Mux) Status() control.Status { return m.watcher.Status() }

// Run runs the Mux until ctx is done, then shuts down in order: withdraw
// every VIP, keep forwarding for the BGP withdraw grace period, stop the
// workers, detach the steering program and close the sockets.
func (m *Mux) Run(ctx context.Context) error {
	ifi, err := net.InterfaceByName(m.cfg.Interface)
	if err != nil {
		return fmt.Errorf("mux: uplink: %w", err)
	}
	if err := m.defaults(ifi); err != nil {
		return err
	}

	resolver, err := nexthop.NewResolver(nexthop.Config{Logger: m.log})
	if err != nil {
		return fmt.Errorf("mux: next-hop resolver: %w", err)
	}
	defer resolver.Close()
	m.mu.Lock()
	m.resolver = resolver
	m.mu.Unlock()

	// A document may start the BGP speaker (apply): whatever way Run
	// returns, it stops announcing. On the ways out that never reach the
	// ordered shutdown below (no data path: nothing to forward during a
	// grace period) every VIP is withdrawn at once. Deferred before
	// side.Stop, so it runs once the watcher, which starts the speaker,
	// has stopped.
	bgpDown := false
	defer func() {
		if !bgpDown {
			m.withdrawAll()
			m.shutdownBGP()
		}
	}()

	// Side goroutines live until the data path has stopped.
	side := node.NewSide(m.log, "mux")
	defer side.Stop()
	side.Go("next-hop resolver", resolver.Run)
	side.Go("health checker", m.checker.Run)

	// The first document: Run of the watcher applies it and every newer
	// one; wait for the first before opening the data path.
	watchErr := make(chan error, 1)
	side.Go("config watcher", func(c context.Context) error {
		err := m.watcher.Run(c, func(doc *control.Document) error { return m.apply(c, doc) })
		watchErr <- err
		return err
	})
	select {
	case <-m.watcher.Ready():
	case err := <-watchErr:
		return fmt.Errorf("mux: first configuration: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}

	// The connection table, placing keys by the first document's flow
	// hash (the one every pipeline of this data path computes), and its
	// ager.
	m.mu.Lock()
	seed := m.seed
	m.mu.Unlock()
	conns, err := m.connTable(seed)
	if err != nil {
		return err
	}
	side.Go("connection ager", func(ctx context.Context) error {
		return node.Sweep(ctx, conns.Cap(), func(budget int) { conns.Age(conns.Now(), budget) })
	})

	// The data path, its steering program attached last; a failed open
	// releases what it opened. From here on the controller keeps the
	// program's rules in step with the documents.
	dp, err := m.openDataPath(resolver, seed)
	if err != nil {
		return err
	}
	defer m.closeDataPath(dp) // on the early returns; idempotent
	if err := m.ctl.SetSteering(dp.Links()[0].Program); err != nil {
		return fmt.Errorf("mux: steering: %w", err)
	}
	eng := dp.Engine()
	engCtx, stopEngine := context.WithCancel(context.Background())
	engDone := make(chan error, 1)
	go func() { engDone <- eng.Run(engCtx) }()
	m.forwarding.Store(true)
	m.log.Info("mux: forwarding", "interface", ifi.Name, "queues", len(eng.Workers()),
		"source_v4", m.cfg.SourceV4, "source_v6", m.cfg.SourceV6, "mtu", m.cfg.MTU)

	var runErr error
	if m.cfg.OnForwarding != nil {
		if err := m.cfg.OnForwarding(); err != nil {
			runErr = fmt.Errorf("mux: %w", err)
			m.log.Error("mux: stopping", "err", runErr)
		}
	}
	if runErr == nil {
		select {
		case <-ctx.Done():
		case err := <-engDone:
			// The data path is dead (a port's socket or interface failed,
			// see engine.Checker): stop attracting traffic at once —
			// withdraw every VIP without the grace period, since nothing
			// would forward during it — and return the error, so that a
			// supervisor restarts the Mux on the interface as it is now.
			runErr = err
			if runErr == nil {
				runErr = errors.New("mux: the data path stopped")
			}
			m.forwarding.Store(false)
			m.log.Error("mux: data path failed: withdrawing every VIP", "err", runErr)
			m.withdrawAll()
			engDone <- err
		}
	}
	m.forwarding.Store(false)
	m.shutdownBGP()
	bgpDown = true
	stopEngine()
	if err := <-engDone; err != nil && runErr == nil {
		runErr = err
	}
	m.closeDataPath(dp) // steered traffic goes to the kernel again
	side.Stop()
	return runErr
}

// apply is the watcher's callback: the controller applies the document;
// the BGP speaker is started on the first document that has one, and
// reconfigured on later ones.
//
// A document whose hash_seed differs from the first one's is refused
// (ErrRestartRequired): the connection table and the pipelines hash
// flows with the seed they were built with.
//
// A document whose BGP speaker differs from the running one in what
// needs a restart of the speaker (asn, router_id, listen_port,
// listen_addresses, or no bgp section any more) is refused before
// anything of it is applied: the running version stays, and the watcher
// counts the refusal (xdplb_config_rejected_total) instead of reporting
// the new version as applied. Restarting the Mux applies it.
func (m *Mux) apply(ctx context.Context, doc *control.Document) error {
	doc, err := doc.ForNode(m.cfg.Node)
	if err != nil {
		return err
	}
	m.mu.Lock()
	running, seed, seeded, bgpDown := m.announcer, m.seed, m.seeded, m.bgpDown
	m.mu.Unlock()
	if seeded && doc.HashSeed != seed {
		return fmt.Errorf("%w: hash_seed %#x, but the data path hashes flows with %#x (restart the Mux to apply it)",
			ErrRestartRequired, doc.HashSeed, seed)
	}
	if running != nil {
		if doc.BGP == nil {
			return fmt.Errorf("mux: the document has no bgp section, but the BGP speaker runs: %w (restart the Mux to apply it)", bgp.ErrRestartRequired)
		}
		if err := running.CheckReconfigure(bgpConfig(doc.BGP, m.log)); err != nil {
			return fmt.Errorf("mux: %w (restart the Mux to apply it)", err)
		}
	}
	// The first speaker starts before the controller applies anything:
	// one that cannot start (its listen port taken, say) refuses the
	// version whole, rather than leaving the controller on a version the
	// watcher reports refused.
	// A refused version's speaker is kept, stopped, for the next try
	// (m.unstarted): GoBGP cannot end a server, and a new speaker per try
	// of a version that stays refused would leave one behind each time.
	var started *bgp.Announcer
	if running == nil && doc.BGP != nil {
		if bgpDown {
			// The Mux shuts down (shutdownBGP ran): a speaker started now
			// would outlive it.
			return fmt.Errorf("mux: shutting down, the BGP speaker is not started: %w", bgp.ErrClosed)
		}
		cfg := bgpConfig(doc.BGP, m.log)
		a := m.unstarted
		m.unstarted = nil
		if a == nil || a.Reconfigure(cfg) != nil { // another speaker (ASN, router ID, listener): a new one
			if a != nil {
				_ = a.Shutdown(context.Background())
			}
			var err error
			if a, err = bgp.New(cfg); err != nil {
				return err
			}
		}
		if err := a.Start(ctx); err != nil {
			m.unstarted = a // Start left it stopped
			return err
		}
		started = a
	}
	if err := m.ctl.Apply(doc); err != nil {
		if started != nil {
			// It announced nothing: stopped at once, kept for the next try.
			if serr := started.Unstart(context.Background()); serr != nil {
				m.log.Error("mux: stopping the BGP speaker of a refused version", "err", serr)
				_ = started.Shutdown(context.Background())
			} else {
				m.unstarted = started
			}
		}
		return err
	}
	if stop := m.adopt(ctx, doc, started); stop != nil {
		// Shutdown began while this speaker started, and found none to
		// stop: it announced nothing; stop it here (outside m.mu), or
		// nothing would (a Mux embedded in a program that goes on leaves
		// its listener and sessions behind). The version runs, as the
		// controller applied it, without a speaker, as every version
		// does once the Mux shuts down.
		m.log.Info("mux: shutting down: stopping the BGP speaker the new version started")
		if err := stop.Shutdown(context.Background()); err != nil {
			m.log.Error("mux: BGP shutdown", "err", err)
		}
	}
	return nil
}

// adopt records what applying doc changed, under m.mu: the hash seed,
// the next hops to resolve, and the BGP speaker — the running one
// reconfigured, or started, the speaker apply started, made the Mux's.
// It returns started instead when shutdown began meanwhile (bgpDown), for
// the caller to stop.
func (m *Mux) adopt(ctx context.Context, doc *control.Document, started *bgp.Announcer) (stop *bgp.Announcer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.seeded {
		m.seed, m.seeded = doc.HashSeed, true
	}
	m.prefetch(ctx, doc)
	if doc.BGP == nil {
		return nil
	}
	if started == nil {
		if err := m.announcer.Reconfigure(bgpConfig(doc.BGP, m.log)); err != nil {
			m.log.Error("mux: BGP reconfiguration", "err", err)
		}
		return nil
	}
	if m.bgpDown {
		return started
	}
	m.announcer = started
	if err := m.ctl.SetAnnouncer(started); err != nil {
		// The version runs; the next change of the announced set retries.
		m.log.Error("mux: BGP announcements", "err", err)
	}
	return nil
}

// filterPrefixes are the prefixes the source filter refuses traffic from:
// the document's infrastructure prefixes and the Muxes'.
func filterPrefixes(doc *control.Document) []netip.Prefix {
	return append(slices.Clone(doc.InfraPrefixes), doc.MuxPrefixes...)
}

// prefetch has the resolver find the next hop towards every backend host
// of doc (and every host of an outbound section's DIPs) in the background, so that the first packets to a host are not
// dropped (nexthop_unresolved) while it resolves. Called with m.mu held.
func (m *Mux) prefetch(ctx context.Context, doc *control.Document) {
	r := m.resolver
	if r == nil {
		return
	}
	seen := map[netip.Addr]bool{}
	var hosts []netip.Addr
	add := func(h netip.Addr) {
		if !seen[h] {
			seen[h] = true
			hosts = append(hosts, h)
		}
	}
	for i := range doc.VIPs {
		for j := range doc.VIPs[i].Backends {
			add(doc.VIPs[i].Backends[j].Host)
		}
	}
	if plan := m.ctl.Plan(); plan != nil {
		for i := range plan.Outbound {
			for _, o := range plan.Outbound[i].Owners { // the hosts replies to outbound connections go to
				add(o.Host)
			}
		}
	}
	for _, h := range hosts {
		go func() {
			c, cancel := context.WithTimeout(ctx, prefetchTimeout)
			defer cancel()
			if _, err := r.Resolve(c, h); err != nil && c.Err() == nil && !errors.Is(err, nexthop.ErrClosed) {
				m.log.Warn("mux: no next hop towards a backend host", "host", h, "err", err)
			}
		}()
	}
}

// prefetchTimeout bounds a prefetch of one backend host's next hop.
const prefetchTimeout = 10 * time.Second

func bgpConfig(b *control.BGP, log *slog.Logger) bgp.Config {
	cfg := bgp.Config{ASN: b.ASN, RouterID: b.RouterID, ListenPort: b.ListenPort, ListenAddresses: b.ListenAddresses,
		HoldTime: b.HoldTime, WithdrawGrace: b.WithdrawGrace, NextHop: b.NextHop, NextHop6: b.NextHop6, Logger: log}
	for _, p := range b.Peers {
		cfg.Peers = append(cfg.Peers, bgp.Peer{Address: p.Address, ASN: p.ASN, Port: p.Port, Passive: p.Passive,
			Password: p.Password, TTLSecurity: p.TTLSecurity})
	}
	return cfg
}

// withdrawAll withdraws every VIP at once and keeps the sessions up
// (bgp.Announcer.Drain), so that the routers reroute without waiting for a
// hold timer; the Shutdown that follows skips the grace period. It is
// called on the ways out only (the data path failed, or Run returns
// without one), so from then on no speaker starts, as after shutdownBGP:
// one a reload started before the shutdown would announce, and make the
// shutdown wait its grace period with nothing forwarding.
func (m *Mux) withdrawAll() {
	m.mu.Lock()
	a := m.announcer
	m.bgpDown = true
	m.mu.Unlock()
	if a == nil {
		return
	}
	if err := a.Drain(); err != nil {
		m.log.Error("mux: withdraw", "err", err)
		return
	}
	m.log.Info("mux: every VIP withdrawn")
}

// Forwarding reports whether the data path runs (xdplb_datapath_up).
func (m *Mux) Forwarding() bool { return m.forwarding.Load() }

// shutdownBGP withdraws every VIP and waits the grace period while the
// data path still forwards, then closes the sessions.
//
// From then on no speaker starts: apply refuses a version that would start
// the first one, and stops one an apply in progress started (the watcher
// runs until the data path has stopped, so a reload may come in the
// grace period or while the speaker is shut down).
func (m *Mux) shutdownBGP() {
	m.mu.Lock()
	a := m.announcer
	m.bgpDown = true
	m.mu.Unlock()
	if a == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Shutdown(ctx); err != nil {
		m.log.Error("mux: BGP shutdown", "err", err)
	}
}

// defaults fills the outer source addresses and the MTU from the uplink,
// and the node addresses of the source filter: every address of the
// uplink and the outer sources.
func (m *Mux) defaults(ifi *net.Interface) error {
	if m.cfg.MTU == 0 {
		m.cfg.MTU = ifi.MTU
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return fmt.Errorf("mux: addresses of %s: %w", ifi.Name, err)
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		m.nodeAddrs = append(m.nodeAddrs, ip)
		if !ip.IsGlobalUnicast() {
			continue
		}
		if ip.Is4() && !m.cfg.SourceV4.IsValid() {
			m.cfg.SourceV4 = ip
		}
		if ip.Is6() && !m.cfg.SourceV6.IsValid() {
			m.cfg.SourceV6 = ip
		}
	}
	if !m.cfg.SourceV4.IsValid() && !m.cfg.SourceV6.IsValid() {
		return fmt.Errorf("mux: %s has no global address to send VXLAN from (set SourceV4/SourceV6)", ifi.Name)
	}
	for _, a := range []netip.Addr{m.cfg.SourceV4, m.cfg.SourceV6} {
		if a.IsValid() {
			m.nodeAddrs = append(m.nodeAddrs, a.Unmap())
		}
	}
	return nil
}

// Stats returns the data path's counters (zero before it runs).
func (m *Mux) Stats() engine.Stats {
	m.mu.Lock()
	dp := m.dp
	m.mu.Unlock()
	if dp == nil {
		return engine.Stats{}
	}
	return dp.Engine().Stats()
}

// sourcePrefixes is the source filter's set for doc: the Mux's own
// addresses, the infrastructure and Mux prefixes (published with the
// document's rules, in one snapshot).
func (m *Mux) sourcePrefixes(doc *control.Document) (*guard.Prefixes, error) {
	return guard.NewPrefixes(m.nodeAddrs, filterPrefixes(doc))
}

// ErrRestartRequired is wrapped by the error of a reload the running data
// path cannot take without a restart of the Mux: one that changes
// hash_seed (the connection table and every pipeline hash flows with the
// seed the data path was built with).
var ErrRestartRequired = errors.New("mux: restart required")
