package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/control"
)

// flakyKV is etcd's KV with transactions failing as a script says: the
// n-th Commit (from 0) fails with the error fail returns (nil: it goes
// through), after doing its work when landed is set (a write that took
// effect though its answer was lost).
type flakyKV struct {
	clientv3.KV
	script func(n int) (fail error, landed bool)

	mu sync.Mutex
	n  int
}

func (f *flakyKV) Txn(ctx context.Context) clientv3.Txn {
	return txnHook{KV: f.KV, commit: f.commit}.Txn(ctx)
}

func (f *flakyKV) commit(txn clientv3.Txn, _ []clientv3.Op) (*clientv3.TxnResponse, error) {
	f.mu.Lock()
	n := f.n
	f.n++
	f.mu.Unlock()
	fail, landed := f.script(n)
	if fail == nil {
		return txn.Commit()
	}
	if landed {
		if _, err := txn.Commit(); err != nil {
			return nil, err
		}
	}
	return nil, fail
}

// TestApplyThroughLeaderChange: Apply and Get ride out etcd being unable
// to answer for a while (a leader election after a member died: the etcd
// client does not retry transactions), and an Apply whose write took
// effect though etcd's answer was lost reports success, not a stale
// version; other errors are returned at once.
func TestApplyThroughLeaderChange(t *testing.T) {
	leaderChanged := rpctypes.ErrGRPCLeaderChanged // what a member answers
	cases := []struct {
		name    string
		script  func(n int) (error, bool)
		wantErr error // nil: version 2 applied
		commits int   // Commit calls Apply made
	}{
		{"read fails twice", func(n int) (error, bool) {
			if n < 2 {
				return leaderChanged, false
			}
			return nil, false
		}, nil, 4},
		{"write fails", func(n int) (error, bool) {
			if n == 1 {
				return rpctypes.ErrLeaderChanged, false
			}
			return nil, false
		}, nil, 4}, // read, write, read again, write
		{"write lands, answer lost", func(n int) (error, bool) {
			if n == 1 {
				return leaderChanged, true
			}
			return nil, false
		}, nil, 3}, // read, write, read again: our document
		{"no leader until the deadline", func(n int) (error, bool) { return rpctypes.ErrGRPCNoLeader, false },
			rpctypes.ErrGRPCNoLeader, -1},
		{"refused", func(n int) (error, bool) { return rpctypes.ErrGRPCPermissionDenied, false },
			rpctypes.ErrGRPCPermissionDenied, 1},
	}
	e := startEtcd(t)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "/case" + string(rune('a'+i)) + "/"
			text1 := docV(1, "")
			doc1, err := control.Parse(text1)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = Apply(ctx, e.client, prefix, text1, doc1, "test")
			require.NoError(t, err)

			kv := &flakyKV{KV: e.client.KV, script: tc.script}
			c := &clientv3.Client{KV: kv}
			text2 := docV(2, "")
			doc2, err := control.Parse(text2)
			require.NoError(t, err)
			actx := ctx
			if tc.commits < 0 {
				var acancel context.CancelFunc
				actx, acancel = context.WithTimeout(ctx, time.Second)
				defer acancel()
			}
			rev, err := Apply(actx, c, prefix, text2, doc2, "test")
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
				got, err := Get(ctx, e.client, prefix)
				require.NoError(t, err)
				require.Equal(t, uint64(2), got.Doc.Version)
				require.Equal(t, got.Revision, rev, "Apply returns the revision of the document it wrote")
			}
			if tc.commits > 0 {
				require.Equal(t, tc.commits, kv.n, "transactions Apply made")
			}
		})
	}
}
