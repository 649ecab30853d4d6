package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
)

var outVIP = netip.MustParseAddr("198.18.100.1")

// outDIP is DIP n (198.19.1.n) on host h (198.19.0.h), VNI 100, with a
// pool of units of 64 ports from 1024 to 1024+64*units-1.
func outDIP(h, n, units int) OutboundDIP {
	return OutboundDIP{VIP: outVIP,
		Owner: flow.PortOwner{DIP: netip.AddrFrom4([4]byte{198, 19, 1, byte(n)}), Host: netip.AddrFrom4([4]byte{198, 19, 0, byte(h)}),
			VNI: 100, MAC: [6]byte{2, 0, 0, 0, 1, byte(n)}},
		Pool: []control.PortRange{{First: 1024, Last: uint16(1024 + 64*units - 1)}}, Unit: 64}
}

// fakeNAT stands for a Host Agent: it takes the allocations (OnChange)
// and reports the use the test sets per range (Usage).
type fakeNAT struct {
	mu     sync.Mutex
	allocs []flow.PortAllocation
	own    []flow.PortAllocation // static ranges it also translates with
	use    map[uint16][2]int     // first port → conns, ports
	// grab is a range a connection takes just as the allocator withdraws
	// it (0: none).
	grab   uint16
	calls  int                            // Usage calls: each is one allocator step
	change int                            // OnChange calls
	known  map[uint16]flow.PortAllocation // every range it was ever given
}

func newFakeNAT() *fakeNAT {
	return &fakeNAT{use: map[uint16][2]int{}, known: map[uint16]flow.PortAllocation{}}
}

func (n *fakeNAT) onChange(a []flow.PortAllocation) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.grab != 0 && slices.Contains(firsts(n.allocs), n.grab) && !slices.Contains(firsts(a), n.grab) {
		n.use[n.grab] = [2]int{1, 1}
	}
	for _, x := range a {
		n.known[x.First] = x
	}
	n.allocs, n.change = a, n.change+1
}

func (n *fakeNAT) usage(dst []flow.PortRangeUse) []flow.PortRangeUse {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls++
	for _, a := range append(slices.Clone(n.allocs), n.own...) {
		u := n.use[a.First]
		dst = append(dst, flow.PortRangeUse{PortAllocation: a, Conns: u[0], Ports: u[1]})
	}
	// A range withdrawn whose connections still live is reported too.
	for first, a := range n.known {
		if u := n.use[first]; u[0] > 0 && !slices.Contains(firsts(n.allocs), first) {
			dst = append(dst, flow.PortRangeUse{PortAllocation: a, Conns: u[0], Ports: u[1]})
		}
	}
	return dst
}

func (n *fakeNAT) set(first uint16, conns, ports int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.use[first] = [2]int{conns, ports}
}

func (n *fakeNAT) held() []flow.PortAllocation {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.allocs)
}

func (n *fakeNAT) steps() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls
}

// settle waits until the allocator has made k more steps (bounded, not
// asserted: what a test checks after it is the state, not a time).
func (n *fakeNAT) settle(t *testing.T, k int) {
	t.Helper()
	s := n.steps()
	eventually(t, "allocator steps", func() bool { return n.steps() >= s+k })
}

// fakeClock is the allocator's clock for idleness, moved by the test.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// host is one running PortAllocator with its own etcd client (a Host
// Agent's process).
type host struct {
	a      *PortAllocator
	nat    *fakeNAT
	client *clientv3.Client
	cancel context.CancelFunc
	done   chan struct{}
}

// stop stops the allocator (its lease is left to expire, as a Host
// Agent's that stops).
func (h *host) stop() {
	h.cancel()
	<-h.done
}

// runHost starts a PortAllocator for host name with dips; cfg's Client,
// Host, Usage and OnChange are filled in, and Interval if unset.
func runHost(t *testing.T, e *etcd, name string, cfg PortAllocatorConfig, dips ...OutboundDIP) *host {
	return runHostVia(t, e, name, cfg, nil, dips...)
}

