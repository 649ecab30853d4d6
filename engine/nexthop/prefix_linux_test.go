package nexthop

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// routed is a resolver's namespace with two uplinks: eth0 to gateway A,
// eth1 to gateway B. Remote prefixes are routed through them; the labs have
// no default route, so the remote prefixes lie inside 198.18.0.0/15 and
// 2001:db8::/32 too.
type routed struct {
	mux, gwa, gwb  *netlab.NS
	ma, ga, mb, gb *netlab.Link
}

// labFamily holds one address family's view of a routed lab.
type labFamily struct {
	name           string
	gwA, gwB       string // gateway addresses
	remote         string // routed via A by newRouted
	inRemote       func(i int) netip.Addr
	more           string // a more specific prefix inside remote
	inMore, beside netip.Addr
	hopA, hopB     Hop
}

// routedViaA is newRouted with each family's remote prefix routed via
// gateway A, and a resolver with the default Config on the Mux.
func routedViaA(t *testing.T) (routed, *Resolver) {
	l := newRouted(t)
	for _, f := range l.families() {
		require.NoError(t, l.mux.AddRoute(f.remote, f.gwA))
	}
	return l, startResolver(t, l.mux, Config{})
}

func newRouted(t *testing.T) routed {
	lab := netlab.New(t, "nhp")
	var l routed
	var err error
	l.mux, err = lab.Namespace("mux")
	require.NoError(t, err)
	l.gwa, err = lab.Namespace("gwa")
	require.NoError(t, err)
	l.gwb, err = lab.Namespace("gwb")
	require.NoError(t, err)
	l.ma, l.ga, err = lab.Veth(l.mux, "eth0", l.gwa, "eth0")
	require.NoError(t, err)
	l.mb, l.gb, err = lab.Veth(l.mux, "eth1", l.gwb, "eth0")
	require.NoError(t, err)
	for _, step := range []error{
		l.mux.AddAddr("eth0", "198.18.1.1/24"),
		l.mux.AddAddr("eth0", "2001:db8:1::1/64"),
		l.gwa.AddAddr("eth0", "198.18.1.2/24"),
		l.gwa.AddAddr("eth0", "2001:db8:1::2/64"),
		l.mux.AddAddr("eth1", "198.18.2.1/24"),
		l.mux.AddAddr("eth1", "2001:db8:2::1/64"),
		l.gwb.AddAddr("eth0", "198.18.2.2/24"),
		l.gwb.AddAddr("eth0", "2001:db8:2::2/64"),
	} {
		require.NoError(t, step)
	}
	return l
}

func (l routed) families() []labFamily {
	return []labFamily{{
		name: "v4", gwA: "198.18.1.2", gwB: "198.18.2.2",
		remote:   "198.19.0.0/16",
		inRemote: func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}) },
		more:     "198.19.7.0/24",
		inMore:   netip.MustParseAddr("198.19.7.9"),
		beside:   netip.MustParseAddr("198.19.6.9"),
		hopA: Hop{IfIndex: l.ma.Index, SrcMAC: mac(l.ma.MAC), DstMAC: mac(l.ga.MAC),
			Gateway: netip.MustParseAddr("198.18.1.2"), Src: netip.MustParseAddr("198.18.1.1")},
		hopB: Hop{IfIndex: l.mb.Index, SrcMAC: mac(l.mb.MAC), DstMAC: mac(l.gb.MAC),
			Gateway: netip.MustParseAddr("198.18.2.2"), Src: netip.MustParseAddr("198.18.2.1")},
	}, {
		name: "v6", gwA: "2001:db8:1::2", gwB: "2001:db8:2::2",
		remote: "2001:db8:100::/48",
		inRemote: func(i int) netip.Addr {
			return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0x01, 0x00, 8: byte(i >> 8), 15: byte(i)})
		},
		more:   "2001:db8:100:7::/64",
		inMore: netip.MustParseAddr("2001:db8:100:7::9"),
		beside: netip.MustParseAddr("2001:db8:100:6::9"),
		hopA: Hop{IfIndex: l.ma.Index, SrcMAC: mac(l.ma.MAC), DstMAC: mac(l.ga.MAC),
			Gateway: netip.MustParseAddr("2001:db8:1::2"), Src: netip.MustParseAddr("2001:db8:1::1")},
		hopB: Hop{IfIndex: l.mb.Index, SrcMAC: mac(l.mb.MAC), DstMAC: mac(l.gb.MAC),
			Gateway: netip.MustParseAddr("2001:db8:2::2"), Src: netip.MustParseAddr("2001:db8:2::1")},
	}}
}

