package fleet

import (
	"context"
	"encoding/json"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// guardsOf reads the guards of vip: first port → record.
func guardsOf(t *testing.T, e *etcd, vip netip.Addr) map[uint16]recordKV {
	t.Helper()
	k := newKeys("")
	r, err := e.client.Get(context.Background(), k.portGuardsOf(vip), clientv3.WithPrefix())
	require.NoError(t, err)
	m := map[uint16]recordKV{}
	for _, kv := range r.Kvs {
		_, first, ok1 := parsePortKey(k.portGuards(), string(kv.Key))
		c, ok2 := decodeClaim(kv.Value)
		require.True(t, ok1 && ok2, "key %s", kv.Key)
		m[first] = recordKV{PortClaim: c, mod: kv.ModRevision, lease: kv.Lease}
	}
	return m
}

// kill stops h and ends its lease (as etcd does a TTL after a Host
// Agent died): its claims are deleted, its guards stay.
func (h *host) kill(t *testing.T, e *etcd) {
	t.Helper()
	h.stop()
	leases := map[int64]bool{}
	for _, a := range h.nat.held() {
		r, err := e.client.Get(context.Background(), newKeys("").portClaim(a.VIP, a.First))
		require.NoError(t, err)
		require.Len(t, r.Kvs, 1)
		leases[r.Kvs[0].Lease] = true
	}
	for l := range leases {
		_, err := e.client.Revoke(context.Background(), clientv3.LeaseID(l))
		require.NoError(t, err)
	}
}

var otherVIP = netip.MustParseAddr("198.18.100.2")

// TestAllocatorSweepsLeftoverGuards: a dead Host Agent's guards in a pool
// nobody claims from any more — its host removed from the document while
// the other hosts of the pool hold what they need, or the pool itself
// removed — are found by another Host Agent's sweep, cooled (counted,
// under a lease of its guard time) and deleted by etcd when it expires.
// Before, only a host that needed a range of that very pool started a
// guard's time: such guards stayed forever (the Muxes kept the ranges as
// the dead host's, and a pool added back found them guarded).
func TestAllocatorSweepsLeftoverGuards(t *testing.T) {
	for _, tc := range []struct {
		name string
		dead OutboundDIP // the dead host's DIP; the sweeper's is outDIP(2, 2, 4)
	}{
		{"host removed", outDIP(1, 1, 4)},
		{"pool removed", func() OutboundDIP { d := outDIP(1, 1, 4); d.VIP = otherVIP; return d }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEtcd(t)
			a := runHost(t, e, "host-a", PortAllocatorConfig{}, tc.dead)
			eventually(t, "host-a's range", func() bool { return len(a.nat.held()) == 1 })
			first := a.nat.held()[0].First
			// host-b holds what it needs and claims nothing more.
			b := runHost(t, e, "host-b", PortAllocatorConfig{TTL: 2 * time.Second, MaxConnTimeout: time.Second,
				Sweep: 50 * time.Millisecond}, outDIP(2, 2, 4))
			eventually(t, "host-b's range", func() bool { return len(b.nat.held()) == 1 })
			a.kill(t, e)
			require.Contains(t, guardsOf(t, e, tc.dead.VIP), first, "the dead host's guard is left")

			eventually(t, "the leftover guard cooling", func() bool { return guardsOf(t, e, tc.dead.VIP)[first].lease != 0 })
			g := guardsOf(t, e, tc.dead.VIP)[first]
			ttl, err := e.client.TimeToLive(context.Background(), clientv3.LeaseID(g.lease))
			require.NoError(t, err)
			assert.GreaterOrEqual(t, ttl.GrantedTTL, int64(3), "a guard time of TTL + MaxConnTimeout")
			assert.Equal(t, "host-a", g.Host, "the guard is left as it was, under a lease")
			eventually(t, "the leftover guard deleted when its guard time passed", func() bool {
				_, ok := guardsOf(t, e, tc.dead.VIP)[first]
				return !ok
			})
			c := b.a.Counters()
			assert.Equal(t, uint64(1), c.Swept)
			assert.Equal(t, uint64(1), c.Cooling, "a sweep's cooling is counted as any")
			assert.Len(t, b.nat.held(), 1, "host-b keeps its range")
		})
	}
}

