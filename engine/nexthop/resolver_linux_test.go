package nexthop

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// waitFor polls cond until it holds or the deadline passes. The deadline is
// a test timeout (a broken resolver fails instead of hanging), not a
// performance assertion.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startResolver runs a Resolver in ns until the test ends.
func startResolver(t *testing.T, ns *netlab.NS, cfg Config) *Resolver {
	t.Helper()
	cfg.NetNSPath = ns.Path()
	r, err := NewResolver(cfg)
	require.NoError(t, err)
	runResolver(t, r)
	return r
}

// runResolver runs r until the test ends.
func runResolver(t *testing.T, r *Resolver) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-runErr)
		assert.NoError(t, r.Close())
	})
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// lan is two namespaces on one veth: the resolver runs in "mux", "peer" is
// the neighbour.
type lan struct {
	mux, peer         *netlab.NS
	muxLink, peerLink *netlab.Link
}

func newLAN(t *testing.T) lan {
	lab := netlab.New(t, "nh")
	mux, err := lab.Namespace("mux")
	require.NoError(t, err)
	peer, err := lab.Namespace("peer")
	require.NoError(t, err)
	ml, pl, err := lab.Veth(mux, "eth0", peer, "eth0")
	require.NoError(t, err)
	for _, step := range []error{
		mux.AddAddr("eth0", "198.18.0.1/24"),
		mux.AddAddr("eth0", "2001:db8::1/64"),
		peer.AddAddr("eth0", "198.18.0.2/24"),
		peer.AddAddr("eth0", "2001:db8::2/64"),
	} {
		require.NoError(t, step)
	}
	return lan{mux, peer, ml, pl}
}

func mac(hw net.HardwareAddr) [6]byte { return [6]byte(hw) }

// neighbor returns the kernel's neighbour entry for ip in ns, if any.
func neighbor(t *testing.T, ns *netlab.NS, ip netip.Addr) (netlink.Neigh, bool) {
	t.Helper()
	list, err := ns.Netlink().NeighList(0, netlink.FAMILY_ALL)
	require.NoError(t, err)
	for _, n := range list {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip {
			return n, true
		}
	}
	return netlink.Neigh{}, false
}

func modes() []struct {
	name string
	cfg  Config
} {
	return []struct {
		name string
		cfg  Config
	}{
		{"managed", Config{}},
		{"ntf_use", Config{DisableManaged: true}},
	}
}

func TestResolveOnLink(t *testing.T) {
	for _, mode := range modes() {
		t.Run(mode.name, func(t *testing.T) {
			l := newLAN(t)
			r := startResolver(t, l.mux, mode.cfg)
			ctx := testCtx(t)
			for _, tc := range []struct{ dst, src string }{
				{"198.18.0.2", "198.18.0.1"},
				{"2001:db8::2", "2001:db8::1"},
			} {
				dst := netip.MustParseAddr(tc.dst)
				// No traffic has gone to the peer: the kernel knows nothing.
				_, known := neighbor(t, l.mux, dst)
				require.False(t, known)

				hop, err := r.Resolve(ctx, dst)
				require.NoError(t, err, tc.dst)
				assert.Equal(t, Hop{
					IfIndex: l.muxLink.Index,
					SrcMAC:  mac(l.muxLink.MAC),
					DstMAC:  mac(l.peerLink.MAC),
					Src:     netip.MustParseAddr(tc.src),
				}, hop, tc.dst)
				got, ok := r.Lookup(dst)
				assert.True(t, ok)
				assert.Equal(t, hop, got)

				n, ok := neighbor(t, l.mux, dst)
				require.True(t, ok)
				assert.Equal(t, mode.name == "managed", n.FlagsExt&netlink.NTF_EXT_MANAGED != 0,
					"managed flag on the kernel's entry")
			}
			assert.Equal(t, 2, r.Stats().Resolved)
		})
	}
}

func TestLookupTriggersResolution(t *testing.T) {
	for _, mode := range modes() {
		t.Run(mode.name, func(t *testing.T) {
			l := newLAN(t)
			r := startResolver(t, l.mux, mode.cfg)
			dst := netip.MustParseAddr("198.18.0.2")

			_, ok := r.Lookup(dst)
			require.False(t, ok, "first lookup misses")
			var hop Hop
			waitFor(t, "lookup to resolve", func() bool {
				hop, ok = r.Lookup(dst)
				return ok
			})
			assert.Equal(t, mac(l.peerLink.MAC), hop.DstMAC)
			assert.NotZero(t, r.Stats().Triggers)
		})
	}
}

