package encap_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/header"
)

var (
	hostB   = netip.MustParseAddr("198.19.2.3")
	outside = netip.MustParseAddr("198.19.2.4") // resolves through an interface without a port
)

func newResolver() *fakeResolver {
	return &fakeResolver{hops: map[netip.Addr]nexthop.Hop{
		host4:   {IfIndex: 4, SrcMAC: muxMAC, DstMAC: hopMAC},
		hostB:   {IfIndex: 5, SrcMAC: header.MAC{2, 0, 0, 0, 0, 5}, DstMAC: header.MAC{2, 0, 0, 0, 0xbb, 5}},
		host6:   {IfIndex: 4, SrcMAC: muxMAC, DstMAC: hopMAC},
		client4: {IfIndex: 4, SrcMAC: muxMAC, DstMAC: routerMAC},
		client6: {IfIndex: 4, SrcMAC: muxMAC, DstMAC: routerMAC},
		outside: {IfIndex: 99},
	}}
}

func newNextHop(t testing.TB, mode encap.NextHopMode, r encap.Resolver) *encap.NextHop {
	s, err := encap.NewNextHop(encap.NextHopConfig{Mode: mode, Ports: map[int]uint16{4: 0, 5: 1}}, r)
	require.NoError(t, err)
	return s
}

// encapsulated returns frames encapsulated towards hosts, in order.
func encapsulated(t testing.TB, hosts ...netip.Addr) [][]byte {
	r := newRig(t)
	e := newEncap(t, encap.EncapConfig{})
	var out [][]byte
	for _, h := range hosts {
		ps := r.load(0, v4pkt().build())
		balanced(ps, ruleFor(vip4, h), 0)
		r.run(e)
		require.Equal(t, "", reason(ps[0]))
		out = append(out, data(ps[0]))
	}
	return out
}

func TestNextHopOuterDst(t *testing.T) {
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
			frame := encapsulated(t, tc.host)[0]
			ps := r.loadRaw(frame)
			ps[0].OutPort = 9
			r.run(newNextHop(t, encap.OuterDst, res))
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

func TestNextHopL3Dst(t *testing.T) {
	tagged := pkt{src: vip4, dst: client4, size: 10, vlan: 12}
	cases := []struct {
		name string
		p    pkt
	}{
		{"IPv4", pkt{src: vip4, dst: client4, size: 10}},
		{"IPv6", pkt{src: vip6, dst: client6, size: 10}},
		{"tagged", tagged},
	}
	r := newRig(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			frame := tc.p.build()
			ps := r.load(0, frame)
			r.run(newNextHop(t, encap.L3Dst, newResolver()))
			require.Equal(t, "", reason(ps[0]))
			got := ps[0].Data()
			assert.Equal(t, routerMAC, header.Ethernet(got).Dst())
			assert.Equal(t, muxMAC, header.Ethernet(got).Src())
			assert.Equal(t, frame[12:], got[12:])
			assert.Equal(t, uint16(0), ps[0].OutPort)
		})
	}

	t.Run("not parsed", func(t *testing.T) {
		ps := r.load(0, v4pkt().build())
		ps[0].Flags = 0
		r.run(newNextHop(t, encap.L3Dst, newResolver()))
		assert.Equal(t, "unsupported", reason(ps[0]))
	})
	t.Run("outer not IP", func(t *testing.T) {
		f := v4pkt().build()
		f[12], f[13] = 0x08, 0x06 // ARP
		ps := r.loadRaw(f, f[:10])
		r.run(newNextHop(t, encap.OuterDst, newResolver()))
		assert.Equal(t, "unsupported", reason(ps[0]))
		assert.Equal(t, "unsupported", reason(ps[1]))
	})
}

// TestNextHopBatchCache: consecutive packets to one address cost one
// lookup, hits and misses alike.
func TestNextHopBatchCache(t *testing.T) {
	unres := netip.MustParseAddr("198.19.9.9")
	a, b, u := encapsulated(t, host4)[0], encapsulated(t, hostB)[0], encapsulated(t, unres)[0]
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
			r.run(newNextHop(t, encap.OuterDst, res))
			assert.Equal(t, tc.lookups, res.calls)
			drops := 0
			for i, p := range ps {
				if reason(p) != "" {
					drops++
					continue
				}
				want := res.hops[host4]
				if &tc.frames[i][0] == &b[0] {
					want = res.hops[hostB]
				}
				assert.Equal(t, header.MAC(want.DstMAC), header.Ethernet(p.Data()).Dst(), "packet %d", i)
			}
			assert.Equal(t, tc.drops, drops)
		})
	}
	// Without a version a new batch looks up again (the resolver may have
	// changed).
	res := newResolver()
	s := newNextHop(t, encap.OuterDst, res)
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

// TestNextHopWorkerCache: with a VersionedResolver the answers are kept
// per worker across batches until the version changes or the refresh
// period passes; misses are not kept beyond their batch; workers do not
// share entries.
func TestNextHopWorkerCache(t *testing.T) {
	unres := netip.MustParseAddr("198.19.9.9")
	a, b, u := encapsulated(t, host4)[0], encapsulated(t, hostB)[0], encapsulated(t, unres)[0]
	res := &versionedResolver{fakeResolver: newResolver(), version: 1}
	s := newNextHop(t, encap.OuterDst, res)
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
	res.hops[hostB] = nexthop.Hop{IfIndex: 4, SrcMAC: muxMAC, DstMAC: header.MAC{2, 0, 0, 0, 0xcc, 4}}
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
	res.hops[unres] = nexthop.Hop{IfIndex: 5, SrcMAC: muxMAC, DstMAC: hopMAC}
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

// TestNextHopSlowPath: with SlowPath, what the stage cannot address
// (unresolved, or a hop through an interface without a port) leaves
// through SlowPort untouched instead of being dropped; the resolver is
// still asked, and resolved destinations are unaffected.
func TestNextHopSlowPath(t *testing.T) {
	unres := netip.MustParseAddr("198.19.9.9")
	a, u, o := encapsulated(t, host4)[0], encapsulated(t, unres)[0], encapsulated(t, outside)[0]
	res := newResolver()
	s, err := encap.NewNextHop(encap.NextHopConfig{Mode: encap.OuterDst, Ports: map[int]uint16{4: 0, 5: 1},
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

func TestNextHopConfig(t *testing.T) {
	res := newResolver()
	for _, c := range []encap.NextHopConfig{
		{},
		{Ports: map[int]uint16{0: 1}},
		{Mode: 7, Ports: map[int]uint16{1: 1}},
	} {
		assert.Error(t, c.Validate())
		_, err := encap.NewNextHop(c, res)
		assert.Error(t, err)
	}
	_, err := encap.NewNextHop(encap.NextHopConfig{Ports: map[int]uint16{1: 0}}, nil)
	assert.Error(t, err)

	for _, m := range []encap.NextHopMode{encap.OuterDst, encap.L3Dst} {
		b, err := m.MarshalText()
		require.NoError(t, err)
		var back encap.NextHopMode
		require.NoError(t, back.UnmarshalText(b))
		assert.Equal(t, m, back)
	}
	var m encap.NextHopMode
	assert.Error(t, m.UnmarshalText([]byte("nope")))
	_, err = encap.NextHopMode(9).MarshalText()
	assert.Error(t, err)
}

// The real resolver satisfies the interface (checked at compile time in
// the package too).
var _ encap.Resolver = (*nexthop.Resolver)(nil)

var _ engine.Stage = (*encap.NextHop)(nil)