// TestAllocatorSweepKeepsLiveGuards: a sweep never starts the guard time
// of a range a live claim holds: not of another host's held ranges,
// however many sweeps run, and not of a range its holder takes back (a
// restart) between the sweep's read and its write; nor of the sweeper's
// own guarded ranges, which it takes back.
func TestAllocatorSweepKeepsLiveGuards(t *testing.T) {
	k := newKeys("")
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// run starts host-a, the holder, and host-b, the sweeper,
		// and returns host-a's ranges and what host-b did.
		run func(t *testing.T, e *etcd) (held []uint16, b *PortAllocator)
	}{
		{"another host's live claims", func(t *testing.T, e *etcd) ([]uint16, *PortAllocator) {
			// host-b first: the first allocator is elected the sweeper.
			b := runHost(t, e, "host-b", PortAllocatorConfig{Sweep: 20 * time.Millisecond}, outDIP(2, 2, 8))
			eventually(t, "host-b the sweeper", b.a.Sweeper)
			a := runHost(t, e, "host-a", PortAllocatorConfig{MinRanges: 2}, outDIP(1, 1, 8))
			eventually(t, "host-a's ranges", func() bool { return len(a.nat.held()) == 2 })
			s := b.a.sweeps.Load()
			eventually(t, "ten sweeps", func() bool { return b.a.sweeps.Load() >= s+10 })
			return firsts(a.nat.held()), b.a
		}},
		{"the holder takes its range back during the sweep", func(t *testing.T, e *etcd) ([]uint16, *PortAllocator) {
			a := runHost(t, e, "host-a", PortAllocatorConfig{}, outDIP(1, 1, 8))
			eventually(t, "host-a's range", func() bool { return len(a.nat.held()) == 1 })
			first := a.nat.held()[0].First
			// host-b's writes are preceded, once armed, by host-a's
			// restart taking its range back: claim and guard as adopt
			// puts them.
			var armed, hooked atomic.Bool
			retake := func() {
				if !armed.Load() || !hooked.CompareAndSwap(false, true) {
					return
				}
				l, err := e.client.Grant(ctx, 60)
				require.NoError(t, err)
				g := guardsOf(t, e, outVIP)[first]
				g.Lease = int64(l.ID)
				v, _ := json.Marshal(g.PortClaim)
				_, err = e.client.Txn(ctx).Then(clientv3.OpPut(k.portClaim(outVIP, first), string(v), clientv3.WithLease(l.ID)),
					clientv3.OpPut(k.portGuard(outVIP, first), string(v))).Commit()
				require.NoError(t, err)
			}
			b := runHostVia(t, e, "host-b", PortAllocatorConfig{Sweep: 20 * time.Millisecond},
				func(c *clientv3.Client) *clientv3.Client {
					return &clientv3.Client{KV: &hookKV{KV: c.KV, hook: retake}, Lease: c.Lease, Watcher: c.Watcher}
				}, outDIP(2, 2, 8))
			eventually(t, "host-b's range", func() bool { return len(b.nat.held()) == 1 })
			a.kill(t, e)
			armed.Store(true)
			eventually(t, "host-a took its range back as host-b swept", hooked.Load)
			s := b.a.sweeps.Load()
			eventually(t, "ten sweeps more", func() bool { return b.a.sweeps.Load() >= s+10 })
			return []uint16{first}, b.a
		}},
		{"the sweeper's own guarded range", func(t *testing.T, e *etcd) ([]uint16, *PortAllocator) {
			a := runHost(t, e, "host-a", PortAllocatorConfig{}, outDIP(1, 1, 8))
			eventually(t, "host-a's range", func() bool { return len(a.nat.held()) == 1 })
			held := firsts(a.nat.held())
			a.kill(t, e)
			a2 := runHost(t, e, "host-a", PortAllocatorConfig{Sweep: 20 * time.Millisecond}, outDIP(1, 1, 8))
			eventually(t, "ten sweeps", func() bool { return a2.a.sweeps.Load() >= 10 })
			assert.Equal(t, held, firsts(a2.nat.held()), "taken back")
			return held, a2.a
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEtcd(t)
			held, b := tc.run(t, e)
			claims, guards := claimsIn(t, e, k.portClaims()), guardsOf(t, e, outVIP)
			for _, first := range held {
				require.Contains(t, claims, first, "the claim lives")
				require.Contains(t, guards, first, "its guard lives")
				assert.Zero(t, guards[first].lease, "and is not cooling")
				assert.Equal(t, "host-a", guards[first].Host)
			}
			assert.Zero(t, b.Counters().Swept)
			assert.Zero(t, b.Counters().Cooling)
		})
	}
}

// TestAllocatorSweepSkipsCoolingGuards: a guard whose claim is gone and
// whose guard time runs (a dead host's, cooled by a claimer) makes a
// sweep read its VIP once, not every sweep: keys-only answers carry no
// lease, so the sweep remembers the guards it read cooling by their
// ModRevision. A guard changed since (put again without a lease, as a
// left guard would be) is read again and cooled.
func TestAllocatorSweepSkipsCoolingGuards(t *testing.T) {
	e := startEtcd(t)
	k := newKeys("")
	ctx := context.Background()
	dead := outDIP(1, 1, 8)
	v, _ := json.Marshal(PortClaim{Last: 1087, Host: "host-a", HostAddr: dead.Owner.Host, DIP: dead.Owner.DIP, VNI: dead.Owner.VNI})
	l, err := e.client.Grant(ctx, 600)
	require.NoError(t, err)
	_, err = e.client.Put(ctx, k.portGuard(outVIP, 1024), string(v), clientv3.WithLease(l.ID))
	require.NoError(t, err)

	kv := &countingKV{KV: e.client.KV}
	a, err := NewPortAllocator(PortAllocatorConfig{Client: &clientv3.Client{KV: kv, Lease: e.client.Lease, Watcher: e.client.Watcher},
		Host: "host-b"})
	require.NoError(t, err)
	want := map[dipKey]OutboundDIP{keyOfDIP(outDIP(2, 2, 8)): outDIP(2, 2, 8)}
	sweep := func() int64 {
		t.Helper()
		n := kv.txns.Load()
		require.NoError(t, a.sweep(ctx, want))
		return kv.txns.Load() - n
	}
	assert.Equal(t, int64(2), sweep(), "the keys, then the VIP with the guard")
	for range 3 {
		assert.Equal(t, int64(1), sweep(), "the keys only: the guard still cools")
	}
	assert.Zero(t, a.Counters().Cooling)

	_, err = e.client.Put(ctx, k.portGuard(outVIP, 1024), string(v))
	require.NoError(t, err)
	assert.Equal(t, int64(3), sweep(), "the keys, the VIP, the guard cooled")
	assert.Equal(t, uint64(1), a.Counters().Swept)
	assert.NotZero(t, guardsOf(t, e, outVIP)[1024].lease)
	assert.Equal(t, int64(1), sweep(), "the keys only")
}
