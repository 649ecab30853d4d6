package node

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/health"
)

// Fleet connects a node binary to its fleet's etcd: the document comes
// from there (Source) and the node's status goes there (Run).
type Fleet struct {
	Client *clientv3.Client
	Source *fleet.Source
	role   string
	name   string
	log    *slog.Logger
	rep    *fleet.Reporter
	pub    *fleet.HealthPublisher // a Host Agent's, when PublishHealth was called
	hw     *fleet.HealthWatcher   // a Mux's, when WatchHealth was called
	prefix string

	mu    sync.Mutex
	state string
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
	// The status is written as soon as a document is applied or refused.
	src, err := fleet.NewSource(fleet.SourceConfig{Client: c, Prefix: prefix, Logger: log,
		OnOffer: func() { f.rep.Poke() }})
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
	f.mu.Unlock()
	return fleet.StatusOf(f.role, f.name, f.Source.Status(), state)
}

// SetDataPath sets the data path state the node reports ("running",
// "stopping", "down: ...") and writes the status at once.
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

// Run reports the node's status until ctx is done (then removes it),
// marking the data path running once the first document is applied, and
// publishes or follows DIP health when asked to.
func (f *Fleet) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait() // a stopping Host Agent's verdicts are revoked before it exits
	if f.pub != nil {
		wg.Go(func() { f.pub.Run(ctx) })
	}
	if f.hw != nil {
		wg.Go(func() { f.hw.Run(ctx) })
	}
	go func() {
		select {
		case <-f.Source.Ready():
			f.SetDataPath("running")
		case <-ctx.Done():
		}
	}()
	return f.rep.Run(ctx)
}

// Close closes the etcd client.
func (f *Fleet) Close() { f.Client.Close() }