func TestErrors(t *testing.T) {
	l := newLAN(t)
	ctx := testCtx(t)

	t.Run("local", func(t *testing.T) {
		r := startResolver(t, l.mux, Config{})
		_, err := r.Resolve(ctx, netip.MustParseAddr("198.18.0.1"))
		assert.ErrorIs(t, err, ErrNotUnicast)
	})
	t.Run("no route", func(t *testing.T) {
		r := startResolver(t, l.mux, Config{})
		_, err := r.Resolve(ctx, netip.MustParseAddr("198.18.200.1"))
		assert.ErrorIs(t, err, ErrNoRoute)
		_, ok := r.Lookup(netip.MustParseAddr("198.18.200.1"))
		assert.False(t, ok)
	})
	t.Run("silent neighbour, ntf_use", func(t *testing.T) {
		// Nobody owns .99: the kernel's probes fail after about 3 s.
		r := startResolver(t, l.mux, Config{DisableManaged: true, RetryInterval: time.Minute})
		_, err := r.Resolve(ctx, netip.MustParseAddr("198.18.0.99"))
		assert.ErrorIs(t, err, ErrNeighborFailed)
	})
	t.Run("silent neighbour, managed", func(t *testing.T) {
		// A managed entry is never given up: it stays pending.
		r := startResolver(t, l.mux, Config{})
		short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err := r.Resolve(short, netip.MustParseAddr("198.18.0.98"))
		assert.ErrorIs(t, err, ErrUnresolved)
		assert.Equal(t, 1, r.Stats().Pending)
	})
}

func TestRouteChangeIsFollowed(t *testing.T) {
	// mux has two uplinks, to gateway A and gateway B; a remote prefix is
	// routed via A, then the route is replaced by one via B.
	lab := netlab.New(t, "nh")
	mux, err := lab.Namespace("mux")
	require.NoError(t, err)
	gwa, err := lab.Namespace("gwa")
	require.NoError(t, err)
	gwb, err := lab.Namespace("gwb")
	require.NoError(t, err)
	ma, ga, err := lab.Veth(mux, "eth0", gwa, "eth0")
	require.NoError(t, err)
	mb, gb, err := lab.Veth(mux, "eth1", gwb, "eth0")
	require.NoError(t, err)
	for _, step := range []error{
		mux.AddAddr("eth0", "198.18.1.1/24"),
		mux.AddAddr("eth0", "2001:db8:1::1/64"),
		gwa.AddAddr("eth0", "198.18.1.2/24"),
		gwa.AddAddr("eth0", "2001:db8:1::2/64"),
		mux.AddAddr("eth1", "198.18.2.1/24"),
		mux.AddAddr("eth1", "2001:db8:2::1/64"),
		gwb.AddAddr("eth0", "198.18.2.2/24"),
		gwb.AddAddr("eth0", "2001:db8:2::2/64"),
		mux.AddRoute("198.18.100.0/24", "198.18.1.2"),
		mux.AddRoute("2001:db8:100::/64", "2001:db8:1::2"),
	} {
		require.NoError(t, step)
	}
	r := startResolver(t, mux, Config{})
	ctx := testCtx(t)

	for _, tc := range []struct{ dst, prefix, gwA, srcA, gwB, srcB string }{
		{"198.18.100.7", "198.18.100.0/24", "198.18.1.2", "198.18.1.1", "198.18.2.2", "198.18.2.1"},
		{"2001:db8:100::7", "2001:db8:100::/64", "2001:db8:1::2", "2001:db8:1::1", "2001:db8:2::2", "2001:db8:2::1"},
	} {
		t.Run(tc.dst, func(t *testing.T) {
			dst := netip.MustParseAddr(tc.dst)
			hop, err := r.Resolve(ctx, dst)
			require.NoError(t, err)
			assert.Equal(t, Hop{
				IfIndex: ma.Index, SrcMAC: mac(ma.MAC), DstMAC: mac(ga.MAC),
				Gateway: netip.MustParseAddr(tc.gwA), Src: netip.MustParseAddr(tc.srcA),
			}, hop)

			before := r.Version()
			require.NoError(t, mux.ReplaceRoute(tc.prefix, tc.gwB))
			want := Hop{
				IfIndex: mb.Index, SrcMAC: mac(mb.MAC), DstMAC: mac(gb.MAC),
				Gateway: netip.MustParseAddr(tc.gwB), Src: netip.MustParseAddr(tc.srcB),
			}
			waitFor(t, "the cache to follow the new route", func() bool {
				hop, ok := r.Lookup(dst)
				return ok && hop == want
			})
			// Caches of Lookup answers (Stage) see a new version.
			assert.Greater(t, r.Version(), before)

			// And when the route goes away, so does the hop.
			require.NoError(t, mux.DelRoute(tc.prefix))
			waitFor(t, "the cache to drop the deleted route", func() bool {
				_, ok := r.Lookup(dst)
				return !ok
			})
			_, err = r.Resolve(ctx, dst)
			assert.ErrorIs(t, err, ErrNoRoute)
		})
	}
}

