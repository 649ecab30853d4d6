package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
)

// docV is a valid document of version v; extra lines go at its end.
func docV(v uint64, extra string) []byte {
	return fmt.Appendf(nil, `version: %d
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    backends:
      - name: vm-a
        address: 198.19.1.1
        mac: "02:00:00:00:01:01"
        host: 198.19.0.1
%s`, v, extra)
}

// etcd is a one-member cluster for a test, and a client of it.
type etcd struct {
	t       *testing.T
	cluster etcdlab.Cluster
	server  *embed.Etcd
	client  *clientv3.Client
}

func startEtcd(t *testing.T) *etcd {
	e := &etcd{t: t, cluster: etcdlab.NewCluster(t.TempDir(), 1)}
	e.start()
	var err error
	e.client, err = etcdlab.Client(e.cluster.Endpoints())
	require.NoError(t, err)
	t.Cleanup(func() {
		e.client.Close()
		e.stop()
	})
	return e
}

func (e *etcd) start() {
	s, err := e.cluster.Start(0, 30*time.Second)
	require.NoError(e.t, err)
	e.server = s
}

func (e *etcd) stop() {
	if e.server != nil {
		e.server.Close()
		e.server = nil
	}
}

func (e *etcd) apply(text []byte) (int64, error) {
	doc, err := control.Parse(text)
	require.NoError(e.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return Apply(ctx, e.client, "", text, doc, "test")
}

// node runs a Source the way a node does and records what it applies.
type node struct {
	src     *Source
	mu      sync.Mutex
	applied []uint64
	refuse  func(*control.Document) error
	done    chan error
	cancel  context.CancelFunc
}

func runNode(t *testing.T, c *clientv3.Client) *node {
	src, err := NewSource(SourceConfig{Client: c, Retry: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	return startNode(t, src)
}

// startNode runs src the way a node does; its cleanup stops it.
func startNode(t *testing.T, src *Source) *node {
	n := &node{src: src, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() {
		n.done <- src.Run(ctx, func(d *control.Document) error {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.refuse != nil {
				if err := n.refuse(d); err != nil {
					return err
				}
			}
			n.applied = append(n.applied, d.Version)
			return nil
		})
	}()
	var stopped sync.Once
	t.Cleanup(func() {
		cancel()
		stopped.Do(func() { assert.NoError(t, <-n.done) })
	})
	return n
}

func (n *node) versions() []uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]uint64(nil), n.applied...)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 30*time.Second, 20*time.Millisecond, what)
}

// TestSourceFollowsTheStore: a node waits for a document, applies every
// newer version in order, refuses what the version rules refuse (keeping
// what runs and saying why), and survives etcd going away: it keeps its
// version, then catches up with what was written while it was cut off.
func TestSourceFollowsTheStore(t *testing.T) {
	e := startEtcd(t)
	n := runNode(t, e.client)
	select {
	case <-n.src.Ready():
		t.Fatal("ready without a document")
	case <-time.After(300 * time.Millisecond):
	}
	rev1, err := e.apply(docV(1, ""))
	require.NoError(t, err)
	<-n.src.Ready()
	st := n.src.Status()
	assert.Equal(t, uint64(1), st.Version)
	assert.Equal(t, rev1, st.Revision)
	assert.False(t, st.Committed.IsZero(), "the commit record is read with the document")
	assert.Positive(t, st.SyncDelay())

	_, err = e.apply(docV(2, "hash_seed: 7\n"))
	require.NoError(t, err)
	eventually(t, "version 2 applied", func() bool { return n.src.Status().Version == 2 })

	// Apply refuses a version that is not above the stored one.
	_, err = e.apply(docV(2, "hash_seed: 8\n"))
	assert.ErrorIs(t, err, control.ErrStaleVersion)

	// Written around Apply: a document that does not parse, then one
	// of a lower version. The node keeps version 2 and says why.
	ctx := context.Background()
	_, err = e.client.Put(ctx, DefaultPrefix+"document", "version: 3\nvips: [\n")
	require.NoError(t, err)
	eventually(t, "invalid refused", func() bool { return n.src.Status().Reason == control.ReasonInvalid })
	_, err = e.client.Put(ctx, DefaultPrefix+"document", string(docV(1, "")))
	require.NoError(t, err)
	eventually(t, "stale refused", func() bool { return n.src.Status().Reason == control.ReasonStale })
	assert.Equal(t, uint64(2), n.src.Status().Version)

	// A refused apply is retried until it applies.
	n.mu.Lock()
	refusals := 0
	n.refuse = func(d *control.Document) error {
		if refusals < 2 {
			refusals++
			return fmt.Errorf("no room for version %d", d.Version)
		}
		return nil
	}
	n.mu.Unlock()
	_, err = e.apply(docV(3, ""))
	require.NoError(t, err)
	eventually(t, "version 3 applied after two refusals", func() bool { return n.src.Status().Version == 3 })

	// etcd goes away: the node keeps version 3. etcd comes back with
	// its data, version 4 is written: the node catches up.
	e.stop()
	time.Sleep(500 * time.Millisecond)
	assert.Equal(t, uint64(3), n.src.Status().Version)
	assert.NotNil(t, n.src.Document())
	e.start()
	_, err = e.apply(docV(4, "hash_seed: 9\n"))
	require.NoError(t, err)
	eventually(t, "version 4 after etcd came back", func() bool { return n.src.Status().Version == 4 })
	assert.Equal(t, []uint64{1, 2, 3, 4}, n.versions())
}

