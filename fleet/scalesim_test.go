package fleet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
	"github.com/xdplb/xdplb/mux"
)

// sim is a fleet simulated in one process around one real etcd member:
// every Host Agent and Mux runs the fleet package's real pieces (Source,
// Reporter, HealthPublisher, HealthWatcher, and a Mux's mux.Controller
// with ExternalHealth), with no data path. Host Agents share an etcd
// client per hostsPerClient of them; each Mux has its own.
type sim struct {
	tb     testing.TB
	shape  scaleShape
	etcd   *embed.Etcd
	admin  *clientv3.Client
	conns  []*clientv3.Client
	hosts  []*simHost
	muxes  []*simMux
	rec    *recorder
	parse  *sharedParse
	probe  atomic.Pointer[dipProbe] // what the Muxes look for in their rules
	limit  time.Duration            // the longest wait for anything (a liveness bound)
	cancel context.CancelFunc
	wg     sync.WaitGroup
	log    *slog.Logger
}

// hostsPerClient is how many simulated Host Agents share one etcd client
// (one gRPC connection); each Mux has its own.
const hostsPerClient = 50

// leaseTTL is the nodes' lease TTL (status and health). The default, 10
// s, is too short here: while the process applies a version for 1,016
// nodes on two shared cores, keep-alives wait in line, leases expire, the
// hosts' verdicts with them, every Mux rebuilds the VIPs they served, and
// the extra work makes more leases expire (see benchmarks/README.md).
const leaseTTL = 60 * time.Second

// startWave is how many Host Agents start at once.
const startWave = 100

type simHost struct {
	name    string
	src     *fleet.Source
	pub     *fleet.HealthPublisher
	version atomic.Uint64 // the version its apply saw last
	up      []health.Verdict
}

type simMux struct {
	name    string
	src     *fleet.Source
	ctl     *mux.Controller
	rules   *flow.Rules
	version atomic.Uint64
	seen    string // the last probe found in its rules (its watcher's goroutine only)
}

// dipProbe is a DIP whose state the driver changed: the Muxes record when
// their published rules show it.
type dipProbe struct {
	key  string // recorder key
	vip  uint32 // rule ID: the VIP's index in the document
	addr [4]byte
	up   bool
}

// sharedParse parses each document text once for all the simulated
// nodes (control.Tracker.SetParse): the first node to read a text parses
// it, the others wait and get the same Document, as if every node had
// parsed it on its own CPU at the same time.
type sharedParse struct {
	parser control.Parser // what each node's Tracker has (its own): the one the Muxes share
	mu     sync.Mutex
	text   []byte
	doc    *control.Document
	err    error
	parses atomic.Int64
}

func (p *sharedParse) parse(_ string, text []byte) (*control.Document, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.text == nil || !bytes.Equal(p.text, text) {
		p.parses.Add(1)
		p.text = text
		p.doc, p.err = p.parser.Parse("", text)
	}
	return p.doc, p.err
}

// recorder counts arrivals of named events (a version applied by a
// node, a DIP's change in a Mux's rules) and keeps the last one's time.
type recorder struct {
	mu sync.Mutex
	ev map[string]*arrival
}

type arrival struct {
	want int
	n    int
	last time.Time
	done chan struct{}
}

func (r *recorder) get(key string, want int) *arrival {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.ev[key]
	if a == nil {
		a = &arrival{want: want, done: make(chan struct{})}
		r.ev[key] = a
	}
	return a
}

func (r *recorder) arrive(key string, want int) {
	now := time.Now()
	a := r.get(key, want)
	r.mu.Lock()
	defer r.mu.Unlock()
	a.n++
	a.last = now
	if a.n == a.want {
		close(a.done)
	}
}