// waitHop waits until dst resolves to want. Lookup misses on the way are
// expected (they queue dst); a wrong answer is waited out too: the cache
// follows the kernel after the route settle delay.
func waitHop(t *testing.T, r *Resolver, dst netip.Addr, want Hop) {
	t.Helper()
	waitFor(t, dst.String()+" via "+want.Gateway.String(), func() bool {
		hop, ok := r.Lookup(dst)
		return ok && hop == want
	})
}

// assertDisjoint checks the invariant Run keeps once settled: no cached
// prefix overlaps another.
func assertDisjoint(t *testing.T, ps []netip.Prefix) {
	t.Helper()
	for i := range ps {
		for j := i + 1; j < len(ps); j++ {
			assert.False(t, ps[i].Overlaps(ps[j]), "%v overlaps %v", ps[i], ps[j])
		}
	}
}

// Many destinations behind one gateway route cost one resolution: the
// first learns the route's prefix and every other one is answered at once.
func TestPrefixOneResolution(t *testing.T) {
	l, r := routedViaA(t)
	ctx := testCtx(t)
	for i, f := range l.families() {
		t.Run(f.name, func(t *testing.T) {
			hop, err := r.Resolve(ctx, f.inRemote(1))
			require.NoError(t, err)
			assert.Equal(t, f.hopA, hop)
			st := r.Stats()
			assert.Equal(t, uint64(i+1), st.Resolutions, "one FIB lookup per family")
			assert.Equal(t, uint64(i+1), st.FIBMatches)
			assert.Equal(t, i+1, st.Prefixes)
			assert.Contains(t, r.Snapshot().Prefixes(), netip.MustParsePrefix(f.remote))

			version := r.Version()
			for j := 2; j < 1000; j++ {
				hop, ok := r.Lookup(f.inRemote(j))
				require.True(t, ok, "%v is answered by the first lookup", f.inRemote(j))
				require.Equal(t, f.hopA, hop)
			}
			st = r.Stats()
			assert.Equal(t, uint64(i+1), st.Resolutions)
			assert.Equal(t, i+1, st.Entries, "one entry for the whole prefix")
			assert.Equal(t, version, r.Version(), "no publish for new destinations")
		})
	}
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		if _, ok := r.Lookup(netip.MustParseAddr("198.19.200.200")); !ok {
			panic("miss inside a cached prefix")
		}
	}))
}

// A route added inside a cached prefix redirects the destinations inside
// it and no others; deleting it brings them back; deleting the covering
// route makes them unroutable.
func TestPrefixMoreSpecificRoute(t *testing.T) {
	l, r := routedViaA(t)
	ctx := testCtx(t)
	for _, f := range l.families() {
		t.Run(f.name, func(t *testing.T) {
			others := []netip.Addr{f.beside, f.inRemote(1), f.inRemote(0xfffe)}
			for _, d := range append(others, f.inMore) {
				hop, err := r.Resolve(ctx, d)
				require.NoError(t, err)
				require.Equal(t, f.hopA, hop)
			}
			more := netip.MustParsePrefix(f.more)
			require.NoError(t, l.mux.AddRoute(f.more, f.gwB))
			waitHop(t, r, f.inMore, f.hopB)
			for _, d := range others {
				waitHop(t, r, d, f.hopA)
			}
			ps := r.Snapshot().Prefixes()
			assert.Contains(t, ps, more)
			assert.NotContains(t, ps, netip.MustParsePrefix(f.remote), "cut around the new route")
			assertDisjoint(t, ps)

			require.NoError(t, l.mux.DelRoute(f.more))
			waitHop(t, r, f.inMore, f.hopA)
			for _, d := range others {
				waitHop(t, r, d, f.hopA)
			}
			waitFor(t, "the pieces to merge back", func() bool {
				for _, p := range r.Snapshot().Prefixes() {
					if p.Overlaps(more) && p != netip.MustParsePrefix(f.remote) {
						return false
					}
				}
				return true
			})

			require.NoError(t, l.mux.DelRoute(f.remote))
			for _, d := range append(others, f.inMore) {
				waitFor(t, d.String()+" to become unroutable", func() bool {
					_, ok := r.Lookup(d)
					return !ok
				})
				_, err := r.Resolve(ctx, d)
				assert.ErrorIs(t, err, ErrNoRoute)
			}
			for _, p := range r.Snapshot().Prefixes() {
				assert.False(t, p.Overlaps(netip.MustParsePrefix(f.remote)), "%v outlived its route", p)
			}
			assertCounts(t, r)
		})
	}
}

