package nat

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
)

// TestPrefixes checks the compiled prefix match against netip.Prefix.Contains
// on random addresses near and inside each prefix.
func TestPrefixes(t *testing.T) {
	ps := []netip.Prefix{
		netip.MustParsePrefix("198.18.200.0/24"),
		netip.MustParsePrefix("198.19.0.0/16"),
		netip.MustParsePrefix("198.18.7.7/32"),
		netip.MustParsePrefix("2001:db8:200::/48"),
		netip.MustParsePrefix("2001:db8:1:2:3::/80"),
		netip.MustParsePrefix("2001:db8::1/128"),
	}
	c, ok := compilePrefixes(ps)
	require.True(t, ok)
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(a netip.Addr) {
		want := false
		for _, p := range ps {
			want = want || p.Contains(a)
		}
		fam, b := keyAddr(a)
		require.Equal(t, want, c.contains(fam, &b), "%v", a)
	}
	for _, p := range ps {
		base := p.Addr().AsSlice()
		for range 2000 {
			a := append([]byte(nil), base...)
			// Flip a few random bits, mostly near the prefix boundary.
			for range 1 + rng.IntN(2) {
				bit := max(0, min(len(a)*8-1, p.Bits()-3+rng.IntN(6)))
				if rng.IntN(4) == 0 {
					bit = rng.IntN(len(a) * 8)
				}
				a[bit/8] ^= 0x80 >> (bit % 8)
			}
			addr, _ := netip.AddrFromSlice(a)
			check(addr)
		}
	}
	// The families never mix: ::c612:c807 is not 198.18.200.7.
	check(netip.MustParseAddr("::c612:c807"))
	check(netip.MustParseAddr("198.18.200.7"))

	// /0 matches its family only; a v4-mapped prefix is its IPv4 prefix.
	all4, ok := compilePrefixes([]netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::ffff:198.18.0.0/112")})
	require.True(t, ok)
	fam, b := keyAddr(netip.MustParseAddr("203.0.113.1"))
	require.True(t, all4.contains(fam, &b))
	fam, b = keyAddr(netip.MustParseAddr("2001:db8::1"))
	require.False(t, all4.contains(fam, &b))
	require.Equal(t, uint64(0xc6120000)<<32, all4[1].hi)

	_, ok = compilePrefixes([]netip.Prefix{{}})
	require.False(t, ok)
	_, ok = compilePrefixes([]netip.Prefix{netip.MustParsePrefix("::ffff:0:0/95")})
	require.False(t, ok)
	var none prefixes
	require.False(t, none.contains(fam, &b))
}

func TestLocals(t *testing.T) {
	l, err := NewDIPs([]DIP{
		{VNI: 1, Addr: netip.MustParseAddr("198.19.0.1")},
		{VNI: 1, Addr: netip.MustParseAddr("::ffff:198.19.0.1")}, // the same, mapped
		{VNI: 2, Addr: netip.MustParseAddr("198.19.0.1")},
		{VNI: 1, Addr: netip.MustParseAddr("2001:db8::1")},
	})
	require.NoError(t, err)
	require.Equal(t, 3, l.Len())
	require.Len(t, l.List(), 3)
	require.True(t, l.Contains(1, netip.MustParseAddr("198.19.0.1")))
	require.True(t, l.Contains(2, netip.MustParseAddr("::ffff:198.19.0.1")))
	require.False(t, l.Contains(3, netip.MustParseAddr("198.19.0.1")))
	require.False(t, l.Contains(1, netip.MustParseAddr("::c613:1")), "IPv4-compatible is IPv6")
	require.True(t, l.Contains(1, netip.MustParseAddr("2001:db8::1")))

	for _, bad := range []DIP{
		{VNI: 1},
		{VNI: 1 << 24, Addr: netip.MustParseAddr("198.19.0.1")},
		{VNI: 1, Addr: netip.MustParseAddr("fe80::1%eth0")},
	} {
		_, err := NewDIPs([]DIP{bad})
		require.ErrorIs(t, err, ErrInvalidLocal, "%+v", bad)
	}
	var nilL *DIPs
	require.False(t, nilL.Contains(1, netip.MustParseAddr("198.19.0.1")))
	require.Zero(t, nilL.Len())
	require.Nil(t, nilL.List())
}

func TestConfigErrors(t *testing.T) {
	tab, err := NewTable(TableConfig{Capacity: 64})
	require.NoError(t, err)
	rules := flow.NewRules()
	for name, cfg := range map[string]Config{
		"no rules":  {Table: tab},
		"no table":  {Rules: rules},
		"bad infra": {Rules: rules, Table: tab, Infra: []netip.Prefix{{}}},
		"bad local": {Rules: rules, Table: tab, DIPs: []DIP{{VNI: 1}}},
	} {
		_, err := New(cfg)
		require.Error(t, err, name)
	}
	for name, cfg := range map[string]TableConfig{
		"no capacity":        {},
		"negative ports":     {Capacity: 1, PortCapacity: -1},
		"timeout too short":  {Capacity: 1, Timeouts: flow.Timeouts{UDP: 1}},
		"negative ipv6 size": {Capacity: 1, IPv6Capacity: -1},
	} {
		_, err := NewTable(cfg)
		require.True(t, errors.Is(err, ErrTableConfig), "%s: %v", name, err)
	}
	tr, err := New(Config{Rules: rules, Table: tab})
	require.NoError(t, err)
	tr.SetDIPs(nil)
	require.Zero(t, tr.DIPs().Len())
	require.Same(t, tab, tr.Table())
}

// TestView checks the precomputed indexes on a small configuration: local
// backends per rule, the stateless index (counts and translations) and the
// fragment maps, and that a backend whose family differs from its VIP's is
// never local.
func TestView(t *testing.T) {
	vip := netip.MustParseAddr("198.18.100.1")
	vip2 := netip.MustParseAddr("198.18.100.2")
	d1 := netip.MustParseAddr("198.19.0.1")
	d6 := netip.MustParseAddr("2001:db8::1")
	remote := netip.MustParseAddr("198.19.0.99")
	snap, err := flow.NewSnapshot(1, []flow.Rule{
		{Name: "r0", VIP: flow.VIP{Addr: vip, Proto: flow.ProtoTCP, Port: 80, VNI: 5}, Backends: []flow.Backend{
			{Name: "a", Addr: d1, Port: 8080, Weight: 1},
			{Name: "b", Addr: remote, Port: 8080, Weight: 1},
			{Name: "c", Addr: d6, Port: 8080, Weight: 1}, // family differs
		}},
		{Name: "r1", VIP: flow.VIP{Addr: vip2, Proto: flow.ProtoTCP, VNI: 5}, Backends: []flow.Backend{
			{Name: "a", Addr: d1, Weight: 1},
		}},
		{Name: "r2", VIP: flow.VIP{Addr: vip2, Proto: flow.ProtoUDP, VNI: 5}, Backends: []flow.Backend{
			{Name: "a", Addr: d1, Port: 9000, Weight: 1},
		}},
	}, nil)
	require.NoError(t, err)
	loc := MustDIPs(DIP{VNI: 5, Addr: d1}, DIP{VNI: 5, Addr: d6})
	v := buildView(snap, loc)
	require.Equal(t, 1, v.skipped)
	require.Len(t, v.rules[0].local, 1)
	require.EqualValues(t, 0, v.rules[0].local[0].idx)
	require.False(t, v.rules[0].local[0].needPort)
	require.True(t, v.rules[2].local[0].needPort)
	require.Nil(t, v.local(snap.Rules()[0].Backends[1].ID), "remote")
	require.Nil(t, v.local(0))
	require.Nil(t, v.local(1<<31))
	for _, r := range snap.Rules() {
		for j := range v.rules[r.ID].local {
			lb := &v.rules[r.ID].local[j]
			e := v.local(lb.id)
			require.NotNil(t, e)
			require.Same(t, lb, e.lb)
			require.Same(t, r, e.rule)
		}
	}

	key := func(proto uint8, sport uint16) flow.Key {
		return flow.KeyFrom(5, proto, netip.AddrPortFrom(d1, sport), netip.MustParseAddrPort("198.18.0.1:1000"))
	}
	// 8080: r0 exactly and r1 (all ports, preserved): two rules.
	k := key(flow.ProtoTCP, 8080)
	_, n := v.statelessLookup(&k)
	require.Equal(t, 2, n)
	k = key(flow.ProtoTCP, 22)
	e, n := v.statelessLookup(&k)
	require.Equal(t, 1, n)
	require.Equal(t, vportSource, e.mode)
	k = key(flow.ProtoUDP, 9000)
	e, n = v.statelessLookup(&k)
	require.Equal(t, 1, n)
	require.Equal(t, vportUnknown, e.mode)

	fam, a := keyAddr(d1)
	c, ok := v.fragOut[fragOutKey{dip: a, vni: 5, proto: flow.ProtoTCP, fam: fam}]
	require.True(t, ok)
	require.True(t, c.ambiguous, "d1 serves two VIP addresses over TCP")
	c, ok = v.fragOut[fragOutKey{dip: a, vni: 5, proto: flow.ProtoUDP, fam: fam}]
	require.True(t, ok)
	require.False(t, c.ambiguous)
}