// wait waits until every expected arrival of key is in; it returns the
// last one's time, or fails the test after limit (a liveness bound, not a
// timing assertion).
func (r *recorder) wait(tb testing.TB, key string, want int, limit time.Duration) time.Time {
	a := r.get(key, want)
	select {
	case <-a.done:
	case <-time.After(limit):
		r.mu.Lock()
		n := a.n
		r.mu.Unlock()
		tb.Fatalf("%s: %d of %d arrived within %v", key, n, want, limit)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return a.last
}

// waitCount waits until at least n arrivals of key are in.
func (r *recorder) waitCount(tb testing.TB, key string, n int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for {
		r.mu.Lock()
		got := 0
		if a := r.ev[key]; a != nil {
			got = a.n
		}
		r.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: %d of %d arrived within %v", key, got, n, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func versionKey(v uint64) string { return fmt.Sprintf("applied v%d", v) }
func liveKey(v uint64) string    { return fmt.Sprintf("live v%d", v) }

// roleVersionKey counts the nodes of one role that applied v.
func roleVersionKey(role string, v uint64) string { return fmt.Sprintf("applied v%d by %s", v, role) }

// nodes is how many nodes apply each version.
func (s *sim) nodes() int { return s.shape.Hosts + s.shape.Muxes }

// startSim starts etcd, writes version 1 and starts every node; it
// returns once every node runs version 1 and every Mux has every DIP up.
func startSim(tb testing.TB, shape scaleShape, limit time.Duration) *sim {
	s := &sim{tb: tb, shape: shape, rec: &recorder{ev: map[string]*arrival{}}, parse: &sharedParse{}, limit: limit,
		log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	cluster := etcdlab.NewCluster(tb.TempDir(), 1)
	var err error
	if s.etcd, err = cluster.Start(0, time.Minute); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.etcd.Close() })
	client := func() *clientv3.Client {
		c, err := etcdlab.Client(cluster.Endpoints())
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Close() })
		return c
	}
	s.admin = client()
	s.apply(1)

	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	tb.Cleanup(s.stop)
	s.wg.Go(func() { s.watchStatus(ctx) })
	// Hosts start in waves, each once the one before runs version 1: all
	// reading the document at once, they would ask etcd for ~1.5 GB at
	// 10,000 DIPs, and on a loaded machine their reads time out (10 s)
	// and retry together (see benchmarks/README.md). The Muxes start
	// last, so that each reads every host's verdicts at once: the start
	// is not what is measured.
	for i := range shape.Hosts {
		if i%hostsPerClient == 0 {
			s.conns = append(s.conns, client())
		}
		s.startHost(ctx, i, s.conns[len(s.conns)-1])
		if (i+1)%startWave == 0 || i+1 == shape.Hosts {
			s.rec.waitCount(tb, versionKey(1), i+1, s.limit)
			s.progress("%d Host Agents run version 1", i+1)
		}
	}
	for i := range shape.Muxes {
		s.startMux(ctx, i, client())
	}
	s.rec.wait(tb, versionKey(1), s.nodes(), s.limit)
	s.rec.wait(tb, "all up", shape.Muxes, s.limit)
	s.progress("%d Muxes run version 1 with every DIP up", shape.Muxes)
	return s
}

// progress tells a person running the benchmark with -test.v how far it
// is (b.Logf shows only at the end).
func (s *sim) progress(format string, args ...any) {
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "%s scale: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
}

func (s *sim) stop() {
	s.cancel()
	s.wg.Wait()
}

