package flow

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// oneVNIRules are rules whose addresses each belong to one VNI (what a
// Mux's plan allows): exact ports, all-ports fallbacks, both families.
func oneVNIRules() []Rule {
	return []Rule{
		rule("web", 100, ProtoTCP, "198.18.0.10:80", pool(3)),
		rule("web-any", 100, ProtoTCP, "198.18.0.10:0", pool(2)),
		rule("dns", 100, ProtoUDP, "198.18.0.10:53", pool(2)),
		rule("other", 200, ProtoTCP, "198.18.0.11:80", pool(1)),
		rule("web6", 300, ProtoTCP, "[2001:db8::10]:443", pool(3)),
		rule("udp6-any", 300, ProtoUDP, "[2001:db8::10]:0", pool(1)),
	}
}

// TestLookupUplink: without the key's VNI, the uplink index finds the
// rule Lookup finds with the VIP's VNI (exact port first, then all
// ports), before and after a health change (ReplaceRules); it answers
// nothing when an address is in two VNIs.
func TestLookupUplink(t *testing.T) {
	s1, err := NewSnapshot(1, oneVNIRules(), nil)
	require.NoError(t, err)
	s2, err := s1.ReplaceRules(2, []Rule{rule("web", 100, ProtoTCP, "198.18.0.10:80", pool(3))})
	require.NoError(t, err)
	for _, tc := range []struct {
		proto uint8
		dst   string
		want  string // "" for none
	}{
		{ProtoTCP, "198.18.0.10:80", "web"},
		{ProtoTCP, "198.18.0.10:8080", "web-any"},
		{ProtoUDP, "198.18.0.10:53", "dns"},
		{ProtoUDP, "198.18.0.10:54", ""},
		{ProtoTCP, "198.18.0.11:80", "other"},
		{ProtoTCP, "198.18.0.11:81", ""},
		{ProtoTCP, "198.18.0.12:80", ""},
		{ProtoTCP, "[2001:db8::10]:443", "web6"},
		{ProtoUDP, "[2001:db8::10]:9", "udp6-any"},
		{ProtoTCP, "[2001:db8::10]:80", ""},
	} {
		for i, s := range []*Snapshot{s1, s2} {
			dst := netip.MustParseAddrPort(tc.dst)
			src := netip.MustParseAddrPort("198.19.0.1:1000")
			if dst.Addr().Is6() {
				src = netip.MustParseAddrPort("[2001:db8:1::1]:1000")
			}
			k := KeyFrom(0, tc.proto, src, dst)
			r := s.LookupUplink(&k)
			if tc.want == "" {
				require.Nil(t, r, "snapshot %d: %s", i, tc.dst)
				continue
			}
			require.NotNil(t, r, "snapshot %d: %s", i, tc.dst)
			require.Equal(t, tc.want, r.Name, "snapshot %d: %s", i, tc.dst)
			require.Same(t, s.Rule(r.ID), r, "snapshot %d: the snapshot's own rule", i)
			k.VNI = r.VIP.VNI
			require.Same(t, s.Lookup(&k), r, "snapshot %d: %s: what Lookup finds with the VNI", i, tc.dst)
		}
	}
	// An address in two VNIs: no uplink answer at all.
	s3, err := NewSnapshot(3, testRules(), nil)
	require.NoError(t, err)
	k := KeyFrom(0, ProtoUDP, netip.MustParseAddrPort("198.19.0.1:1000"), netip.MustParseAddrPort("198.18.0.10:53"))
	require.Nil(t, s3.LookupUplink(&k))
	require.Zero(t, testing.AllocsPerRun(100, func() { s1.LookupUplink(&k) }))
}

// TestLookupHint: whatever the hint — nil, the right rule, another rule
// of the snapshot, an all-ports rule where an exact one exists, the same
// VIP's rule from an older snapshot — LookupHint returns what Lookup
// returns, for random keys over the rules' addresses, ports and VNIs.
func TestLookupHint(t *testing.T) {
	old, err := NewSnapshot(1, testRules(), nil)
	require.NoError(t, err)
	s, err := NewSnapshot(2, testRules(), old) // the same VIPs: old's rules are other *Rule values
	require.NoError(t, err)
	hints := []*Rule{nil}
	hints = append(hints, s.Rules()...)
	hints = append(hints, old.Rules()...)
	addrs := []string{"198.18.0.10", "198.18.0.20", "198.18.0.11", "2001:db8::10"}
	rnd := rand.New(rand.NewPCG(1, 2))
	hit := 0
	for range 20_000 {
		a := netip.MustParseAddr(addrs[rnd.IntN(len(addrs))])
		src := netip.MustParseAddr("198.19.0.1")
		if a.Is6() {
			src = netip.MustParseAddr("2001:db8:1::1")
		}
		proto := []uint8{ProtoTCP, ProtoUDP}[rnd.IntN(2)]
		port := []uint16{0, 53, 80, 443, 8080}[rnd.IntN(5)]
		k := KeyFrom([]uint32{0, 5, 7}[rnd.IntN(3)], proto, netip.AddrPortFrom(src, 1000), netip.AddrPortFrom(a, port))
		h := hints[rnd.IntN(len(hints))]
		want := s.Lookup(&k)
		got := s.LookupHint(&k, h)
		require.Same(t, want, got, "key %v, hint %v", k, h)
		if h != nil && h == want {
			hit++
		}
	}
	require.NotZero(t, hit, "some hints must be right")
	k := KeyFrom(0, ProtoTCP, netip.MustParseAddrPort("198.19.0.1:1000"), netip.MustParseAddrPort("198.18.0.10:80"))
	r := s.Lookup(&k)
	require.Zero(t, testing.AllocsPerRun(100, func() { s.LookupHint(&k, r) }))
}
