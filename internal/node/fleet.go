package node

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// Fleet connects a node binary to its fleet's etcd: the document comes
// from there (Source) and the node's status goes there (Run); a Host
// Agent's DIP health and outbound port ranges go there, and a Mux
// follows them.
type Fleet struct {
	Client *clientv3.Client
	Source *fleet.Source
	role   string
	name   string
	log    *slog.Logger
	rep    *fleet.Reporter
	pub    *fleet.HealthPublisher              // a Host Agent's, when PublishHealth was called
	hw     *fleet.HealthWatcher                // a Mux's, when WatchHealth was called
	alloc  atomic.Pointer[fleet.PortAllocator] // a Host Agent's, when AllocatePorts was called
	aw     *fleet.AllocationWatcher            // a Mux's, when WatchPortAllocations was called
	prefix string

	forwarding func() bool // ReportForwarding's; nil: "running" once a document is applied

	mu    sync.Mutex
	state string // SetDataPath's
	fwd   string // what forwarding said last: "starting", "running", "down"
}

// NewFleet connects to the etcd endpoints (comma-separated, e.g.
// "http://198.18.0.1:2379" or "unix:///run/etcd.sock") under prefix, for
// the node of role and name. It does not wait for etcd: the Source does.
func NewFleet(endpoints, prefix, role, name string, log *slog.Logger) (*Fleet, error) {
	var eps []string
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("no etcd endpoints in %q", endpoints)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", endpoints, err)
	}
	f := &Fleet{Client: c, role: role, name: name, log: log, state: "starting", prefix: prefix}
	// The status is written as soon as a document is applied or refused,
	// and a Host Agent's outbound DIPs follow the document it runs. A
	// Host Agent follows its host's view (fleet.HostView), a Mux the
	// whole document.
	host := ""
	if role == fleet.RoleHostAgent {
		host = name
	}
	src, err := fleet.NewSource(fleet.SourceConfig{Client: c, Prefix: prefix, Logger: log, Host: host,
		OnOffer: func() { f.rep.Poke(); f.setOutboundDIPs() }})
	if err != nil {
		c.Close()
		return nil, err
	}
	f.Source = src
	f.rep, err = fleet.NewReporter(fleet.ReporterConfig{Client: c, Prefix: prefix, Role: role, Name: name,
		Logger: log, Status: f.status})
	if err != nil {
		c.Close()
		return nil, err
	}
	return f, nil
}

func (f *Fleet) status() fleet.NodeStatus {
	f.mu.Lock()
	state := f.state
	if state == "" {
		state = f.fwd
	}
	f.mu.Unlock()
	return fleet.StatusOf(f.role, f.name, f.Source.Status(), state)
}

// ReportForwarding makes the data path state the node reports follow
// forwarding (the node's Forwarding: whether its data path forwards):
// "starting" until it first does, then "running" while it does and
// "down" once it stopped (the node's log says why). Run asks it every
// ForwardingCheck and writes the status when the answer changes. A state
// set with SetDataPath wins. Call it before Run; without it the node
// reports "running" once its first document is applied.
func (f *Fleet) ReportForwarding(forwarding func() bool) {
	f.forwarding = forwarding
	f.state, f.fwd = "", "starting" // the state follows forwarding
}

// ForwardingCheck is how often Run asks ReportForwarding's function.
const ForwardingCheck = time.Second