// apply writes version v as xdplbctl apply does, and returns when it
// did (the document is parsed first, as xdplbctl does before it writes).
func (s *sim) apply(v uint64) time.Time {
	text := scaleDoc(s.shape, v)
	doc, err := control.Parse(text)
	if err != nil {
		s.tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	if _, err := fleet.Apply(ctx, s.admin, "", text, doc, "scale"); err != nil {
		s.tb.Fatal(err)
	}
	s.progress("Apply of version %d returned in %v", v, time.Since(t0).Round(time.Millisecond))
	return t0
}

func (s *sim) must(err error) {
	if err != nil {
		s.tb.Fatal(err)
	}
}

// mustRun fails the test with a Source's error, unless the simulation
// is stopping.
func (s *sim) mustRun(ctx context.Context, err error) {
	if err != nil && ctx.Err() == nil {
		s.tb.Error(err)
	}
}

func (s *sim) startHost(ctx context.Context, i int, c *clientv3.Client) {
	h := &simHost{name: hostName(i)}
	var err error
	var rep *fleet.Reporter
	// A Host Agent follows its view (fleet.HostView), parsed by itself:
	// views differ by host. A version that leaves its view as it was
	// advances it without an apply, so arrivals are counted from its
	// status, after every offer.
	var parse func(string, []byte) (*control.Document, error)
	if !*scaleHostParts {
		parse = func(_ string, text []byte) (*control.Document, error) { return control.Parse(text) } // see scaleHostParts
	}
	h.src, err = fleet.NewSource(fleet.SourceConfig{Client: c, Logger: s.log, Host: h.name, Parse: parse,
		OnOffer: func() { s.offered(fleet.RoleHostAgent, h.src, &h.version, rep) }})
	s.must(err)
	rep, err = fleet.NewReporter(fleet.ReporterConfig{Client: c, Role: fleet.RoleHostAgent, Name: h.name, Logger: s.log, TTL: leaseTTL,
		Status: func() fleet.NodeStatus { return statusOf(fleet.RoleHostAgent, h.name, h.src, h.version.Load()) }})
	s.must(err)
	h.pub, err = fleet.NewHealthPublisher(fleet.HealthPublisherConfig{Client: c, Host: h.name, Logger: s.log, TTL: leaseTTL})
	s.must(err)
	for j := i * s.shape.DIPsPerHost; j < (i+1)*s.shape.DIPsPerHost; j++ {
		h.up = append(h.up, health.Verdict{VNI: vipVNI(s.shape.dipVIP(j)), Addr: dipAddr(j), Port: 8080, Up: true})
	}
	h.pub.Publish(h.up)
	s.hosts = append(s.hosts, h)
	s.wg.Go(func() {
		s.mustRun(ctx, h.src.Run(ctx, func(d *control.Document) error { return nil }))
	})
	s.wg.Go(func() { rep.Run(ctx) })
	s.wg.Go(func() { h.pub.Run(ctx) })
}

// offered records the versions src reached since the last offer (an
// apply, or an advance without one), and pokes the node's Reporter.
func (s *sim) offered(role string, src *fleet.Source, version *atomic.Uint64, rep *fleet.Reporter) {
	old, v := version.Load(), src.Status().Version
	if v <= old {
		return
	}
	version.Store(v)
	rep.Poke()
	n := s.shape.Hosts
	if role == fleet.RoleMux {
		n = s.shape.Muxes
	}
	for w := old + 1; w <= v; w++ {
		s.rec.arrive(versionKey(w), s.nodes())
		s.rec.arrive(roleVersionKey(role, w), n)
	}
}

// statusOf is what a node reports: its Source's status, with the version
// its apply just took (the Source records it once apply returns; the
// reference binaries poll it every 200 ms, internal/node.Fleet).
func statusOf(role, name string, src *fleet.Source, applied uint64) fleet.NodeStatus {
	st := fleet.StatusOf(role, name, src.Status(), "running")
	st.Version = max(st.Version, applied)
	return st
}

// simChecker is the Controller's own checker: with ExternalHealth and
// every backend on a host with a Host Agent, it gets no targets.
type simChecker struct{}

func (simChecker) Set([]health.Target) error         { return nil }
func (simChecker) State(string) (health.State, bool) { return health.Unknown, false }
func (s *sim) startMux(ctx context.Context, i int, c *clientv3.Client) {
	m := &simMux{name: fmt.Sprintf("mux%d", i), rules: flow.NewRules()}
	var err error
	m.ctl, err = mux.NewController(mux.ControllerConfig{Rules: m.rules, Checker: simChecker{}, Logger: s.log, ExternalHealth: true})
	s.must(err)
	var rep *fleet.Reporter
	// A version whose content sum is the running one's (only the version
	// changed) advances without an apply: arrivals are counted from the
	// Source's status.
	m.src, err = fleet.NewSource(fleet.SourceConfig{Client: c, Logger: s.log, Parse: s.parse.parse,
		OnOffer: func() { s.offered(fleet.RoleMux, m.src, &m.version, rep) }})
	s.must(err)
	rep, err = fleet.NewReporter(fleet.ReporterConfig{Client: c, Role: fleet.RoleMux, Name: m.name, Logger: s.log, TTL: leaseTTL,
		Status: func() fleet.NodeStatus { return statusOf(fleet.RoleMux, m.name, m.src, m.version.Load()) }})
	s.must(err)
	hw, err := fleet.NewHealthWatcher(fleet.HealthWatcherConfig{Client: c, Logger: s.log,
		OnReports: func(r map[string][]health.Verdict) {
			if err := m.ctl.SetDIPHealth(r); err != nil {
				s.tb.Error(err)
			}
			s.look(m)
		}})
	s.must(err)
	s.muxes = append(s.muxes, m)
	srcReady := make(chan struct{})
	s.wg.Go(func() {
		s.mustRun(ctx, m.src.Run(ctx, m.ctl.Apply))
	})
	s.wg.Go(func() {
		close(srcReady)
		<-m.src.Ready() // reports before a document decide nothing
		hw.Run(ctx)
	})
	s.wg.Go(func() { rep.Run(ctx) })
	<-srcReady
}

// look records what m's published rules show: every DIP up (once, at
// start), and the driver's current probe.
func (s *sim) look(m *simMux) {
	snap := m.rules.Load()
	if m.seen == "" {
		n := 0
		for _, r := range snap.Rules() {
			for _, b := range r.Backends {
				if b.State == flow.BackendActive {
					n++
				}
			}
		}
		if n == s.shape.dips() {
			m.seen = "all up"
			s.rec.arrive("all up", s.shape.Muxes)
		}
		return
	}
	p := s.probe.Load()
	if p == nil || p.key == m.seen {
		return
	}
	r := snap.Rule(p.vip)
	if r == nil {
		return
	}
	for _, b := range r.Backends {
		if b.Addr.As4() == p.addr && (b.State == flow.BackendActive) == p.up {
			m.seen = p.key
			s.rec.arrive(p.key, s.shape.Muxes)
			return
		}
	}
}

// setDIP makes DIP j's host publish it up or down; it returns when the
// host handed its verdicts to its HealthPublisher.
func (s *sim) setDIP(j int, up bool, round int) (time.Time, string) {
	h := s.hosts[j/s.shape.DIPsPerHost]
	vs := slices.Clone(h.up)
	v := &vs[j%s.shape.DIPsPerHost]
	v.Up = up
	if !up {
		v.Reason = "connection refused"
	}
	key := fmt.Sprintf("dip %d up=%v round %d", j, up, round)
	s.probe.Store(&dipProbe{key: key, vip: uint32(s.shape.dipVIP(j)), addr: dipAddr(j).As4(), up: up})
	t0 := time.Now()
	h.pub.Publish(vs)
	return t0, key
}

// watchStatus follows the nodes' status keys, as xdplbctl status shows
// them, and records when each version is live: every node reports it.
func (s *sim) watchStatus(ctx context.Context) {
	versions := map[string]uint64{}
	counted := map[uint64]int{}
	for resp := range s.admin.Watch(ctx, fleet.DefaultPrefix+"status/", clientv3.WithPrefix()) {
		for _, ev := range resp.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			var ns fleet.NodeStatus
			if json.Unmarshal(ev.Kv.Value, &ns) != nil {
				continue
			}
			k := string(ev.Kv.Key)
			for v := versions[k] + 1; v <= ns.Version; v++ {
				counted[v]++
				if counted[v] == s.nodes() {
					s.rec.arrive(liveKey(v), 1)
				}
			}
			versions[k] = max(versions[k], ns.Version)
		}
	}
}

