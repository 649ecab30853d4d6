package fleet

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/flow"
)

// muxView records what an AllocationWatcher hands a Mux.
type muxView struct {
	mu    sync.Mutex
	calls [][]flow.PortAllocation
}

func (m *muxView) on(a []flow.PortAllocation) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, a)
}

func (m *muxView) last() []flow.PortAllocation {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.calls) == 0 {
		return nil
	}
	return m.calls[len(m.calls)-1]
}

// TestAllocationWatcher: a Mux's watcher sees every host's claims with
// their owners, and returns; a host dying (its claims expire, its guards
// stay) and restarting (its claims made again under a new lease) is no
// change; with etcd gone it keeps the last allocations, and follows
// again when etcd is back.
func TestAllocationWatcher(t *testing.T) {
	e := startEtcd(t)
	mv := &muxView{}
	w, err := NewAllocationWatcher(AllocationWatcherConfig{Client: e.client, OnAllocations: mv.on})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	<-w.Ready()

	clk := &fakeClock{t: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	h1 := runHost(t, e, "host-1", PortAllocatorConfig{Idle: time.Minute, Now: clk.now}, outDIP(1, 1, 16))
	eventually(t, "host-1's first range", func() bool { return len(h1.nat.held()) == 1 })
	busy := h1.nat.held()[0].First
	h1.nat.set(busy, 60, 60) // a second range
	h2 := runHost(t, e, "host-2", PortAllocatorConfig{}, outDIP(2, 2, 16))
	want := func() []flow.PortAllocation {
		all := append(h1.nat.held(), h2.nat.held()...)
		slices.SortFunc(all, func(x, y flow.PortAllocation) int { return int(x.First) - int(y.First) })
		return all
	}
	eventually(t, "both hosts' claims", func() bool { return len(mv.last()) == 3 && slices.Equal(mv.last(), want()) })
	for _, a := range mv.last() {
		assert.NotZero(t, a.Owner.MAC, "the DIP's MAC travels with the claim")
	}

	// host-1's second range is returned.
	h1.nat.set(busy, 1, 1)
	clk.add(time.Minute)
	eventually(t, "the return seen", func() bool { return len(mv.last()) == 2 && slices.Equal(mv.last(), want()) })

	// host-2 dies: its claim expires (its lease revoked: the same for
	// etcd); the range stays host-2's for the Mux, by its guard.
	before := h2.nat.held()
	require.Len(t, before, 1)
	h2.stop()
	lease := claimsIn(t, e, newKeys("").portClaims())[before[0].First].lease
	_, err = e.client.Revoke(context.Background(), clientv3.LeaseID(lease))
	require.NoError(t, err)
	eventually(t, "the claim's deletion seen", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		_, claimed := w.claims[rangeID{outVIP, before[0].First}]
		return !claimed
	})
	assert.Contains(t, w.Allocations(), before[0], "guarded: still host-2's")
	// host-2 restarts: it takes its range back under a new lease.
	h2b := runHost(t, e, "host-2", PortAllocatorConfig{}, outDIP(2, 2, 16))
	eventually(t, "host-2 back", func() bool { return h2b.a.Counters().Reclaims == 1 })
	assert.Equal(t, before, h2b.nat.held())
	eventually(t, "the new claim seen", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		_, claimed := w.claims[rangeID{outVIP, before[0].First}]
		return claimed
	})
	assert.Contains(t, mv.last(), before[0])

	// etcd goes away: the Mux keeps what it has.
	n := len(mv.calls)
	kept := mv.last()
	e.stop()
	time.Sleep(1500 * time.Millisecond) // the watch breaks and retries meanwhile (not a timing assertion)
	assert.Equal(t, kept, w.Allocations())
	assert.Equal(t, kept, mv.last())
	e.start()
	h3 := runHost(t, e, "host-3", PortAllocatorConfig{}, outDIP(3, 3, 16))
	eventually(t, "followed again", func() bool {
		return len(mv.last()) == 3 && len(h3.nat.held()) == 1 && slices.Contains(mv.last(), h3.nat.held()[0])
	})
	mv.mu.Lock()
	defer mv.mu.Unlock()
	for i := 1; i < len(mv.calls); i++ {
		assert.NotEqual(t, mv.calls[i-1], mv.calls[i], "call %d repeats the last (of %d; %d before etcd stopped)", i, len(mv.calls), n)
	}
}

// flakyEtcd is a client whose etcd can be made to fail on script: while
// down, a running watch ends with an error, the next watch reports a
// compaction (the watcher must read everything again) and every Get fails.
type flakyEtcd struct {
	clientv3.KV
	clientv3.Watcher
	mu      sync.Mutex
	cut     chan struct{} // closed while down (nil: up, not made yet)
	watches int           // watches started while down
}

// state returns the channel closed when etcd goes down, and whether it
// is down now.
func (f *flakyEtcd) state() (<-chan struct{}, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut == nil {
		f.cut = make(chan struct{})
	}
	select {
	case <-f.cut:
		return f.cut, true
	default:
		return f.cut, false
	}
}

func (f *flakyEtcd) setDown(down bool) {
	_, isDown := f.state()
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case down && !isDown:
		close(f.cut)
	case !down && isDown:
		f.cut = make(chan struct{})
	}
}

func (f *flakyEtcd) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if _, down := f.state(); down {
		return nil, fmt.Errorf("etcd is down (test)")
	}
	return f.KV.Get(ctx, key, opts...)
}

func (f *flakyEtcd) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	out := make(chan clientv3.WatchResponse, 1)
	cut, down := f.state()
	if down {
		f.mu.Lock()
		f.watches++
		f.mu.Unlock()
		out <- clientv3.WatchResponse{CompactRevision: 1}
		close(out)
		return out
	}
	in := f.Watcher.Watch(ctx, key, opts...)
	go func() {
		defer close(out)
		for {
			select {
			case r, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- r:
				case <-ctx.Done():
					return
				}
			case <-cut:
				out <- clientv3.WatchResponse{Canceled: true} // an error (etcd: no leader)
				return
			}
		}
	}()
	return out
}

// TestAllocationWatcherKeepsThroughErrors: a watch that ends with an
// error, a compaction whose re-read fails, and reads failing for a while
// leave the Mux with the last allocations; when etcd answers again the
// watcher reads and follows.
func TestAllocationWatcherKeepsThroughErrors(t *testing.T) {
	e := startEtcd(t)
	f := &flakyEtcd{KV: e.client.KV, Watcher: e.client.Watcher}
	mv := &muxView{}
	w, err := NewAllocationWatcher(AllocationWatcherConfig{Client: &clientv3.Client{KV: f, Watcher: f}, OnAllocations: mv.on})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	<-w.Ready()

	h1 := runHost(t, e, "host-1", PortAllocatorConfig{MinRanges: 2}, outDIP(1, 1, 16))
	eventually(t, "host-1's claims", func() bool { return len(mv.last()) == 2 && slices.Equal(mv.last(), h1.nat.held()) })
	kept := mv.last()
	f.setDown(true)
	eventually(t, "the watch broken and a re-read tried", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.watches > 0 })
	time.Sleep(1500 * time.Millisecond) // reads fail meanwhile (not a timing assertion)
	assert.Equal(t, kept, w.Allocations())
	assert.Equal(t, kept, mv.last())
	f.setDown(false)
	h2 := runHost(t, e, "host-2", PortAllocatorConfig{}, outDIP(2, 2, 16))
	eventually(t, "followed again", func() bool {
		return len(mv.last()) == 3 && len(h2.nat.held()) == 1 && slices.Contains(mv.last(), h2.nat.held()[0])
	})
}