// runHostVia is runHost whose allocator talks to etcd through via(c)
// instead of the client c itself (nil: c).
func runHostVia(t *testing.T, e *etcd, name string, cfg PortAllocatorConfig, via func(c *clientv3.Client) *clientv3.Client, dips ...OutboundDIP) *host {
	c, err := etcdlab.Client(e.cluster.Endpoints())
	require.NoError(t, err)
	h := &host{nat: newFakeNAT(), client: c, done: make(chan struct{})}
	cfg.Client, cfg.Host, cfg.Usage, cfg.OnChange = c, name, h.nat.usage, h.nat.onChange
	if via != nil {
		cfg.Client = via(c)
	}
	if cfg.Interval == 0 {
		cfg.Interval = 20 * time.Millisecond
	}
	if cfg.TTL == 0 {
		cfg.TTL = 5 * time.Second
	}
	h.a, err = NewPortAllocator(cfg)
	require.NoError(t, err)
	h.a.SetDIPs(dips)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.a.Run(ctx); close(h.done) }()
	t.Cleanup(func() { h.stop(); c.Close() })
	return h
}

// claimsIn reads every claim (or guard) key of outVIP under prefix
// (keys.portClaims or keys.portGuards): first port → record.
func claimsIn(t *testing.T, e *etcd, prefix string) map[uint16]recordKV {
	t.Helper()
	r, err := e.client.Get(context.Background(), prefix+outVIP.String()+"/", clientv3.WithPrefix())
	require.NoError(t, err)
	m := map[uint16]recordKV{}
	for _, kv := range r.Kvs {
		_, first, ok1 := parsePortKey(prefix, string(kv.Key))
		c, ok2 := decodeClaim(kv.Value)
		require.True(t, ok1 && ok2, "key %s", kv.Key)
		m[first] = recordKV{PortClaim: c, mod: kv.ModRevision, lease: kv.Lease}
	}
	return m
}

func firsts(as []flow.PortAllocation) []uint16 {
	var out []uint16
	for _, a := range as {
		out = append(out, a.First)
	}
	return out
}

// TestAllocatorNoOverlap: two hosts, four DIPs each wanting six ranges,
// claim at once from one pool of exactly 48 units: every unit is claimed
// once, the ranges each host reports are its own, unit-aligned, within
// the pool, and carry their owner; the claims in etcd are what the hosts
// report.
func TestAllocatorNoOverlap(t *testing.T) {
	e := startEtcd(t)
	const units, per = 48, 6
	var hosts []*host
	for h := 1; h <= 2; h++ {
		var dips []OutboundDIP
		for n := range 4 {
			dips = append(dips, outDIP(h, h*10+n, units))
		}
		hosts = append(hosts, runHost(t, e, fmt.Sprintf("host-%d", h), PortAllocatorConfig{MinRanges: per}, dips...))
	}
	eventually(t, "every DIP holds six ranges", func() bool {
		return len(hosts[0].nat.held()) == 4*per && len(hosts[1].nat.held()) == 4*per
	})
	seen := map[uint16]flow.PortOwner{}
	for i, h := range hosts {
		for _, a := range h.nat.held() {
			assert.Equal(t, outVIP, a.VIP)
			assert.Zero(t, (a.First-1024)%64, "unit-aligned")
			assert.Equal(t, a.First+63, a.Last)
			assert.LessOrEqual(t, int(a.Last), 1024+64*units-1)
			assert.Equal(t, netip.AddrFrom4([4]byte{198, 19, 0, byte(i + 1)}), a.Owner.Host)
			_, dup := seen[a.First]
			assert.False(t, dup, "range %d claimed twice", a.First)
			seen[a.First] = a.Owner
		}
	}
	assert.Len(t, seen, units)
	claims := claimsIn(t, e, newKeys("").portClaims())
	require.Len(t, claims, units)
	for first, c := range claims {
		assert.Equal(t, seen[first], c.owner(), "claim %d", first)
	}
	c0, c1 := hosts[0].a.Counters(), hosts[1].a.Counters()
	assert.Equal(t, uint64(units), c0.Claims+c1.Claims)
	t.Logf("claim conflicts: %d, %d", c0.Conflicts, c1.Conflicts)
}