// followForwarding keeps f.fwd what f.forwarding says until ctx is done,
// writing the status on each change.
func (f *Fleet) followForwarding(ctx context.Context) {
	t := time.NewTicker(ForwardingCheck)
	defer t.Stop()
	for {
		up := f.forwarding() // not under f.mu: it may take the node's own lock
		f.mu.Lock()
		prev, next := f.fwd, f.fwd
		switch {
		case up:
			next = "running"
		case prev == "running":
			next = "down"
		}
		f.fwd = next
		f.mu.Unlock()
		if next != prev {
			f.rep.Poke()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SetDataPath sets the data path state the node reports ("running",
// "stopping", "stopped", "down: ...") and writes the status at once.
func (f *Fleet) SetDataPath(state string) {
	f.mu.Lock()
	f.state = state
	f.mu.Unlock()
	f.rep.Poke()
}

// PublishHealth makes Run publish a Host Agent's verdicts on its DIPs
// (fleet.HealthPublisher, under the host's name): give what it returns
// to hostagent.Config.OnDIPHealth, with all returning
// hostagent.Agent.DIPHealth. Call it before Run.
func (f *Fleet) PublishHealth(all func() []health.Verdict) (func([]health.Verdict), error) {
	pub, err := fleet.NewHealthPublisher(fleet.HealthPublisherConfig{Client: f.Client, Prefix: f.prefix, Host: f.name, Logger: f.log})
	if err != nil {
		return nil, err
	}
	f.pub = pub
	return func([]health.Verdict) { pub.Publish(all()) }, nil
}

// WatchHealth makes Run follow the verdicts every Host Agent publishes
// and hand them to on (mux.Controller.SetDIPHealth). Call it before Run.
func (f *Fleet) WatchHealth(on func(map[string][]health.Verdict) error) error {
	hw, err := fleet.NewHealthWatcher(fleet.HealthWatcherConfig{Client: f.Client, Prefix: f.prefix, Logger: f.log,
		OnReports: func(r map[string][]health.Verdict) {
			if err := on(r); err != nil {
				f.log.Error("fleet: DIP health reports not applied", "err", err)
			}
		}})
	if err != nil {
		return err
	}
	f.hw = hw
	return nil
}

// OutboundAgent is what a Host Agent gives its port allocator: the
// ranges its DIPs hold, and how much of each (and of any range withdrawn
// that still holds connections) its connections use
// (fleet.PortAllocatorConfig's OnChange and Usage).
type OutboundAgent interface {
	SetOutboundAllocations([]flow.PortAllocation)
	OutboundUsage(dst []flow.PortRangeUse) []flow.PortRangeUse
}

// PortAllocationSink is what a Mux gives the allocation watcher: every
// range the fleet's Host Agents hold, to send the replies on its ports
// to their hosts (the document's static ranges are the Mux's to add).
type PortAllocationSink interface {
	SetPortAllocations([]flow.PortAllocation) error
}

// AllocatePorts makes Run claim outbound port ranges in etcd for this
// Host Agent's DIPs in the running document's outbound sections
// (fleet.PortAllocator under the host's name, fleet.OutboundDIPs) and
// hand them to agent. maxConnTimeout is the NAT's longest connection
// timeout (0: fleet's default): a dead host's ranges go to no other DIP
// before its lease's TTL plus that. Call it before Run.
func (f *Fleet) AllocatePorts(agent OutboundAgent, maxConnTimeout time.Duration) error {
	a, err := fleet.NewPortAllocator(fleet.PortAllocatorConfig{Client: f.Client, Prefix: f.prefix, Host: f.name,
		MaxConnTimeout: maxConnTimeout, Usage: agent.OutboundUsage, OnChange: agent.SetOutboundAllocations, Logger: f.log})
	if err != nil {
		return err
	}
	f.alloc.Store(a)
	f.setOutboundDIPs()
	return nil
}

// setOutboundDIPs gives the allocator, if any, the DIPs of the running
// document.
func (f *Fleet) setOutboundDIPs() {
	a := f.alloc.Load()
	if a == nil {
		return
	}
	if doc := f.Source.Document(); doc != nil {
		a.SetDIPs(fleet.OutboundDIPs(doc, f.name))
	}
}

// AllocationCounters returns what the Host Agent's port allocator has
// done (claims, returns, conflicts, exhaustion), and false when
// AllocatePorts was not called.
func (f *Fleet) AllocationCounters() (fleet.PortAllocatorCounters, bool) {
	if a := f.alloc.Load(); a != nil {
		return a.Counters(), true
	}
	return fleet.PortAllocatorCounters{}, false
}

// WatchPortAllocations makes Run follow every Host Agent's port ranges
// and hand them to mux. Call it before Run.
func (f *Fleet) WatchPortAllocations(mux PortAllocationSink) error {
	aw, err := fleet.NewAllocationWatcher(fleet.AllocationWatcherConfig{Client: f.Client, Prefix: f.prefix, Logger: f.log,
		OnAllocations: func(as []flow.PortAllocation) {
			if err := mux.SetPortAllocations(as); err != nil {
				f.log.Error("fleet: port allocations not applied", "err", err)
			}
		}})
	if err != nil {
		return err
	}
	f.aw = aw
	return nil
}

// Run reports the node's status until ctx is done (then removes it),
// its data path's state as ReportForwarding says (or running once the
// first document is applied), and
// publishes or follows DIP health and claims or follows outbound port
// ranges when asked to.
func (f *Fleet) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait() // a stopping Host Agent's verdicts are revoked before it exits
	if f.pub != nil {
		wg.Go(func() { f.pub.Run(ctx) })
	}
	if f.hw != nil {
		wg.Go(func() { f.hw.Run(ctx) })
	}
	if a := f.alloc.Load(); a != nil {
		wg.Go(func() { a.Run(ctx) })
	}
	if f.aw != nil {
		wg.Go(func() { f.aw.Run(ctx) })
	}
	if f.forwarding != nil {
		go f.followForwarding(ctx)
	} else {
		go func() {
			select {
			case <-f.Source.Ready():
				f.SetDataPath("running")
			case <-ctx.Done():
			}
		}()
	}
	return f.rep.Run(ctx)
}

// Start runs f (Run) for a node whose data path forwards while
// forwarding says so (ReportForwarding) and which stops when ctx is done,
// until the function it returns is called: the state is "stopping" from
// the moment ctx is done (the node withdraws its routes and winds its
// data path down, which is no failure), and "stopped" once it is called,
// written before the status is removed.
func (f *Fleet) Start(ctx context.Context, forwarding func() bool) (stop func()) {
	f.ReportForwarding(forwarding)
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(rctx); close(done) }()
	quit, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-ctx.Done():
			f.SetDataPath("stopping")
		case <-quit:
		}
	}()
	return func() {
		close(quit)
		<-watched
		f.SetDataPath("stopped")
		cancel()
		<-done
	}
}

// Close closes the etcd client.
func (f *Fleet) Close() { f.Client.Close() }
