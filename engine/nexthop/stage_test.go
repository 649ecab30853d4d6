package nexthop_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/header"
)

func TestStageOuterDst(t *testing.T) {
	cases := []struct {
		name    string
		host    netip.Addr
		reason  string
		dst     header.MAC
		src     header.MAC
		outPort uint16
	}{
		{"IPv4 host", host4, "", hopMAC, muxMAC, 0},
		{"IPv6 host", host6, "", hopMAC, muxMAC, 0},
		{"second interface", hostB, "", header.MAC{2, 0, 0, 0, 0xbb, 5}, header.MAC{2, 0, 0, 0, 0, 5}, 1},
		{"unresolved", netip.MustParseAddr("198.19.9.9"), "nexthop_unresolved", header.MAC{}, header.MAC{}, 0},
		{"interface without a port", outside, "no_out_port", header.MAC{}, header.MAC{}, 0},
	}
	r := newRig(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := newResolver()
			frame := tunnel(t, tc.host)
			ps := r.loadRaw(frame)
			ps[0].OutPort = 9
			r.run(newNextHop(t, nexthop.OuterDst, res))
			assert.Equal(t, 1, res.calls)
			require.Equal(t, tc.reason, reason(ps[0]))
			if tc.reason != "" {
				return
			}
			got := ps[0].Data()
			eth := header.Ethernet(got)
			assert.Equal(t, tc.dst, eth.Dst())
			assert.Equal(t, tc.src, eth.Src())
			assert.Equal(t, tc.outPort, ps[0].OutPort)
			assert.Equal(t, frame[12:], got[12:], "only the MACs change")
		})
	}
}

func TestStageL3Dst(t *testing.T) {
	cases := []struct {
		name  string
		frame []byte
	}{
		{"IPv4", reply(t, vip4, client4, 0)},
		{"IPv6", reply(t, vip6, client6, 0)},
		{"tagged", reply(t, vip4, client4, 12)},
	}
	r := newRig(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ps := r.load(tc.frame)
			r.run(newNextHop(t, nexthop.L3Dst, newResolver()))
			require.Equal(t, "", reason(ps[0]))
			got := ps[0].Data()
			assert.Equal(t, routerMAC, header.Ethernet(got).Dst())
			assert.Equal(t, muxMAC, header.Ethernet(got).Src())
			assert.Equal(t, tc.frame[12:], got[12:])
			assert.Equal(t, uint16(0), ps[0].OutPort)
		})
	}

	t.Run("not parsed", func(t *testing.T) {
		ps := r.load(reply(t, vip4, client4, 0))
		ps[0].Flags = 0
		r.run(newNextHop(t, nexthop.L3Dst, newResolver()))
		assert.Equal(t, "unsupported", reason(ps[0]))
	})
	t.Run("outer not IP", func(t *testing.T) {
		f := reply(t, vip4, client4, 0)
		f[12], f[13] = 0x08, 0x06 // ARP
		ps := r.loadRaw(f, f[:10])
		r.run(newNextHop(t, nexthop.OuterDst, newResolver()))
		assert.Equal(t, "unsupported", reason(ps[0]))
		assert.Equal(t, "unsupported", reason(ps[1]))
	})
}

// TestStageBatchCache: consecutive packets to one address cost one
// lookup, hits and misses alike.
func TestStageBatchCache(t *testing.T) {
	unres := netip.MustParseAddr("198.19.9.9")
	a, b, u := tunnel(t, host4), tunnel(t, hostB), tunnel(t, unres)
	cases := []struct {
		name    string
		frames  [][]byte
		lookups int
		drops   int
	}{
		{"one host", [][]byte{a, a, a, a}, 1, 0},
		{"two runs", [][]byte{a, a, b, b, b}, 2, 0},
		{"alternating", [][]byte{a, b, a, b}, 2, 0},
		{"misses cached too", [][]byte{u, u, u, a}, 2, 3},
	}
	r := newRig(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := newResolver()
			ps := r.loadRaw(tc.frames...)
			r.run(newNextHop(t, nexthop.OuterDst, res))
			assert.Equal(t, tc.lookups, res.calls)
			drops := 0
			for i, p := range ps {
				if reason(p) != "" {
					drops++
					continue
				}
				want := res.static.Hops[host4]
				if &tc.frames[i][0] == &b[0] {
					want = res.static.Hops[hostB]
				}
				assert.Equal(t, header.MAC(want.DstMAC), header.Ethernet(p.Data()).Dst(), "packet %d", i)
			}
			assert.Equal(t, tc.drops, drops)
		})
	}
	// Without a version a new batch looks up again (the resolver may have
	// changed).
	res := newResolver()
	s := newNextHop(t, nexthop.OuterDst, res)
	for range 3 {
		r.loadRaw(a, a)
		r.run(s)
	}
	assert.Equal(t, 3, res.calls)
}