// etcdLoad is a snapshot of the etcd member's counters (its Prometheus
// metrics, which the embedded member registers in this process).
type etcdLoad struct {
	at                                  time.Time
	puts, deletes, txns, ranges, events float64
	proposals, renewals, sent           float64
}

// settle waits, at most limit, until etcd has written no key for a
// second (the start's last status and health writes done, their watch
// events sent), so that what is measured next is a fleet at rest, not
// the tail of its start; it returns how long it waited.
func (s *sim) settle(tb testing.TB, limit time.Duration) time.Duration {
	t0 := time.Now()
	last := readLoad(tb)
	for quiet := time.Duration(0); quiet < time.Second && time.Since(t0) < limit; {
		time.Sleep(250 * time.Millisecond)
		l := readLoad(tb)
		if l.puts+l.deletes == last.puts+last.deletes {
			quiet += 250 * time.Millisecond
		} else {
			quiet = 0
		}
		last = l
	}
	return time.Since(t0)
}

func readLoad(tb testing.TB) etcdLoad {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	l := etcdLoad{at: time.Now()}
	for _, mf := range mfs {
		var sum float64
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() // proposals_committed_total is a gauge
		}
		switch mf.GetName() {
		case "etcd_mvcc_put_total":
			l.puts = sum
		case "etcd_mvcc_delete_total":
			l.deletes = sum
		case "etcd_mvcc_txn_total":
			l.txns = sum
		case "etcd_mvcc_range_total":
			l.ranges = sum
		case "etcd_debugging_mvcc_events_total":
			l.events = sum
		case "etcd_server_proposals_committed_total":
			l.proposals = sum
		case "etcd_debugging_lease_renewed_total":
			l.renewals = sum
		case "etcd_network_client_grpc_sent_bytes_total":
			l.sent = sum
		}
	}
	return l
}

// rates are per second between two snapshots.
type rates struct {
	Seconds                              float64
	KeyWrites, Proposals, Events, Renews float64
	SentMB                               float64 // to clients, MB/s
}

func (b etcdLoad) rates(a etcdLoad) rates {
	d := b.at.Sub(a.at).Seconds()
	return rates{Seconds: d, KeyWrites: (b.puts + b.deletes - a.puts - a.deletes) / d,
		Proposals: (b.proposals - a.proposals) / d, Events: (b.events - a.events) / d, Renews: (b.renewals - a.renewals) / d,
		SentMB: (b.sent - a.sent) / d / 1e6}
}

func (r rates) String() string {
	return fmt.Sprintf("%.0f key writes/s, %.0f raft proposals/s, %.0f watch events/s, %.0f lease renewals/s, %.1f MB/s sent to clients (over %.1fs)",
		r.KeyWrites, r.Proposals, r.Events, r.Renews, r.SentMB, r.Seconds)
}