// A more specific route that exists before the first lookup: the prefix
// entry learned from a destination beside it must not cover it.
func TestPrefixCarvedAroundExistingRoutes(t *testing.T) {
	l := newRouted(t)
	for _, f := range l.families() {
		require.NoError(t, l.mux.AddRoute(f.remote, f.gwA))
		require.NoError(t, l.mux.AddRoute(f.more, f.gwB))
	}
	r := startResolver(t, l.mux, Config{})
	ctx := testCtx(t)
	for _, f := range l.families() {
		t.Run(f.name, func(t *testing.T) {
			hop, err := r.Resolve(ctx, f.beside)
			require.NoError(t, err)
			assert.Equal(t, f.hopA, hop)
			_, ok := r.Lookup(f.inMore)
			assert.False(t, ok, "not answered by the entry learned beside it")
			waitHop(t, r, f.inMore, f.hopB)
			ps := r.Snapshot().Prefixes()
			assert.Contains(t, ps, netip.MustParsePrefix(f.more))
			assertDisjoint(t, ps)
		})
	}
}

// A policy rule selecting by destination inside a route's prefix splits the
// prefix like a route.
func TestPrefixCarvedAroundRules(t *testing.T) {
	l := newRouted(t)
	h := l.mux.Netlink()
	const table = 100
	require.NoError(t, l.mux.AddRoute("198.19.0.0/16", "198.18.1.2"))
	require.NoError(t, h.RouteAdd(&netlink.Route{Dst: ipnet("198.19.0.0/16"), Gw: net.ParseIP("198.18.2.2"), Table: table}))
	rule := netlink.NewRule()
	rule.Dst, rule.Table, rule.Priority, rule.Family = ipnet("198.19.9.0/24"), table, 100, unix.AF_INET
	require.NoError(t, h.RuleAdd(rule))

	r := startResolver(t, l.mux, Config{})
	f := l.families()[0]
	hop, err := r.Resolve(testCtx(t), netip.MustParseAddr("198.19.5.5"))
	require.NoError(t, err)
	assert.Equal(t, f.hopA, hop)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("198.19.0.0/21")}, r.Snapshot().Prefixes(),
		"198.19.0.0/16 cut short of the rule's 198.19.9.0/24")
	waitHop(t, r, netip.MustParseAddr("198.19.9.1"), f.hopB)
	waitHop(t, r, netip.MustParseAddr("198.19.200.1"), f.hopA)
	assertDisjoint(t, r.Snapshot().Prefixes())
	assertCounts(t, r)
}

func ipnet(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

// A neighbour change of the gateway updates the prefix entry, with no FIB
// lookup.
func TestPrefixGatewayMACChange(t *testing.T) {
	l, r := routedViaA(t)
	ctx := testCtx(t)
	for _, f := range l.families() {
		t.Run(f.name, func(t *testing.T) {
			_, err := r.Resolve(ctx, f.inRemote(1))
			require.NoError(t, err)
			resolutions := r.Stats().Resolutions
			other := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x42}
			gw := netip.MustParseAddr(f.gwA)
			require.NoError(t, l.mux.Netlink().NeighSet(&netlink.Neigh{
				LinkIndex: l.ma.Index, IP: gw.AsSlice(), HardwareAddr: other, State: netlink.NUD_PERMANENT,
			}))
			want := f.hopA
			want.DstMAC = mac(other)
			for i := 1; i < 50; i++ {
				waitHop(t, r, f.inRemote(i), want)
			}
			assert.Equal(t, resolutions, r.Stats().Resolutions, "a neighbour change needs no route lookup")

			require.NoError(t, l.mux.Netlink().NeighDel(&netlink.Neigh{LinkIndex: l.ma.Index, IP: gw.AsSlice()}))
			waitHop(t, r, f.inRemote(7), f.hopA)
		})
	}
}

