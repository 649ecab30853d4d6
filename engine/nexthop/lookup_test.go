package nexthop

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// publish stands in for Run: it swaps in a snapshot holding the entries of
// m, destinations under their full-length prefixes (destKey) and prefix
// entries under their prefixes.
func publish(r *Resolver, m map[netip.Prefix]*entry) {
	b := newDestBuilder()
	var counts [3]int
	var ps []prefixEntry
	for p, e := range m {
		counts[e.state]++
		if isDest(p) {
			b.put(p.Addr().As16(), e)
		} else {
			ps = append(ps, prefixEntry{p, e})
		}
	}
	v4, v6, prefixes := prefixTables(ps)
	r.publish(b.publish(), v4, v6, prefixes, counts)
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

var (
	// Prefix entries: a gateway route's prefix, a longer one inside it, a
	// pending one and an IPv6 one.
	pfxWide    = netip.MustParsePrefix("198.19.0.0/16")
	pfxNarrow  = netip.MustParsePrefix("198.19.7.0/24")
	pfxPending = netip.MustParsePrefix("198.18.128.0/17")
	pfx6       = netip.MustParsePrefix("2001:db8:100::/48")
	hopWide    = Hop{IfIndex: 7, SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, DstMAC: [6]byte{2, 0, 0, 0, 0, 0xa},
		Gateway: netip.MustParseAddr("198.18.0.10")}
	hopNarrow = Hop{IfIndex: 8, SrcMAC: [6]byte{2, 0, 0, 0, 0, 3}, DstMAC: [6]byte{2, 0, 0, 0, 0, 0xb},
		Gateway: netip.MustParseAddr("198.18.0.11")}
	hop6 = Hop{IfIndex: 7, SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, DstMAC: [6]byte{2, 0, 0, 0, 0, 0xc},
		Gateway: netip.MustParseAddr("2001:db8::10")}
)

func fixture() map[netip.Prefix]*entry {
	return map[netip.Prefix]*entry{
		destKey(dstResolved): {hop: hopResolved, state: stateResolved},
		destKey(dstPending):  {state: statePending},
		destKey(dstFailed):   {state: stateFailed, err: ErrNoRoute},
		pfxWide:              {hop: hopWide, state: stateResolved, rep: netip.MustParseAddr("198.19.0.1")},
		pfxNarrow:            {hop: hopNarrow, state: stateResolved, rep: netip.MustParseAddr("198.19.7.1")},
		pfxPending:           {state: statePending, rep: netip.MustParseAddr("198.18.128.1")},
		pfx6:                 {hop: hop6, state: stateResolved, rep: netip.MustParseAddr("2001:db8:100::1")},
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
		{"prefix", netip.MustParseAddr("198.19.200.1"), hopWide, true, false},
		{"prefix, first address", netip.MustParseAddr("198.19.0.0"), hopWide, true, false},
		{"prefix, last address", netip.MustParseAddr("198.19.255.255"), hopWide, true, false},
		{"prefix, v4-mapped form", netip.AddrFrom16(netip.MustParseAddr("198.19.1.1").As16()), hopWide, true, false},
		{"longer prefix inside", netip.MustParseAddr("198.19.7.200"), hopNarrow, true, false},
		{"just outside the longer prefix", netip.MustParseAddr("198.19.8.0"), hopWide, true, false},
		{"just outside the prefix", netip.MustParseAddr("198.20.0.0"), Hop{}, false, true},
		{"pending prefix", netip.MustParseAddr("198.18.200.9"), Hop{}, false, false},
		{"prefix6", netip.MustParseAddr("2001:db8:100:ffff::9"), hop6, true, false},
		{"just outside prefix6", netip.MustParseAddr("2001:db8:101::"), Hop{}, false, true},
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
	for _, a := range []netip.Addr{dstResolved, dstPending, netip.MustParseAddr("198.19.7.1"),
		netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.18.128.1")} {
		k := a.As16()
		assert.True(t, s.find(&k).used.Load(), a)
	}
	k := netip.MustParseAddr("2001:db8::99").As16()
	assert.Nil(t, s.find(&k))
	assert.Equal(t, 7, s.Len())
	assert.Equal(t, []netip.Prefix{pfxPending, pfxWide, pfxNarrow, pfx6}, s.Prefixes())
	st := r.Stats()
	assert.Equal(t, Stats{Entries: 7, Resolved: 4, Pending: 2, Failed: 1, Prefixes: 4}, st)
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
		"failed6":     netip.MustParseAddr("2001:db8::3"),
		"prefix":      netip.MustParseAddr("198.19.99.1"),
		"prefix6":     netip.MustParseAddr("2001:db8:100::99"),
		"miss6":       netip.MustParseAddr("2001:db8:200::1"),
		"nested":      netip.MustParseAddr("198.19.7.99"),
		"prefixMiss6": netip.MustParseAddr("2001:db8:101::1"),
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
		m[destKey(netip.AddrFrom16(k))] = &entry{hop: hopResolved, state: stateResolved}
		publish(r, m)
	}()
	hop, err := r.Resolve(ctx, dstUnknown)
	require.NoError(t, err)
	assert.Equal(t, hopResolved, hop)

	_, err = r.Resolve(ctx, dstFailed)
	assert.ErrorIs(t, err, ErrNoRoute)

	hop, err = r.Resolve(ctx, netip.MustParseAddr("198.19.42.42"))
	require.NoError(t, err, "answered by a prefix entry")
	assert.Equal(t, hopWide, hop)

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
		m[destKey(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}))] = &entry{hop: hopResolved, state: stateResolved}
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
			plain[k.Addr().As16()] = e.hop
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