// versionedResolver is a fakeResolver with a version the test bumps.
type versionedResolver struct {
	*fakeResolver
	version uint64
}

func (v *versionedResolver) Version() uint64 { return v.version }

// TestStageWorkerCache: with a VersionedSource the answers are kept
// per worker across batches until the version changes or the refresh
// period passes; misses are not kept beyond their batch; workers do not
// share entries.
func TestStageWorkerCache(t *testing.T) {
	unres := netip.MustParseAddr("198.19.9.9")
	a, b, u := tunnel(t, host4), tunnel(t, hostB), tunnel(t, unres)
	res := &versionedResolver{fakeResolver: newResolver(), version: 1}
	s := newNextHop(t, nexthop.OuterDst, res)
	r := newRig(t)
	batch := func(worker int, frames ...[]byte) []*engine.Packet {
		ps := r.loadRaw(frames...)
		r.b.Worker = worker
		r.run(s)
		return ps
	}
	batch(0, a, b, a)
	require.Equal(t, 2, res.calls)
	batch(0, b, a)
	require.Equal(t, 2, res.calls, "cached across batches")
	batch(1, a)
	require.Equal(t, 3, res.calls, "another worker has its own cache")

	// A route change: the hop of hostB moves to interface 4.
	res.static.Hops[hostB] = nexthop.Hop{IfIndex: 4, SrcMAC: muxMAC, DstMAC: header.MAC{2, 0, 0, 0, 0xcc, 4}}
	ps := batch(0, b)
	require.Equal(t, header.MAC{2, 0, 0, 0, 0xbb, 5}, header.Ethernet(ps[0].Data()).Dst(), "same version: cached")
	res.version++
	ps = batch(0, b)
	require.Equal(t, 4, res.calls)
	require.Equal(t, header.MAC{2, 0, 0, 0, 0xcc, 4}, header.Ethernet(ps[0].Data()).Dst(), "new version: looked up")
	require.EqualValues(t, 0, ps[0].OutPort)

	// Misses cost one lookup per batch, and are looked up again next batch.
	before := res.calls
	ps = batch(0, u, u, u)
	require.Equal(t, before+1, res.calls)
	for _, p := range ps {
		require.Equal(t, "nexthop_unresolved", reason(p))
	}
	res.static.Hops[unres] = nexthop.Hop{IfIndex: 5, SrcMAC: muxMAC, DstMAC: hopMAC}
	ps = batch(0, u)
	require.Equal(t, "", reason(ps[0]), "resolved since the last batch")

	// A worker index past engine.MaxWorkers has no cache: the last answer
	// only, within its batch.
	before = res.calls
	ps = batch(engine.MaxWorkers+3, a, a, b, a)
	require.Equal(t, before+3, res.calls, "a, b, a")
	require.Equal(t, header.MAC(hopMAC), header.Ethernet(ps[3].Data()).Dst())

	// The refresh period: entries are looked up again after it.
	batch(0, a)
	before = res.calls
	for range 1100 {
		batch(0, a)
	}
	require.Equal(t, before+1, res.calls, "one refresh in 1100 batches")
}