// TestAllocatorPreallocates: before any connection, every DIP holds
// MinRanges ranges (its own static ones counting), handed to the Host
// Agent: a first packet finds a port without waiting for etcd.
func TestAllocatorPreallocates(t *testing.T) {
	e := startEtcd(t)
	// As OutboundDIPs gives them: every DIP of the section knows the
	// section's static ranges (Static), its own are Own. (This test gave
	// the static range to the second DIP only, and failed one run in ~15
	// when the first DIP's random pick was that range.)
	static := []control.PortRange{{First: 1024, Last: 1087}}
	plain := outDIP(1, 1, 16)
	plain.Static = static
	withStatic := outDIP(1, 2, 16)
	withStatic.Static, withStatic.Own = static, static
	h := runHost(t, e, "host-1", PortAllocatorConfig{MinRanges: 2}, plain, withStatic)
	eventually(t, "pre-allocated", func() bool { return len(h.nat.held()) == 3 })
	byDIP := map[netip.Addr][]uint16{}
	for _, a := range h.nat.held() {
		byDIP[a.Owner.DIP] = append(byDIP[a.Owner.DIP], a.First)
		assert.NotEqual(t, uint16(1024), a.First, "a static range is never claimed: %+v", a)
	}
	assert.Len(t, byDIP[netip.MustParseAddr("198.19.1.1")], 2)
	assert.Len(t, byDIP[netip.MustParseAddr("198.19.1.2")], 1, "its static range counts")
	assert.Equal(t, uint64(3), h.a.Counters().Claims)
	assert.ElementsMatch(t, h.nat.held(), h.a.Allocations())
}

// TestAllocatorHighWater: a DIP whose ports in use pass the high-water
// mark claims more before it runs out, and only then.
func TestAllocatorHighWater(t *testing.T) {
	e := startEtcd(t)
	h := runHost(t, e, "host-1", PortAllocatorConfig{HighWater: 0.75}, outDIP(1, 1, 16))
	eventually(t, "one range", func() bool { return len(h.nat.held()) == 1 })
	first := h.nat.held()[0].First
	h.nat.set(first, 200, 47) // below 48 of 64
	h.nat.settle(t, 3)
	require.Len(t, h.nat.held(), 1, "below the mark: no claim")
	h.nat.set(first, 300, 48)
	eventually(t, "a second range", func() bool { return len(h.nat.held()) == 2 })
	h.nat.settle(t, 3)
	assert.Len(t, h.nat.held(), 2, "48 of 128 in use: below the mark again")
	// Both full: 128 of 128; one more unit brings it under the mark.
	for _, a := range h.nat.held() {
		h.nat.set(a.First, 900, 64)
	}
	eventually(t, "three ranges", func() bool { return len(h.nat.held()) == 3 })
	h.nat.settle(t, 3)
	assert.Len(t, h.nat.held(), 3, "128 of 192 in use: below the mark")
	assert.Equal(t, uint64(3), h.a.Counters().Claims)
}

