package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// holdKV is etcd's KV whose first Put waits until its context ends, as a
// write to an etcd that is gone does, and reports how it ended.
type holdKV struct {
	clientv3.KV
	entered chan struct{} // closed when the first Put waits
	held    chan error    // how it ended

	mu   sync.Mutex
	puts int
	errs []error // how the Puts after the first ended
}

func (h *holdKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	h.mu.Lock()
	h.puts++
	first := h.puts == 1
	h.mu.Unlock()
	if first {
		close(h.entered)
		<-ctx.Done()
		h.held <- ctx.Err()
		return nil, ctx.Err()
	}
	resp, err := h.KV.Put(ctx, key, val, opts...)
	h.mu.Lock()
	h.errs = append(h.errs, err)
	h.mu.Unlock()
	return resp, err
}

// TestReporterLeaseLost: a status write waiting for etcd ends when the
// Reporter's lease is lost, not at the write's own timeout, and the
// Reporter writes nothing more under the lost lease: its next write is
// under a new one. Before, a node cut off from etcd went on writing under
// a lease it had lost, 5 s a write, while its ticker won the select
// against the lease's end (up to 25 s after the loss in the etcd fault
// test).
func TestReporterLeaseLost(t *testing.T) {
	e := startEtcd(t)
	kv := &holdKV{KV: e.client.KV, entered: make(chan struct{}), held: make(chan error, 1)}
	c := &clientv3.Client{KV: kv, Lease: e.client.Lease}
	r, err := NewReporter(ReporterConfig{Client: c, Role: RoleMux, Name: "mux-1", TTL: 2 * time.Second,
		Interval: 10 * time.Millisecond, Status: func() NodeStatus { return NodeStatus{Version: 1} }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	<-kv.entered
	leases, err := e.client.Leases(ctx)
	require.NoError(t, err)
	require.Len(t, leases.Leases, 1, "the Reporter's lease")
	_, err = e.client.Revoke(ctx, leases.Leases[0].ID)
	require.NoError(t, err)
	require.ErrorIs(t, <-kv.held, context.Canceled, "the write waiting for etcd ends when the lease is lost")

	eventually(t, "the status written again", func() bool {
		f, err := ReadStatus(ctx, e.client, "")
		return err == nil && len(f.Nodes) == 1
	})
	kv.mu.Lock()
	defer kv.mu.Unlock()
	require.NoError(t, kv.errs[0], "the write after the held one is under a new lease")
}