func TestNeighborChangeIsFollowed(t *testing.T) {
	l := newLAN(t)
	r := startResolver(t, l.mux, Config{})
	ctx := testCtx(t)
	dst := netip.MustParseAddr("198.18.0.2")
	_, err := r.Resolve(ctx, dst)
	require.NoError(t, err)

	// An administrator pins another MAC: the neighbour event updates the hop
	// without a FIB lookup.
	other := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x42}
	resolutions := r.Stats().Resolutions
	require.NoError(t, l.mux.Netlink().NeighSet(&netlink.Neigh{
		LinkIndex: l.muxLink.Index, IP: dst.AsSlice(), HardwareAddr: other, State: netlink.NUD_PERMANENT,
	}))
	waitFor(t, "the pinned MAC", func() bool {
		hop, ok := r.Lookup(dst)
		return ok && hop.DstMAC == mac(other)
	})
	assert.Equal(t, resolutions, r.Stats().Resolutions, "a neighbour change needs no route lookup")

	// The entry is deleted: the resolver asks the kernel again and gets the
	// peer's real MAC back.
	require.NoError(t, l.mux.Netlink().NeighDel(&netlink.Neigh{LinkIndex: l.muxLink.Index, IP: dst.AsSlice()}))
	waitFor(t, "the real MAC again", func() bool {
		hop, ok := r.Lookup(dst)
		return ok && hop.DstMAC == mac(l.peerLink.MAC)
	})
}

func TestIdleEvictionReleasesManagedEntry(t *testing.T) {
	l := newLAN(t)
	r := startResolver(t, l.mux, Config{IdleTimeout: 100 * time.Millisecond, RetryInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	dst := netip.MustParseAddr("198.18.0.2")
	_, err := r.Resolve(ctx, dst)
	require.NoError(t, err)
	n, ok := neighbor(t, l.mux, dst)
	require.True(t, ok)
	require.NotZero(t, n.FlagsExt&netlink.NTF_EXT_MANAGED)

	waitFor(t, "the idle destination to be evicted", func() bool { return r.Stats().Entries == 0 })
	assert.NotZero(t, r.Stats().Evictions)
	n, ok = neighbor(t, l.mux, dst)
	require.True(t, ok, "the kernel's entry stays")
	assert.Zero(t, n.FlagsExt&netlink.NTF_EXT_MANAGED, "but is no longer managed")
	assert.Equal(t, mac(l.peerLink.MAC), [6]byte(n.HardwareAddr))
}

func TestCloseReleasesManagedEntries(t *testing.T) {
	l := newLAN(t)
	r, err := NewResolver(Config{NetNSPath: l.mux.Path()})
	require.NoError(t, err)
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.Background()) }()
	dst := netip.MustParseAddr("2001:db8::2")
	_, err = r.Resolve(testCtx(t), dst)
	require.NoError(t, err)
	n, _ := neighbor(t, l.mux, dst)
	require.NotZero(t, n.FlagsExt&netlink.NTF_EXT_MANAGED)

	require.NoError(t, r.Close())
	require.NoError(t, <-runErr, "Close stops Run")
	n, ok := neighbor(t, l.mux, dst)
	require.True(t, ok)
	assert.Zero(t, n.FlagsExt&netlink.NTF_EXT_MANAGED)

	// Snapshots taken before Close still answer.
	_, ok = r.Lookup(dst)
	assert.True(t, ok)
}

func TestLookupZeroAllocsWarm(t *testing.T) {
	l := newLAN(t)
	r := startResolver(t, l.mux, Config{})
	dst := netip.MustParseAddr("198.18.0.2")
	_, err := r.Resolve(testCtx(t), dst)
	require.NoError(t, err)
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		if _, ok := r.Lookup(dst); !ok {
			panic("miss on a warm cache")
		}
	}))
}

func TestManagedSupported(t *testing.T) {
	for rel, want := range map[string]bool{
		"6.18.44-fc-v782": true, "5.16.0": true, "5.15.0-91-generic": false,
		"4.19.0": false, "10.0": true, "": false, "garbage": false,
	} {
		assert.Equal(t, want, managedSupported(rel), rel)
	}
	t.Logf("this kernel: %s, managed neighbours: %v", kernelRelease(), managedSupported(kernelRelease()))
}

// A managed or NTF_USE update would strip NUD_PERMANENT from a static entry
// (checked on Linux 6.18: the entry drops to INCOMPLETE); the resolver
// must use static entries as they are and never touch them.
func TestStaticNeighborLeftAlone(t *testing.T) {
	for _, mode := range modes() {
		t.Run(mode.name, func(t *testing.T) {
			l := newLAN(t)
			dst := netip.MustParseAddr("198.18.0.50")
			pinned := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x50}
			require.NoError(t, l.mux.Netlink().NeighSet(&netlink.Neigh{
				LinkIndex: l.muxLink.Index, IP: dst.AsSlice(), HardwareAddr: pinned, State: netlink.NUD_PERMANENT,
			}))
			r := startResolver(t, l.mux, mode.cfg)
			hop, err := r.Resolve(testCtx(t), dst)
			require.NoError(t, err)
			assert.Equal(t, mac(pinned), hop.DstMAC)
			require.NoError(t, r.Close())
			n, ok := neighbor(t, l.mux, dst)
			require.True(t, ok)
			assert.Equal(t, netlink.NUD_PERMANENT, n.State)
			assert.Equal(t, pinned, n.HardwareAddr)
			assert.Zero(t, r.Stats().Triggers)
		})
	}
}
