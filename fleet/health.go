package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/xdplb/xdplb/health"
)

// HealthKey names one probed DIP as published: its host and the
// verdict's key (VNI, address, probed port). Two tenants' DIPs with one
// address are two keys.
type HealthKey struct {
	Host string
	health.VerdictKey
}

func (k keys) healths() string { return k.prefix + "health/" }

func (k keys) hostHealth(host string) string { return k.healths() + host + "/" }

func (k keys) health(host string, v health.VerdictKey) string {
	return fmt.Sprintf("%s%d/%s/%d", k.hostHealth(host), v.VNI, v.Addr, v.Port)
}

// parseHealthKey reads a key written by keys.health.
func (k keys) parseHealthKey(key string) (HealthKey, bool) {
	rest, ok := strings.CutPrefix(key, k.healths())
	if !ok {
		return HealthKey{}, false
	}
	f := strings.Split(rest, "/")
	if len(f) != 4 {
		return HealthKey{}, false
	}
	vni, err1 := strconv.ParseUint(f[1], 10, 32)
	addr, err2 := netip.ParseAddr(f[2])
	port, err3 := strconv.ParseUint(f[3], 10, 16)
	if f[0] == "" || err1 != nil || err2 != nil || err3 != nil {
		return HealthKey{}, false
	}
	return HealthKey{Host: f[0], VerdictKey: health.VerdictKey{VNI: uint32(vni), Addr: addr, Port: uint16(port)}}, true
}

func decodeVerdict(b []byte) (health.Verdict, bool) {
	var v health.Verdict
	return v, json.Unmarshal(b, &v) == nil
}

// HealthPublisherConfig configures a HealthPublisher.
type HealthPublisherConfig struct {
	Client *clientv3.Client // required
	Prefix string           // default DefaultPrefix
	// Host is the host's name in the document's hosts[] (required): the
	// Muxes match reports to backends by it.
	Host string
	// TTL is the lease's time to live: when the Host Agent is gone, its
	// verdicts expire this long after, and the Muxes stop sending new
	// flows to its DIPs (default 10s).
	TTL    time.Duration
	Logger *slog.Logger
}

// HealthPublisher publishes a Host Agent's verdicts on its DIPs, one key
// each (health/<host>/<vni>/<dip>/<port>, JSON health.Verdict), under the
// host's lease.
type HealthPublisher struct {
	cfg  HealthPublisherConfig
	k    keys
	poke chan struct{}

	mu   sync.Mutex
	want map[health.VerdictKey]health.Verdict
}

