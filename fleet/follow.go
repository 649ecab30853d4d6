package fleet

import (
	"context"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// follower follows every key under a prefix, for the watchers that
// mirror a part of etcd (HealthWatcher, AllocationWatcher): it reads the
// whole prefix, then watches it from the read's revision (requiring a
// leader, so a partitioned member does not leave it waiting), reads again
// after a compaction, and resumes an interrupted watch from the last
// revision it saw. While etcd is away nothing is called: the watcher's
// state stays as it was last read.
type follower struct {
	client *clientv3.Client
	logger *slog.Logger
	prefix string
	what   string // what the watcher keeps, for the logs ("the last verdicts")
	// read replaces the watcher's state with a complete read; events
	// applies one watch response's changes. Both are called from Run's
	// goroutine only.
	read   func(*clientv3.GetResponse)
	events func([]*clientv3.Event)
}

// run follows the prefix until ctx is done.
func (f *follower) run(ctx context.Context) {
	var rev int64
	for ctx.Err() == nil {
		if rev == 0 {
			r, err := f.readAll(ctx)
			if err != nil {
				f.logger.Warn("fleet: read of "+f.prefix+" failed; keeping "+f.what, "err", err)
				sleep(ctx, time.Second)
				continue
			}
			rev = r
		}
		rev = f.watch(ctx, rev)
	}
}

func (f *follower) readAll(ctx context.Context) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := f.client.Get(rctx, f.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	f.read(resp)
	return resp.Header.Revision, nil
}

// watch applies changes from revision rev+1 until the watch ends; it
// returns the revision to go on from (0: read everything again).
func (f *follower) watch(ctx context.Context, rev int64) int64 {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range f.client.Watch(wctx, f.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			if resp.CompactRevision > 0 {
				return 0
			}
			f.logger.Warn("fleet: watch of "+f.prefix+" interrupted; keeping "+f.what, "err", err)
			sleep(ctx, time.Second)
			return rev
		}
		f.events(resp.Events)
		rev = resp.Header.Revision
	}
	if ctx.Err() == nil {
		sleep(ctx, time.Second)
	}
	return rev
}
