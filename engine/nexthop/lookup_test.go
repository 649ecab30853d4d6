package nexthop

import (
	"context"
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// publish stands in for Run: it swaps in a snapshot holding m.
func publish(r *Resolver, m map[[16]byte]*entry) {
	s := &Snapshot{m: maps.Clone(m), req: r.req, changed: make(chan struct{}), version: r.tab.Load().version + 1}
	for _, e := range s.m {
		s.counts[e.state]++
	}
	close(r.tab.Swap(s).changed)
}

func testResolver(t testing.TB, cfg Config) *Resolver {
	r, err := newResolver(cfg)
	require.NoError(t, err)
	return r
}

var (
	dstResolved = netip.MustParseAddr("198.18.1.1")
	dstPending  = netip.MustParseAddr("198.18.1.2")
	dstFailed   = netip.MustParseAddr("2001:db8::3")
	dstUnknown  = netip.MustParseAddr("198.18.1.4")
	hopResolved = Hop{
		IfIndex: 7,
		SrcMAC:  [6]byte{2, 0, 0, 0, 0, 1},
		DstMAC:  [6]byte{2, 0, 0, 0, 0, 2},
		Gateway: netip.MustParseAddr("198.18.0.1"),
		Src:     netip.MustParseAddr("198.18.0.2"),
	}
)

func fixture() map[[16]byte]*entry {
	return map[[16]byte]*entry{
		dstResolved.As16(): {hop: hopResolved, state: stateResolved},
		dstPending.As16():  {state: statePending},
		dstFailed.As16():   {state: stateFailed, err: ErrNoRoute},
	}
}

func TestSnapshotLookup(t *testing.T) {
	r := testResolver(t, Config{QueueLen: 4})
	publish(r, fixture())

	tests := []struct {
		name   string
		dst    netip.Addr
		want   Hop
		ok     bool
		queued bool
	}{
		{"resolved", dstResolved, hopResolved, true, false},
		{"resolved, v4-mapped form", netip.AddrFrom16(dstResolved.As16()), hopResolved, true, false},
		{"pending", dstPending, Hop{}, false, false},
		{"failed", dstFailed, Hop{}, false, false},
		{"unknown", dstUnknown, Hop{}, false, true},
		{"invalid", netip.Addr{}, Hop{}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hop, ok := r.Lookup(tt.dst)
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.want, hop)
			if tt.queued {
				require.Len(t, r.req, 1)
				assert.Equal(t, tt.dst.As16(), <-r.req)
			}
			assert.Empty(t, r.req)
		})
	}
	// Lookups mark entries used, for the idle sweep.
	s := r.Snapshot()
	assert.True(t, s.m[dstResolved.As16()].used.Load())
	assert.True(t, s.m[dstPending.As16()].used.Load())
	assert.Equal(t, 3, s.Len())
	st := r.Stats()
	assert.Equal(t, Stats{Entries: 3, Resolved: 1, Pending: 1, Failed: 1}, st)
}

func TestLookupNeverBlocks(t *testing.T) {
	r := testResolver(t, Config{QueueLen: 2})
	for i := range 100 { // nobody drains the queue
		_, ok := r.Lookup(netip.AddrFrom4([4]byte{198, 18, 9, byte(i)}))
		require.False(t, ok)
	}
	assert.Len(t, r.req, 2)
}

func TestLookupZeroAllocs(t *testing.T) {
	r := testResolver(t, Config{QueueLen: 1})
	publish(r, fixture())
	s := r.Snapshot()
	cases := map[string]netip.Addr{
		"hit": dstResolved, "pending": dstPending, "miss": dstUnknown,
		"hit6": netip.MustParseAddr("2001:db8::3"),
	}
	for name, dst := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Zero(t, testing.AllocsPerRun(1000, func() { r.Lookup(dst) }))
			assert.Zero(t, testing.AllocsPerRun(1000, func() { s.Lookup(dst) }))
		})
	}
}

func TestResolveWaitsForRun(t *testing.T) {
	r := testResolver(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A fake Run: answer the first request by publishing a resolved entry.
	go func() {
		k := <-r.req
		m := fixture()
		m[k] = &entry{hop: hopResolved, state: stateResolved}
		publish(r, m)
	}()
	hop, err := r.Resolve(ctx, dstUnknown)
	require.NoError(t, err)
	assert.Equal(t, hopResolved, hop)

	_, err = r.Resolve(ctx, dstFailed)
	assert.ErrorIs(t, err, ErrNoRoute)

	short, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	_, err = r.Resolve(short, dstPending)
	assert.ErrorIs(t, err, ErrUnresolved)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	_, err = r.Resolve(ctx, netip.Addr{})
	assert.ErrorIs(t, err, ErrInvalidAddr)

	require.NoError(t, r.Close())
	_, err = r.Resolve(ctx, dstPending)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, r.startRun(), ErrClosed, "Run after Close")
	assert.NoError(t, r.Close(), "Close is idempotent")
}

func TestConfig(t *testing.T) {
	assert.NoError(t, Config{}.Validate())
	assert.Error(t, Config{RetryInterval: -1}.Validate())
	assert.Error(t, Config{QueueLen: -1}.Validate())
	c := Config{}.withDefaults()
	assert.Equal(t, 30*time.Second, c.RefreshInterval)
	assert.Equal(t, time.Second, c.RetryInterval)
	assert.Equal(t, 1024, c.QueueLen)
	assert.NotNil(t, c.Logger)
}

func BenchmarkLookup(b *testing.B) {
	r := testResolver(b, Config{})
	m := fixture()
	// A realistic table: a few thousand destinations (hosts behind a Mux).
	for i := range 4096 {
		m[netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}).As16()] = &entry{hop: hopResolved, state: stateResolved}
	}
	publish(r, m)
	dst := netip.AddrFrom4([4]byte{198, 18, 3, 7})
	b.Run("hit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r.Lookup(dst)
		}
	})
	b.Run("hit-snapshot", func(b *testing.B) {
		b.ReportAllocs()
		s := r.Snapshot()
		for b.Loop() {
			s.Lookup(dst)
		}
	})
	// The floor: a plain Go map of hops, no snapshot, no used bit.
	b.Run("baseline-map", func(b *testing.B) {
		b.ReportAllocs()
		plain := make(map[[16]byte]Hop, len(m))
		for k, e := range m {
			plain[k] = e.hop
		}
		var sink Hop
		for b.Loop() {
			sink = plain[dst.As16()]
		}
		_ = sink
	})
	b.Run("hit-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r.Lookup(dst)
			}
		})
	})
}