// NewHealthPublisher returns a HealthPublisher; nothing is written until
// Run.
func NewHealthPublisher(cfg HealthPublisherConfig) (*HealthPublisher, error) {
	if cfg.Client == nil {
		return nil, errors.New("fleet: HealthPublisherConfig.Client is nil")
	}
	if cfg.Host == "" || strings.Contains(cfg.Host, "/") {
		return nil, fmt.Errorf("fleet: host %q: want a name without '/'", cfg.Host)
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &HealthPublisher{cfg: cfg, k: newKeys(cfg.Prefix), poke: make(chan struct{}, 1),
		want: map[health.VerdictKey]health.Verdict{}}, nil
}

// Publish sets the host's complete current verdicts (what
// hostagent.Agent.DIPHealth returns); Run writes what changed. It does
// not wait, and may be called from any goroutine.
func (p *HealthPublisher) Publish(all []health.Verdict) {
	m := make(map[health.VerdictKey]health.Verdict, len(all))
	for _, v := range all {
		m[v.Key()] = v
	}
	p.mu.Lock()
	p.want = m
	p.mu.Unlock()
	select {
	case p.poke <- struct{}{}:
	default:
	}
}

// Run writes the verdicts until ctx is done, then deletes them (revokes
// the lease): a Host Agent that stops cleanly takes its DIPs out of
// service at once. While etcd is unreachable it retries; a lease lost
// meanwhile is replaced and every verdict written again.
func (p *HealthPublisher) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(p.cfg.Client, concurrency.WithTTL(int((p.cfg.TTL+time.Second-1)/time.Second)),
			concurrency.WithContext(ctx))
		if err != nil {
			p.cfg.Logger.Warn("fleet: health lease", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		p.run(ctx, sess)
		if ctx.Err() != nil {
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, _ = p.cfg.Client.Revoke(rctx, sess.Lease())
			cancel()
		}
		sess.Orphan()
	}
	return nil
}

// maxOps bounds the operations of one transaction (etcd's default
// --max-txn-ops is 128).
const maxOps = 128

func (p *HealthPublisher) run(ctx context.Context, sess *concurrency.Session) {
	written := map[health.VerdictKey]health.Verdict{} // what this lease holds
	// Whatever an earlier lease of this host left (a crash before it
	// expired) is replaced or deleted.
	if r, err := p.cfg.Client.Get(ctx, p.k.hostHealth(p.cfg.Host), clientv3.WithPrefix(), clientv3.WithKeysOnly()); err == nil {
		for _, kv := range r.Kvs {
			if hk, ok := p.k.parseHealthKey(string(kv.Key)); ok {
				written[hk.VerdictKey] = health.Verdict{Reason: "stale"}
			}
		}
	}
	for {
		if leaseLost(ctx, sess, p.cfg.Logger, "health") {
			return
		}
		p.mu.Lock()
		want := p.want
		p.mu.Unlock()
		var ops []clientv3.Op
		for k, v := range want {
			if old, ok := written[k]; ok && old == v {
				continue
			}
			b, _ := json.Marshal(v)
			ops = append(ops, clientv3.OpPut(p.k.health(p.cfg.Host, k), string(b), clientv3.WithLease(sess.Lease())))
		}
		for k := range written {
			if _, ok := want[k]; !ok {
				ops = append(ops, clientv3.OpDelete(p.k.health(p.cfg.Host, k)))
			}
		}
		ok := true
		for len(ops) > 0 && ok {
			n := min(len(ops), maxOps)
			wctx, cancel := context.WithTimeout(sess.Ctx(), 5*time.Second) // ends when the lease is lost
			_, err := p.cfg.Client.Txn(wctx).Then(ops[:n]...).Commit()
			cancel()
			if err != nil {
				if ctx.Err() == nil && sess.Ctx().Err() == nil {
					p.cfg.Logger.Warn("fleet: health write", "err", err)
				}
				ok = false
				break
			}
			ops = ops[n:]
		}
		if ok {
			written = make(map[health.VerdictKey]health.Verdict, len(want))
			for k, v := range want {
				written[k] = v
			}
		}
		var retry <-chan time.Time
		if !ok {
			retry = time.After(time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-sess.Done():
		case <-p.poke:
		case <-retry:
		}
	}
}

// HealthWatcherConfig configures a HealthWatcher.
type HealthWatcherConfig struct {
	Client *clientv3.Client // required
	Prefix string           // default DefaultPrefix
	// OnReports is called with the complete current verdicts of every
	// host whose reports changed (nil or empty: the host reports nothing
	// any more), one call at a time, from a goroutine Run starts: give it
	// to mux.Controller.SetDIPHealth. What changes while a call runs is
	// handed over in the next call, together, however many watch
	// responses it came in.
	OnReports func(map[string][]health.Verdict)
	Logger    *slog.Logger
}

// HealthWatcher follows the verdicts every Host Agent publishes, for a
// Mux. A host whose keys expire (its Host Agent is gone for a lease's
// time) is reported with no verdicts: its DIPs get no new flows. While
// etcd is unreachable the last verdicts stay: the data plane does not
// depend on the control plane being up.
//
// Reports are coalesced: the watch keeps reading while OnReports runs,
// and the next call gets every host that changed meanwhile. A burst of
// hosts publishing (a fleet starting, a rack's leases expiring) costs
// the Mux one rebuild of each VIP it touches per call, not one per host.
type HealthWatcher struct {
	cfg   HealthWatcherConfig
	k     keys
	ready chan struct{}
	poke  chan struct{}

	mu    sync.Mutex
	hosts map[string]map[health.VerdictKey]health.Verdict
	dirty map[string]bool // hosts changed since the last report
	read  bool            // a complete read is among what dirty holds
}

// NewHealthWatcher returns a HealthWatcher; nothing happens until Run.
func NewHealthWatcher(cfg HealthWatcherConfig) (*HealthWatcher, error) {
	if cfg.Client == nil || cfg.OnReports == nil {
		return nil, errors.New("fleet: HealthWatcherConfig needs a Client and OnReports")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &HealthWatcher{cfg: cfg, k: newKeys(cfg.Prefix), hosts: map[string]map[health.VerdictKey]health.Verdict{},
		dirty: map[string]bool{}, ready: make(chan struct{}), poke: make(chan struct{}, 1)}, nil
}

// Ready is closed once the first complete read is reported.
func (w *HealthWatcher) Ready() <-chan struct{} { return w.ready }

// Run follows the verdicts until ctx is done.
func (w *HealthWatcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { w.reportLoop(ctx) })
	f := follower{client: w.cfg.Client, logger: w.cfg.Logger, prefix: w.k.healths(), what: "the last verdicts",
		read: w.readAll, events: w.apply}
	f.run(ctx)
	return nil
}

// readAll replaces every host's verdicts with what etcd holds.
func (w *HealthWatcher) readAll(resp *clientv3.GetResponse) {
	now := map[string]map[health.VerdictKey]health.Verdict{}
	for _, kv := range resp.Kvs {
		hk, ok1 := w.k.parseHealthKey(string(kv.Key))
		v, ok2 := decodeVerdict(kv.Value)
		if !ok1 || !ok2 {
			continue
		}
		if now[hk.Host] == nil {
			now[hk.Host] = map[health.VerdictKey]health.Verdict{}
		}
		now[hk.Host][hk.VerdictKey] = v
	}
	w.mu.Lock()
	for h := range w.hosts {
		w.dirty[h] = true
	}
	for h := range now {
		w.dirty[h] = true
	}
	w.hosts, w.read = now, true
	w.mu.Unlock()
	w.wake()
}

// apply applies one watch response's changes.
func (w *HealthWatcher) apply(events []*clientv3.Event) {
	w.mu.Lock()
	for _, ev := range events {
		hk, ok := w.k.parseHealthKey(string(ev.Kv.Key))
		if !ok {
			continue
		}
		w.dirty[hk.Host] = true
		if ev.Type == clientv3.EventTypeDelete {
			delete(w.hosts[hk.Host], hk.VerdictKey)
			continue
		}
		v, ok := decodeVerdict(ev.Kv.Value)
		if !ok {
			continue
		}
		if w.hosts[hk.Host] == nil {
			w.hosts[hk.Host] = map[health.VerdictKey]health.Verdict{}
		}
		w.hosts[hk.Host][hk.VerdictKey] = v
	}
	w.mu.Unlock()
	w.wake()
}

func (w *HealthWatcher) wake() {
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// reportLoop hands what changed to OnReports, one call at a time, until
// ctx is done.
func (w *HealthWatcher) reportLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.poke:
		}
		reports, read := w.take()
		if len(reports) > 0 {
			w.cfg.OnReports(reports)
		}
		if read {
			select {
			case <-w.ready:
			default:
				close(w.ready)
			}
		}
	}
}

// take returns the complete verdicts of every host changed since the last
// call (nil for a host that reports nothing any more), and whether a
// complete read is among them.
func (w *HealthWatcher) take() (map[string][]health.Verdict, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	reports := make(map[string][]health.Verdict, len(w.dirty))
	for h := range w.dirty {
		var vs []health.Verdict
		for _, v := range w.hosts[h] {
			vs = append(vs, v)
		}
		if len(vs) == 0 {
			delete(w.hosts, h)
		}
		reports[h] = vs
	}
	read := w.read
	clear(w.dirty)
	w.read = false
	return reports, read
}