// TestAllocatorIdleReturn: ranges without a connection for Idle are
// returned (claim and guard deleted: free for anyone at once), down to
// MinRanges; a range with live connections never is, however long.
func TestAllocatorIdleReturn(t *testing.T) {
	e := startEtcd(t)
	clk := &fakeClock{t: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	h := runHost(t, e, "host-1", PortAllocatorConfig{Idle: time.Minute, Now: clk.now, MinRanges: 1}, outDIP(1, 1, 16))
	eventually(t, "one range", func() bool { return len(h.nat.held()) == 1 })
	busy := h.nat.held()[0].First
	h.nat.set(busy, 64, 64) // full: a second range
	eventually(t, "two ranges", func() bool { return len(h.nat.held()) == 2 })
	for _, a := range h.nat.held() {
		h.nat.set(a.First, 64, 64) // both full: a third
	}
	eventually(t, "three ranges", func() bool { return len(h.nat.held()) == 3 })
	for _, a := range h.nat.held() {
		h.nat.set(a.First, 0, 0)
	}
	h.nat.set(busy, 1, 1) // one live connection left
	h.nat.settle(t, 3)
	n := len(h.nat.held())
	clk.add(59 * time.Second)
	h.nat.settle(t, 3)
	require.Len(t, h.nat.held(), n, "not idle long enough")
	clk.add(time.Second)
	eventually(t, "idle ranges returned", func() bool { return len(h.nat.held()) == 1 })
	assert.Equal(t, busy, h.nat.held()[0].First, "the range with a live connection is kept")
	// The Host Agent stops using a range first; then it is deleted.
	eventually(t, "returned in etcd", func() bool { return h.a.Counters().Returns == uint64(n-1) })
	k := newKeys("")
	assert.Equal(t, []uint16{busy}, keysOf(claimsIn(t, e, k.portClaims())))
	assert.Equal(t, []uint16{busy}, keysOf(claimsIn(t, e, k.portGuards())), "returned ranges leave no guard")

	// The last range is busy; even idle it stays (the minimum).
	clk.add(time.Hour)
	h.nat.settle(t, 3)
	h.nat.set(busy, 0, 0)
	clk.add(time.Hour)
	h.nat.settle(t, 3)
	assert.Equal(t, []uint16{busy}, firsts(h.nat.held()))
}

// TestAllocatorReturnRace: a connection that takes a port of an idle
// range just before the allocator withdraws it keeps the range: it is
// given back to the Host Agent, not returned to the pool.
func TestAllocatorReturnRace(t *testing.T) {
	e := startEtcd(t)
	clk := &fakeClock{t: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	h := runHost(t, e, "host-1", PortAllocatorConfig{Idle: time.Minute, Now: clk.now}, outDIP(1, 1, 16))
	eventually(t, "one range", func() bool { return len(h.nat.held()) == 1 })
	busy := h.nat.held()[0].First
	h.nat.set(busy, 64, 64)
	eventually(t, "two ranges", func() bool { return len(h.nat.held()) == 2 })
	other := h.nat.held()[0].First
	if other == busy {
		other = h.nat.held()[1].First
	}
	h.nat.mu.Lock()
	h.nat.grab = other
	h.nat.mu.Unlock()
	clk.add(time.Minute)
	eventually(t, "withdrawn and given back", func() bool {
		h.nat.mu.Lock()
		defer h.nat.mu.Unlock()
		return h.nat.use[other][0] == 1 && len(h.nat.allocs) == 2
	})
	h.nat.settle(t, 3)
	assert.Zero(t, h.a.Counters().Returns, "%+v %v busy %d other %d", h.a.Counters(), h.nat.held(), busy, other)
	assert.Len(t, claimsIn(t, e, newKeys("").portClaims()), 2, "still claimed in etcd")
}

func keysOf(m map[uint16]recordKV) []uint16 {
	var out []uint16
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestAllocatorExhaustion: a DIP that needs a range when the pool has
// none counts it (and gets nothing); once another host returns one, it
// gets it.
func TestAllocatorExhaustion(t *testing.T) {
	e := startEtcd(t)
	clk := &fakeClock{t: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	h1 := runHost(t, e, "host-1", PortAllocatorConfig{Idle: time.Minute, Now: clk.now, MinRanges: 1}, outDIP(1, 1, 2))
	eventually(t, "host-1's range", func() bool { return len(h1.nat.held()) == 1 })
	first := h1.nat.held()[0].First
	h1.nat.set(first, 60, 60)
	eventually(t, "host-1 holds the whole pool", func() bool { return len(h1.nat.held()) == 2 })
	h1.nat.set(first, 0, 0)

	h2 := runHost(t, e, "host-2", PortAllocatorConfig{}, outDIP(2, 2, 2))
	eventually(t, "exhaustion counted", func() bool { return h2.a.Counters().Exhausted >= 2 })
	assert.Empty(t, h2.nat.held())
	assert.Zero(t, h2.a.Counters().Claims)

	clk.add(time.Minute) // host-1's ranges are idle: one is returned
	eventually(t, "host-2 gets the returned range", func() bool { return len(h2.nat.held()) == 1 })
	assert.Len(t, h1.nat.held(), 1)
	assert.NotEqual(t, h1.nat.held()[0].First, h2.nat.held()[0].First)
}

// TestAllocatorGuard: a Host Agent dies (its lease ends, etcd deletes its
// claims). Its ranges are not claimable by another host — however often
// it tries — until the guard time has passed since it first saw them
// free; the dead host restarted (a new lease) takes them back at once;
// and once a guard's time passes (its cooling lease expires: driven here
// by revoking it), another host claims the range.
func TestAllocatorGuard(t *testing.T) {
	e := startEtcd(t)
	k := newKeys("")
	ctx := context.Background()
	dipA := outDIP(1, 1, 3)
	a := runHost(t, e, "host-a", PortAllocatorConfig{MinRanges: 2, MaxConnTimeout: time.Hour}, dipA)
	eventually(t, "host-a's ranges", func() bool { return len(a.nat.held()) == 2 })
	aRanges := firsts(a.nat.held())
	b := runHost(t, e, "host-b", PortAllocatorConfig{MinRanges: 1, MaxConnTimeout: time.Hour}, outDIP(2, 2, 3))
	eventually(t, "host-b's range", func() bool { return len(b.nat.held()) == 1 })

	die := func(h *host) {
		h.stop()
		claims := claimsIn(t, e, k.portClaims())
		leases := map[int64]bool{}
		for _, f := range firsts(h.nat.held()) {
			leases[claims[f].lease] = true
		}
		require.Len(t, leases, 1)
		for l := range leases {
			// Its lease "expires" (revoked: the same for etcd).
			_, err := e.client.Revoke(ctx, clientv3.LeaseID(l))
			require.NoError(t, err)
		}
		require.Len(t, claimsIn(t, e, k.portClaims()), 1, "only host-b's claim is left")
	}
	die(a)

	// host-b has a new DIP that wants a range: host-a's are free in etcd
	// but guarded.
	b.a.SetDIPs([]OutboundDIP{outDIP(2, 2, 3), outDIP(2, 3, 3)})
	eventually(t, "host-a's ranges are cooling", func() bool { return b.a.Counters().Cooling == 2 })
	ex := b.a.Counters().Exhausted
	b.nat.settle(t, 5)
	assert.Greater(t, b.a.Counters().Exhausted, ex, "the pool counts as exhausted")
	require.Len(t, b.nat.held(), 1, "guarded ranges are not claimed by another host")
	guards := claimsIn(t, e, k.portGuards())
	for _, f := range aRanges {
		g := guards[f]
		require.NotZero(t, g.lease, "a cooling guard is under a lease")
		ttl, err := e.client.TimeToLive(ctx, clientv3.LeaseID(g.lease))
		require.NoError(t, err)
		assert.Equal(t, int64((5*time.Second+time.Hour)/time.Second), ttl.GrantedTTL, "lease TTL + longest connection timeout")
	}

	// Status shows them guarded.
	f, err := ReadStatus(ctx, e.client, "")
	require.NoError(t, err)
	doc := &control.Document{Outbound: []control.Outbound{{Address: outVIP, VNI: 100, Unit: 64,
		Pool: []control.PortRange{{First: 1024, Last: 1024 + 3*64 - 1}}}}}
	or := outboundReports(f, doc)
	require.Len(t, or, 1)
	assert.Equal(t, []int{3, 1, 2, 0}, []int{or[0].Units, or[0].Held, or[0].Guarded, or[0].Free})

	// host-a restarts: its ranges come back at once, guards and all.
	a2 := runHost(t, e, "host-a", PortAllocatorConfig{MinRanges: 2, MaxConnTimeout: time.Hour}, dipA)
	eventually(t, "host-a takes its ranges back", func() bool { return len(a2.nat.held()) == 2 })
	assert.Equal(t, aRanges, firsts(a2.nat.held()))
	assert.Equal(t, uint64(2), a2.a.Counters().Reclaims)
	assert.Zero(t, a2.a.Counters().Claims)
	for _, f := range aRanges {
		assert.Zero(t, claimsIn(t, e, k.portGuards())[f].lease, "a held range's guard has no lease")
	}

	// It dies again; this time the guard time passes.
	die(a2)
	eventually(t, "cooling again", func() bool { return b.a.Counters().Cooling == 4 })
	b.nat.settle(t, 3)
	require.Len(t, b.nat.held(), 1)
	guards = claimsIn(t, e, k.portGuards())
	require.Equal(t, guards[aRanges[0]].lease, guards[aRanges[1]].lease, "ranges found free together cool together")
	_, err = e.client.Revoke(ctx, clientv3.LeaseID(guards[aRanges[0]].lease))
	require.NoError(t, err)
	eventually(t, "host-b claims a range whose guard time passed", func() bool { return len(b.nat.held()) == 2 })
	got := firsts(b.nat.held())
	assert.True(t, slices.Contains(got, aRanges[0]) || slices.Contains(got, aRanges[1]), "%v", got)
}

// TestOutboundDIPs: a host's outbound DIPs from the document, with their
// owner and their own static ranges.
func TestOutboundDIPs(t *testing.T) {
	doc, err := control.Parse([]byte(`version: 1
hosts:
  - name: host-1
    address: 198.19.0.1
    vms:
      - {vni: 100, address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm1}
      - {vni: 100, address: 198.19.1.2, mac: "02:00:00:00:01:02", interface: vm2}
  - name: host-2
    address: 198.19.0.2
    vms:
      - {vni: 100, address: 198.19.1.3, mac: "02:00:00:00:01:03", interface: vm3}
mux_prefixes: [198.18.1.0/24]
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    backends: [{address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}]
outbound:
  - address: 198.18.100.1
    vni: 100
    dips: [198.19.1.1, 198.19.1.2, 198.19.1.3]
    ports: 2048-4095
    unit: 256
    static: [{dip: 198.19.1.2, ports: 2048-2303}]
`))
	require.NoError(t, err)
	ds := OutboundDIPs(doc, "host-1")
	require.Len(t, ds, 2)
	assert.Equal(t, flow.PortOwner{DIP: netip.MustParseAddr("198.19.1.1"), Host: netip.MustParseAddr("198.19.0.1"), VNI: 100,
		MAC: [6]byte{2, 0, 0, 0, 1, 1}}, ds[0].Owner)
	assert.Empty(t, ds[0].Own)
	assert.Equal(t, []control.PortRange{{First: 2048, Last: 2303}}, ds[1].Own)
	assert.Equal(t, ds[1].Own, ds[0].Static)
	assert.Equal(t, uint16(256), ds[0].Unit)
	assert.Len(t, OutboundDIPs(doc, "host-2"), 1)
	assert.Empty(t, OutboundDIPs(doc, "host-3"))
}

// hookKV is etcd's KV that runs hook before every transaction that
// writes a claim or a guard, as if another host's transaction had landed
// between this one's read and its write (the sweeper election's writes
// are not hooked).
type hookKV struct {
	clientv3.KV
	hook func()
}

func (h *hookKV) Txn(ctx context.Context) clientv3.Txn {
	return txnHook{KV: h.KV, commit: func(txn clientv3.Txn, then []clientv3.Op) (*clientv3.TxnResponse, error) {
		if slices.ContainsFunc(then, func(op clientv3.Op) bool {
			return op.IsPut() && bytes.HasPrefix(op.KeyBytes(), []byte(newKeys("").ports()))
		}) {
			h.hook()
		}
		return txn.Commit()
	}}.Txn(ctx)
}

// TestAllocatorRestartRacesCooling: a restarted Host Agent whose taking
// back of a range loses the race against another host starting the
// range's guard time (the guard changed between its read and its write)
// reads again and takes it back: it does not drop the range, nor claim
// new ones instead.
func TestAllocatorRestartRacesCooling(t *testing.T) {
	e := startEtcd(t)
	k := newKeys("")
	ctx := context.Background()
	dipA := outDIP(1, 1, 4)
	a := runHost(t, e, "host-a", PortAllocatorConfig{}, dipA)
	eventually(t, "host-a's range", func() bool { return len(a.nat.held()) == 1 })
	first := a.nat.held()[0].First
	a.stop()
	_, err := e.client.Revoke(ctx, clientv3.LeaseID(claimsIn(t, e, k.portClaims())[first].lease))
	require.NoError(t, err)

	// host-a restarts; its first write is preceded by another host's
	// cooling of the guard it has just read.
	c, err := etcdlab.Client(e.cluster.Endpoints())
	require.NoError(t, err)
	defer c.Close()
	cool := func() {
		g := claimsIn(t, e, k.portGuards())[first]
		l, err := e.client.Grant(ctx, 3600)
		require.NoError(t, err)
		b, _ := json.Marshal(g.PortClaim)
		_, err = e.client.Put(ctx, k.portGuard(outVIP, first), string(b), clientv3.WithLease(l.ID))
		require.NoError(t, err)
	}
	var hooked atomic.Bool
	rc := &clientv3.Client{KV: &hookKV{KV: c.KV, hook: func() {
		if hooked.CompareAndSwap(false, true) {
			cool()
		}
	}}, Lease: c.Lease, Watcher: c.Watcher}
	nat := newFakeNAT()
	a2, err := NewPortAllocator(PortAllocatorConfig{Client: rc, Host: "host-a", TTL: 5 * time.Second, Interval: 20 * time.Millisecond,
		Usage: nat.usage, OnChange: nat.onChange})
	require.NoError(t, err)
	a2.SetDIPs([]OutboundDIP{dipA})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { a2.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()
	eventually(t, "host-a's range back", func() bool { return len(nat.held()) == 1 })
	assert.True(t, hooked.Load(), "the race happened")
	assert.Equal(t, first, nat.held()[0].First, "its own range, not a new one")
	assert.Equal(t, uint64(1), a2.Counters().Conflicts)
	assert.Zero(t, a2.Counters().Claims)
}