// On-link destinations and destinations of a multipath route stay entries
// of their own.
func TestPrefixPerDestinationCases(t *testing.T) {
	l := newRouted(t)
	require.NoError(t, l.mux.AddMultipathRoute("198.19.0.0/16", "198.18.1.2", "198.18.2.2"))
	require.NoError(t, l.mux.AddMultipathRoute("2001:db8:100::/48", "2001:db8:1::2", "2001:db8:2::2"))
	r := startResolver(t, l.mux, Config{})
	ctx := testCtx(t)
	dsts := []string{"198.18.1.2", "198.18.2.2", "2001:db8:1::2", "2001:db8:2::2", // on-link
		"198.19.0.1", "198.19.0.2", "2001:db8:100::1", "2001:db8:100::2"} // multipath
	for _, s := range dsts {
		_, err := r.Resolve(ctx, netip.MustParseAddr(s))
		require.NoError(t, err, s)
	}
	st := r.Stats()
	assert.Equal(t, len(dsts), st.Entries)
	assert.Zero(t, st.Prefixes)
	assert.Equal(t, uint64(len(dsts)), st.Resolutions)
	assert.Equal(t, uint64(4), st.FIBMatches, "asked for the gateway routes only")
	_, ok := r.Lookup(netip.MustParseAddr("198.19.0.3"))
	assert.False(t, ok, "no prefix entry for a multipath route")
}

// With DisablePrefixCache every destination is its own entry, as before.
func TestPrefixCacheDisabled(t *testing.T) {
	l := newRouted(t)
	require.NoError(t, l.mux.AddRoute("198.19.0.0/16", "198.18.1.2"))
	r := startResolver(t, l.mux, Config{DisablePrefixCache: true})
	ctx := testCtx(t)
	f := l.families()[0]
	for i := 1; i <= 3; i++ {
		hop, err := r.Resolve(ctx, f.inRemote(i))
		require.NoError(t, err)
		assert.Equal(t, f.hopA, hop)
	}
	st := r.Stats()
	assert.Equal(t, 3, st.Entries)
	assert.Zero(t, st.Prefixes)
	assert.Zero(t, st.FIBMatches)
	_, ok := r.Lookup(f.inRemote(4))
	assert.False(t, ok)
}

// The safety nets cover prefix entries: the refresh resolves them again
// (and keeps them), the idle sweep forgets unused ones.
func TestPrefixRefreshAndIdle(t *testing.T) {
	l := newRouted(t)
	require.NoError(t, l.mux.AddRoute("198.19.0.0/16", "198.18.1.2"))
	require.NoError(t, l.mux.AddRoute("2001:db8:100::/48", "2001:db8:1::2"))
	r := startResolver(t, l.mux, Config{RefreshInterval: 30 * time.Millisecond,
		RetryInterval: 10 * time.Millisecond, IdleTimeout: time.Hour})
	ctx := testCtx(t)
	for _, f := range l.families() {
		_, err := r.Resolve(ctx, f.inRemote(1))
		require.NoError(t, err)
	}
	waitFor(t, "refreshes", func() bool { return r.Stats().Resolutions >= 10 })
	st := r.Stats()
	assert.Equal(t, 2, st.Prefixes)
	assert.Equal(t, uint64(2), st.PrefixesLearned, "refreshed in place, not learned again")
	for _, f := range l.families() {
		hop, ok := r.Lookup(f.inRemote(99))
		assert.True(t, ok)
		assert.Equal(t, f.hopA, hop)
	}

	l2 := newRouted(t)
	require.NoError(t, l2.mux.AddRoute("198.19.0.0/16", "198.18.1.2"))
	r2 := startResolver(t, l2.mux, Config{IdleTimeout: 100 * time.Millisecond, RetryInterval: 20 * time.Millisecond})
	_, err := r2.Resolve(ctx, netip.MustParseAddr("198.19.0.1"))
	require.NoError(t, err)
	require.Equal(t, 1, r2.Stats().Prefixes)
	waitFor(t, "the idle prefix to be evicted", func() bool { return r2.Stats().Entries == 0 })
	assert.NotZero(t, r2.Stats().Evictions)
	_, ok := r2.Lookup(netip.MustParseAddr("198.19.0.2"))
	assert.False(t, ok)
}