// TestApplyCompareAndSwap: of two writers that read the same revision,
// the second fails instead of overwriting the first's change.
func TestApplyCompareAndSwap(t *testing.T) {
	e := startEtcd(t)
	_, err := e.apply(docV(1, ""))
	require.NoError(t, err)
	ctx := context.Background()
	d2, err := control.Parse(docV(2, ""))
	require.NoError(t, err)
	d3, err := control.Parse(docV(3, ""))
	require.NoError(t, err)
	a2 := newApplier(e.client, "", docV(2, ""), d2, "a", applyLimits{})
	a3 := newApplier(e.client, "", docV(3, ""), d3, "b", applyLimits{})
	base, err := a2.read(ctx)
	require.NoError(t, err)
	_, err = a2.write(ctx, base)
	require.NoError(t, err)
	_, err = a3.write(ctx, base)
	assert.ErrorIs(t, err, ErrConcurrentWrite)
	got, err := Get(ctx, e.client, "")
	require.NoError(t, err)
	assert.Equal(t, uint64(2), got.Doc.Version)
	assert.Equal(t, "a", got.Commit.By)
}

// TestReporter: a node's status appears under its lease, follows what
// the node runs, and is gone when the node stops.
func TestReporter(t *testing.T) {
	e := startEtcd(t)
	var mu sync.Mutex
	version := uint64(1)
	r, err := NewReporter(ReporterConfig{Client: e.client, Role: RoleMux, Name: "mux-1", Interval: 50 * time.Millisecond,
		Status: func() NodeStatus {
			mu.Lock()
			defer mu.Unlock()
			return NodeStatus{Role: RoleMux, Name: "mux-1", Version: version, DataPath: "running"}
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	read := func() FleetStatus {
		f, err := ReadStatus(context.Background(), e.client, "")
		require.NoError(t, err)
		return f
	}
	eventually(t, "status written", func() bool { return len(read().Nodes) == 1 })
	mu.Lock()
	version = 2
	mu.Unlock()
	r.Poke()
	eventually(t, "status follows", func() bool { f := read(); return len(f.Nodes) == 1 && f.Nodes[0].Version == 2 })
	assert.Equal(t, map[string][2]int{RoleMux: {1, 1}}, read().Live(2))
	assert.Equal(t, map[string][2]int{RoleMux: {0, 1}}, read().Live(3))
	cancel()
	require.NoError(t, <-done)
	assert.Empty(t, read().Nodes, "a stopped node's status is gone")
}

// TestReporterWritesOnChange: with the default interval a status that
// does not change is not rewritten for a minute (a heartbeat of 5 s was
// most of etcd's steady load at a thousand nodes), while a Poke writes a
// change at once.
func TestReporterWritesOnChange(t *testing.T) {
	e := startEtcd(t)
	var mu sync.Mutex
	version := uint64(1)
	r, err := NewReporter(ReporterConfig{Client: e.client, Role: RoleHostAgent, Name: "host-1",
		Status: func() NodeStatus {
			mu.Lock()
			defer mu.Unlock()
			return NodeStatus{Version: version, DataPath: "running"}
		}})
	require.NoError(t, err)
	require.Equal(t, time.Minute, r.cfg.Interval)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	writes := func() int64 { // how many times the key was written
		resp, err := e.client.Get(context.Background(), newKeys("").status(RoleHostAgent, "host-1"))
		require.NoError(t, err)
		if len(resp.Kvs) == 0 {
			return 0
		}
		return resp.Kvs[0].Version
	}
	eventually(t, "status written", func() bool { return writes() == 1 })
	mu.Lock()
	version = 2
	mu.Unlock()
	r.Poke()
	eventually(t, "the change written", func() bool { return writes() == 2 })
}
