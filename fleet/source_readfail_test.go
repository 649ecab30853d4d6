package fleet

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// failingReads is etcd's KV whose transactions fail while failing is
// above zero, counting each one down: etcd cannot answer a read for a
// moment (a member restarting, a read timing out).
type failingReads struct {
	clientv3.KV
	mu      sync.Mutex
	failing int
}

func (f *failingReads) fail(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing = n
}

func (f *failingReads) left() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failing
}

func (f *failingReads) Txn(ctx context.Context) clientv3.Txn {
	return txnHook{KV: f.KV, commit: f.commit}.Txn(ctx)
}

func (f *failingReads) commit(txn clientv3.Txn, _ []clientv3.Op) (*clientv3.TxnResponse, error) {
	f.mu.Lock()
	fail := f.failing > 0
	if fail {
		f.failing--
	}
	f.mu.Unlock()
	if fail {
		return nil, errors.New("etcd: read failed (test)")
	}
	return txn.Commit()
}

// TestSourceReadFailsAfterEvent: a Source whose read after a watch event
// fails (etcd could not answer for a moment) reads again once etcd
// answers, and runs the version that event committed. Before, a Host
// Agent's Source logged the failure but went on watching past the event:
// it kept the old version until another commit came, however long that
// took.
func TestSourceReadFailsAfterEvent(t *testing.T) {
	for _, tc := range []struct {
		name string
		host string
	}{
		{"mux", ""},
		{"host agent", "h0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEtcd(t)
			_, err := e.applyDoc(hostsDoc(1, 2, ""), applyLimits{})
			require.NoError(t, err)
			kv := &failingReads{KV: e.client.KV}
			c := &clientv3.Client{KV: kv, Watcher: e.client.Watcher}
			var n *node
			if tc.host != "" {
				n = runHostSource(t, c, tc.host).node
			} else {
				n = runNode(t, c)
			}
			<-n.src.Ready()
			kv.fail(1)
			_, err = e.applyDoc(hostsDoc(2, 2, "", 5), applyLimits{})
			require.NoError(t, err)
			if tc.host != "" {
				eventually(t, "the read after the commit failed", func() bool { return kv.left() == 0 })
			}
			eventually(t, "version 2 runs", func() bool { return n.src.Status().Version == 2 })
			assert.Equal(t, []uint64{1, 2}, n.versions())
		})
	}
}
