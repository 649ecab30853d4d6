package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

// compactNow compacts etcd's history up to its current revision (what
// etcd's auto-compaction does in time) and returns that revision.
func (e *etcd) compactNow() int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.client.Get(ctx, "compact-now")
	require.NoError(e.t, err)
	_, err = e.client.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
	require.NoError(e.t, err)
	return resp.Header.Revision
}

// TestHostStartsAfterHalfApplyAndCompaction: an apply that stops after
// some of its views (the applier failed, or its context ended) leaves
// those views overwritten with an uncommitted version; once etcd compacts
// its history past the last commit, the committed views are no longer in
// it. A Host Agent that starts then still comes up on the last committed
// version (its view made from the committed document), one that was
// running keeps it without a read error loop, and both move to the new
// version when the apply is done again. Before, the starting host read its
// view at the commit's revision, which etcd had compacted: it logged
// "waiting for etcd" and never started until an apply completed.
func TestHostStartsAfterHalfApplyAndCompaction(t *testing.T) {
	const hosts = 5
	v1 := hostsDoc(1, hosts, "")
	v2 := hostsDoc(2, hosts, "hash_seed: 7\n") // every view changes
	for _, tc := range []struct {
		name string
		// stop ends the apply after its first transaction of views:
		// it returns afterViews' error and may cancel the apply's
		// context.
		stop func(cancel context.CancelFunc) error
	}{
		{"applier fails between transactions", func(context.CancelFunc) error { return errors.New("applier killed") }},
		{"context cancelled midway", func(cancel context.CancelFunc) error { cancel(); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := applyLimits{ops: 4} // two views (view and sum) a transaction
			e := startEtcd(t)
			_, err := e.applyDoc(v1, lim)
			require.NoError(t, err)
			running := runHostSource(t, e.client, "h0")
			<-running.src.Ready()

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			lim.afterViews = func(n int) error {
				if n == 0 {
					return tc.stop(cancel)
				}
				return nil
			}
			doc2, err := control.Parse(v2)
			require.NoError(t, err)
			_, err = apply(ctx, e.client, "", v2, doc2, "test", lim)
			require.Error(t, err, "the apply stopped half way")
			commitRev := e.modRev(DefaultPrefix + "views.commit")
			require.Greater(t, e.modRev(DefaultPrefix+"views/h0"), commitRev, "h0's view was written by the half apply")
			e.compactNow()

			// h0 (its view overwritten) and h4 (not reached) start.
			for _, host := range []string{"h0", fmt.Sprint("h", hosts-1)} {
				h := runHostSource(t, e.client, host)
				select {
				case <-h.src.Ready():
				case <-time.After(10 * time.Second):
					t.Fatalf("%s did not start: %v", host, h.src.Status().LastError)
				}
				assert.Equal(t, uint64(1), h.src.Status().Version, "%s runs the last committed version", host)
				got, err := h.src.Document().Marshal()
				require.NoError(t, err)
				assert.Equal(t, viewOf(t, v1, host), string(got), "%s runs its committed view", host)
				h.cancel()
			}
			started := runHostSource(t, e.client, "h0")
			<-started.src.Ready()
			// The running host's watch broke on the compaction: it
			// reads again and keeps version 1.
			running.src.Reload()
			time.Sleep(300 * time.Millisecond)
			assert.Equal(t, uint64(1), running.src.Status().Version)
			assert.NoError(t, running.src.Status().LastError)

			// The apply done again: both move to version 2.
			_, err = e.applyDoc(v2, applyLimits{ops: 4})
			require.NoError(t, err)
			for _, h := range []*hostNode{running, started} {
				eventually(t, "version 2", func() bool { return h.src.Status().Version == 2 })
				got, err := h.src.Document().Marshal()
				require.NoError(t, err)
				assert.Equal(t, viewOf(t, v2, "h0"), string(got))
			}
			assert.Equal(t, []uint64{1, 2}, started.versions())
			assert.Equal(t, []uint64{1, 2}, running.versions())
		})
	}
}

// TestHostWaitsWhenNothingCompleteRemains: after a half apply and a
// compaction, a document written around Apply (not the one committed
// with the views) leaves a starting Host Agent nothing complete to run:
// it does not start on anything, says so (ErrNoCommittedView, logged as
// an error, once), and starts on the next apply that completes.
func TestHostWaitsWhenNothingCompleteRemains(t *testing.T) {
	const hosts = 3
	lim := applyLimits{ops: 4}
	e := startEtcd(t)
	_, err := e.applyDoc(hostsDoc(1, hosts, ""), lim)
	require.NoError(t, err)
	lim.afterViews = func(int) error { return errors.New("applier killed") }
	_, err = e.applyDoc(hostsDoc(2, hosts, "hash_seed: 7\n"), lim)
	require.Error(t, err)
	_, err = e.client.Put(context.Background(), DefaultPrefix+"document", string(hostsDoc(2, hosts, "hash_seed: 7\n")))
	require.NoError(t, err)
	e.compactNow()

	var logs fleetlab.LockedBuffer
	src, err := NewSource(SourceConfig{Client: e.client, Retry: 50 * time.Millisecond, Host: "h0",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	n := startNode(t, src)
	eventually(t, "the host says it waits for a complete apply", func() bool {
		return strings.Contains(logs.String(), "waiting for a complete apply")
	})
	assert.Contains(t, logs.String(), ErrNoCommittedView.Error())
	assert.Contains(t, logs.String(), "level=ERROR")
	select {
	case <-src.Ready():
		t.Fatal("started with nothing complete to run")
	default:
	}
	time.Sleep(200 * time.Millisecond) // several retries
	assert.Equal(t, 1, strings.Count(logs.String(), "waiting for a complete apply"), "logged once")

	_, err = e.applyDoc(hostsDoc(3, hosts, "hash_seed: 7\n"), applyLimits{ops: 4})
	require.NoError(t, err)
	select {
	case <-src.Ready():
	case <-time.After(10 * time.Second):
		t.Fatalf("not started on the completed apply: %v", src.Status().LastError)
	}
	assert.Equal(t, []uint64{3}, n.versions())
}