// A link going down invalidates the prefix entries leaving through it (the
// kernel drops IPv4 routes of a downed link without a route notification:
// the link notification is what tells).
func TestPrefixLinkDown(t *testing.T) {
	l, r := routedViaA(t)
	ctx := testCtx(t)
	fams := l.families()
	for _, f := range fams {
		_, err := r.Resolve(ctx, f.inRemote(1))
		require.NoError(t, err)
	}
	require.Equal(t, 2, r.Stats().Prefixes)
	h := l.mux.Netlink()
	link, err := h.LinkByIndex(l.ma.Index)
	require.NoError(t, err)
	require.NoError(t, h.LinkSetDown(link))
	for _, f := range fams {
		waitFor(t, f.name+" prefix to go with its link", func() bool {
			_, ok := r.Lookup(f.inRemote(2))
			return !ok
		})
	}
	require.NoError(t, h.LinkSetUp(link))
	// IPv6 addresses go with the link unless keep_addr_on_down is set:
	// put ours back if it went (an error says it stayed).
	_ = l.mux.AddAddr("eth0", "2001:db8:1::1/64")
	for _, f := range fams {
		// The connected routes come back with the carrier, a moment later.
		waitFor(t, f.name+" route via the link again", func() bool { return l.mux.ReplaceRoute(f.remote, f.gwA) == nil })
		waitHop(t, r, f.inRemote(3), f.hopA)
	}
	assertCounts(t, r)
}

// assertCounts checks that the entries by state add up.
func assertCounts(t *testing.T, r *Resolver) {
	t.Helper()
	st := r.Stats()
	assert.Equal(t, st.Entries, st.Resolved+st.Pending+st.Failed, "%+v", st)
	assert.LessOrEqual(t, st.Prefixes, st.Entries)
	assert.Equal(t, st.Prefixes, len(r.Snapshot().Prefixes()))
}

// Random route churn inside a cached prefix: once the changes have
// settled, every answer Lookup gives matches the kernel's own answer for
// that destination (RTM_GETROUTE without FIB match), whatever prefix
// entries the resolver learned along the way.
func TestPrefixChurnMatchesKernel(t *testing.T) {
	l, r := routedViaA(t)
	h := l.mux.Netlink()
	rng := rand.New(rand.NewPCG(9, 10))
	for _, f := range l.families() {
		t.Run(f.name, func(t *testing.T) {
			remote := netip.MustParsePrefix(f.remote)
			random := func(bits int) netip.Addr { return randAddr(rng, remote.Addr(), bits) }
			oracle := func(d netip.Addr) (Hop, bool) {
				rs, err := h.RouteGet(d.AsSlice())
				if err != nil {
					return Hop{}, false
				}
				switch gatewayOf(&rs[0]) {
				case f.hopA.Gateway:
					return f.hopA, true
				case f.hopB.Gateway:
					return f.hopB, true
				}
				t.Fatalf("unexpected route %v", rs[0])
				return Hop{}, false
			}
			var added []netip.Prefix
			for round := range 6 {
				for range 1 + rng.IntN(4) {
					if len(added) > 0 && rng.IntN(3) == 0 {
						i := rng.IntN(len(added))
						require.NoError(t, l.mux.DelRoute(added[i].String()))
						added = slices.Delete(added, i, i+1)
						continue
					}
					p := netip.PrefixFrom(random(remote.Bits()), remote.Bits()+1+rng.IntN(12)).Masked()
					if slices.Contains(added, p) {
						continue
					}
					gw := []string{f.gwA, f.gwB}[rng.IntN(2)]
					require.NoError(t, l.mux.AddRoute(p.String(), gw))
					added = append(added, p)
				}
				dsts := make([]netip.Addr, 200)
				for i := range dsts {
					dsts[i] = random(remote.Bits())
					if i%2 == 0 && len(added) > 0 { // near a route boundary
						p := added[rng.IntN(len(added))]
						dsts[i] = randAddr(rng, p.Addr(), max(remote.Bits(), p.Bits()-2))
					}
				}
				waitFor(t, "every answer to match the kernel's", func() bool {
					for _, d := range dsts {
						got, ok := r.Lookup(d)
						want, _ := oracle(d)
						if !ok || got != want {
							return false
						}
					}
					return true
				})
				ps := r.Snapshot().Prefixes()
				assertDisjoint(t, ps)
				t.Logf("round %d: %d routes inside, %d prefix entries, %+v", round, len(added), len(ps), r.Stats())
			}
			assertCounts(t, r)
		})
	}
}