// TestStageSlowPath: with SlowPath, what the stage cannot address
// (unresolved, or a hop through an interface without a port) leaves
// through SlowPort untouched instead of being dropped; the resolver is
// still asked, and resolved destinations are unaffected.
func TestStageSlowPath(t *testing.T) {
	unres := netip.MustParseAddr("198.19.9.9")
	a, u, o := tunnel(t, host4), tunnel(t, unres), tunnel(t, outside)
	res := newResolver()
	s, err := nexthop.NewStage(nexthop.StageConfig{Mode: nexthop.OuterDst, Ports: map[int]uint16{4: 0, 5: 1},
		SlowPath: true, SlowPort: 9}, res)
	require.NoError(t, err)
	r := newRig(t)
	ps := r.loadRaw(a, u, o, u)
	r.run(s)
	require.Len(t, r.b.Packets(), 4, "nothing dropped")
	require.EqualValues(t, 0, ps[0].OutPort)
	require.Equal(t, header.MAC(hopMAC), header.Ethernet(ps[0].Data()).Dst())
	for _, i := range []int{1, 2, 3} {
		require.EqualValues(t, 9, ps[i].OutPort, "packet %d", i)
	}
	require.Equal(t, u, data(ps[1]), "the slow path's frame is left as it was")
	require.Equal(t, 4, res.calls, "a, u, o, u: only the last miss is remembered")
}

func TestStageConfig(t *testing.T) {
	res := newResolver()
	for _, c := range []nexthop.StageConfig{
		{},
		{Ports: map[int]uint16{0: 1}},
		{Mode: 7, Ports: map[int]uint16{1: 1}},
	} {
		assert.Error(t, c.Validate())
		_, err := nexthop.NewStage(c, res)
		assert.Error(t, err)
	}
	_, err := nexthop.NewStage(nexthop.StageConfig{Ports: map[int]uint16{1: 0}}, nil)
	assert.Error(t, err)

	for _, m := range []nexthop.Mode{nexthop.OuterDst, nexthop.L3Dst} {
		b, err := m.MarshalText()
		require.NoError(t, err)
		var back nexthop.Mode
		require.NoError(t, back.UnmarshalText(b))
		assert.Equal(t, m, back)
	}
	var m nexthop.Mode
	assert.Error(t, m.UnmarshalText([]byte("nope")))
	_, err = nexthop.Mode(9).MarshalText()
	assert.Error(t, err)
}

// The real resolver is a VersionedSource (checked at compile time in the
// package too).
var _ nexthop.VersionedSource = (*nexthop.Resolver)(nil)

var _ engine.Stage = (*nexthop.Stage)(nil)

// TestStageNoAllocs: a batch costs no allocation, hits and misses alike.
func TestStageNoAllocs(t *testing.T) {
	t4, t6 := tunnel(t, host4), tunnel(t, host6)
	mixed := [][]byte{t4, t6, t4, tunnel(t, netip.MustParseAddr("198.19.9.9"))}
	cases := []struct {
		name   string
		mode   nexthop.Mode
		frames [][]byte
		parse  bool
	}{
		{"outer", nexthop.OuterDst, append(repeat(t4, 60), mixed...), false},
		{"l3", nexthop.L3Dst, repeat(reply(t, vip6, client6, 0), engine.MaxBatch), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newNextHop(t, tc.mode, newResolver())
			fx := newFixture(t, tc.frames, tc.parse)
			allocs := testing.AllocsPerRun(100, func() {
				b := fx.reset()
				s.Process(b)
				b.Compact()
			})
			require.Zero(t, allocs)
			require.Equal(t, "", reason(&fx.r.pool[0]))
		})
	}
}

func BenchmarkStage(b *testing.B) {
	t4, t6, tB := tunnel(b, host4), tunnel(b, host6), tunnel(b, hostB)
	var alternating [][]byte
	for i := range engine.MaxBatch {
		alternating = append(alternating, [][]byte{t4, t6, tB}[i%3])
	}
	cases := []struct {
		name   string
		frames [][]byte
	}{
		{"same-host", repeat(t4, engine.MaxBatch)},
		{"alternating-hosts", alternating},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			s := newNextHop(b, nexthop.OuterDst, newResolver())
			fx := newFixture(b, tc.frames, false)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				s.Process(fx.reset())
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(fx.frames)), "ns/pkt")
		})
	}
}
