package flow

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVIPAddrs: HasVIPAddr finds every VIP address whatever its VNI,
// protocol and port; VIPAddrVNI gives the VNI of an address whose rules
// share one and nothing for an address in two VNIs or no VIP's;
// SingleVNI says when every rule is in one VNI. Also after a health
// change (ReplaceRules), and with many addresses (long probe chains).
func TestVIPAddrs(t *testing.T) {
	key := func(a string) Key {
		d := addr(a)
		return KeyFrom(0, ProtoTCP, netip.AddrPortFrom(d, 1), netip.AddrPortFrom(d, 80))
	}
	type want struct {
		addr string
		any  bool
		vni  uint32
		ok   bool
	}
	many := make([]Rule, 0, 700)
	var manyWant []want
	for i := range 700 {
		a := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		if i%3 == 0 {
			a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)})
		}
		many = append(many, Rule{Name: a.String(), VIP: VIP{Addr: a, Proto: ProtoTCP, Port: 80, VNI: uint32(1 + i%50)}, Backends: pool(1)})
		manyWant = append(manyWant, want{a.String(), true, uint32(1 + i%50), true})
	}
	manyWant = append(manyWant, want{"198.18.9.9", false, 0, false}, want{"2001:db8::1:0", false, 0, false}, want{"0.0.0.0", false, 0, false})
	tests := []struct {
		name   string
		rules  []Rule
		single bool
		vni    uint32
		want   []want
	}{
		{"none", nil, false, 0, []want{{"198.18.0.10", false, 0, false}}},
		{"two tenants", testRules(), false, 0, []want{
			{"198.18.0.10", true, 0, false}, // VNI 0 and VNI 5
			{"2001:db8::10", true, 0, true},
			{"198.18.0.20", true, 0, true}, // a mapped address, unmapped
			{"198.18.0.11", false, 0, false},
		}},
		{"one tenant", []Rule{rule("a", 7, ProtoTCP, "198.18.0.10:80", pool(1)), rule("b", 7, ProtoUDP, "[2001:db8::10]:53", pool(1))}, true, 7, []want{
			{"198.18.0.10", true, 7, true},
			{"2001:db8::10", true, 7, true},
			{"2001:db8::11", false, 0, false},
		}},
		{"many", many, false, 0, manyWant},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, s := range snapshotAndReplaced(t, tt.rules, nil) {
				vni, single := s.SingleVNI()
				require.Equal(t, tt.single, single, "snapshot %d", i)
				require.Equal(t, tt.vni, vni, "snapshot %d", i)
				for _, w := range tt.want {
					k := key(w.addr)
					require.Equal(t, w.any, s.HasVIPAddr(&k.Dst, k.Family), "snapshot %d: %s", i, w.addr)
					v, ok := s.VIPAddrVNI(&k.Dst, k.Family)
					require.Equal(t, fmt.Sprint(w.vni, w.ok), fmt.Sprint(v, ok), "snapshot %d: %s", i, w.addr)
				}
			}
		})
	}
	s, err := NewSnapshot(1, testRules(), nil)
	require.NoError(t, err)
	k := key("2001:db8::10")
	require.Zero(t, testing.AllocsPerRun(100, func() { s.VIPAddrVNI(&k.Dst, k.Family) }))
}

// TestVIPAddrFilter: HasVIPAddr's filter never hides a VIP address (every
// address of the set is found, and for random addresses the answer is the
// set's), and it answers "no" without probing the set for nearly every
// address that is no VIP's: at most 2% probe with 3 addresses (one cache
// line of filter) and at most 6% with 2,000 (32 bits per address).
func TestVIPAddrFilter(t *testing.T) {
	rnd := rand.New(rand.NewPCG(9, 9))
	for _, tc := range []struct {
		name   string
		n      int
		maxHit float64 // share of non-VIP addresses whose bit is set
	}{
		{"3 addresses", 3, 0.02},
		{"40 addresses", 40, 0.06},
		{"2000 addresses", 2000, 0.06},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rules []Rule
			for i := range tc.n {
				a := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
				if i%4 == 3 {
					a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 1, 14: byte(i >> 8), 15: byte(i)})
				}
				rules = append(rules, Rule{Name: a.String(), VIP: VIP{Addr: a, Proto: ProtoTCP, Port: 80}, Backends: pool(1)})
			}
			s, err := NewSnapshot(1, rules, nil)
			require.NoError(t, err)
			for _, r := range rules {
				k := KeyFrom(0, ProtoTCP, netip.AddrPortFrom(r.VIP.Addr, 1), netip.AddrPortFrom(r.VIP.Addr, 80))
				require.True(t, s.HasVIPAddr(&k.Src, k.Family), "%v", r.VIP.Addr)
			}
			const tries = 20_000
			hits := 0
			for i := range tries {
				var a netip.Addr
				if i%2 == 0 {
					a = netip.AddrFrom4([4]byte{198, 18, byte(rnd.Uint32()), byte(rnd.Uint32())})
				} else {
					var b [16]byte
					b[0], b[1], b[2], b[3] = 0x20, 0x01, 0x0d, 0xb8
					for j := 8; j < 16; j++ {
						b[j] = byte(rnd.Uint32())
					}
					a = netip.AddrFrom16(b)
				}
				k := KeyFrom(0, ProtoTCP, netip.AddrPortFrom(a, 1), netip.AddrPortFrom(a, 80))
				require.Equal(t, s.findAddr(&k.Src, k.Family) != nil, s.HasVIPAddr(&k.Src, k.Family), "%v", a)
				if h := vipBitsHash(&k.Src, s.vipShift); s.vipBits[h>>6]&(1<<(h&63)) != 0 {
					hits++
				}
			}
			require.LessOrEqual(t, float64(hits)/tries, tc.maxHit, "%d of %d non-VIP addresses probe the set", hits, tries)
		})
	}
}

// TestSnapshotAddrs: the addresses NewSnapshotAddrs is given beside the
// rules are VIP addresses for HasVIPAddr (also after ReplaceRules, also
// with no rule, many of them, one that is also a rule's or given twice),
// and for nothing else: VIPAddrVNI, IsVIPAddr, Lookup and the uplink
// lookup answer for the rules only, and SingleVNI is the rules'. An
// invalid address is refused.
func TestSnapshotAddrs(t *testing.T) {
	key := func(a string) Key {
		d := addr(a)
		return KeyFrom(3, ProtoTCP, netip.AddrPortFrom(d, 1), netip.AddrPortFrom(d, 80))
	}
	var many []netip.Addr
	for i := range 500 {
		many = append(many, netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}))
	}
	one := []Rule{rule("a", 3, ProtoTCP, "198.18.0.10:80", pool(1))}
	tests := []struct {
		name  string
		rules []Rule
		addrs []netip.Addr
		in    []string // HasVIPAddr
		out   []string // not
	}{
		{"no rule", nil, []netip.Addr{addr("198.18.0.20"), addr("2001:db8::20")}, []string{"198.18.0.20", "2001:db8::20"}, []string{"198.18.0.10", "2001:db8::21"}},
		{"beside a rule", one, []netip.Addr{addr("198.18.0.20"), addr("::ffff:198.18.0.21"), addr("198.18.0.20"), addr("198.18.0.10")},
			[]string{"198.18.0.10", "198.18.0.20", "198.18.0.21"}, []string{"198.18.0.22"}},
		{"many", one, many, []string{"198.18.0.10", "198.19.0.0", "198.19.1.243"}, []string{"198.19.1.244", "198.18.0.11"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, s := range snapshotAndReplaced(t, tt.rules, tt.addrs) {
				require.Equal(t, len(tt.rules), s.Len())
				vni, single := s.SingleVNI()
				require.Equal(t, fmt.Sprint(len(tt.rules) > 0, len(tt.rules) > 0), fmt.Sprint(single, vni == 3), "snapshot %d", i)
				for _, a := range tt.in {
					k := key(a)
					require.True(t, s.HasVIPAddr(&k.Dst, k.Family), "snapshot %d: %s", i, a)
					isRule := a == "198.18.0.10" && len(tt.rules) > 0
					v, ok := s.VIPAddrVNI(&k.Dst, k.Family)
					require.Equal(t, fmt.Sprint(isRule, isRule), fmt.Sprint(ok, v == 3), "snapshot %d: VIPAddrVNI(%s)", i, a)
					require.Equal(t, isRule, s.IsVIPAddr(&k), "snapshot %d: IsVIPAddr(%s)", i, a)
					require.Equal(t, isRule, s.Lookup(&k) != nil, "snapshot %d: Lookup(%s)", i, a)
					require.Equal(t, isRule, s.LookupUplink(&k) != nil, "snapshot %d: LookupUplink(%s)", i, a)
				}
				for _, a := range tt.out {
					k := key(a)
					require.False(t, s.HasVIPAddr(&k.Dst, k.Family), "snapshot %d: %s", i, a)
				}
			}
		})
	}
	_, err := NewSnapshotAddrs(1, one, []netip.Addr{{}}, nil)
	require.ErrorIs(t, err, ErrInvalidRule)
}

// snapshotAndReplaced returns a snapshot of rules (and addrs), and when
// there are rules, that snapshot with its first rule replaced by itself
// (ReplaceRules: a health change), which must answer alike.
func snapshotAndReplaced(t *testing.T, rules []Rule, addrs []netip.Addr) []*Snapshot {
	t.Helper()
	s, err := NewSnapshotAddrs(1, rules, addrs, nil)
	require.NoError(t, err)
	snaps := []*Snapshot{s}
	if len(rules) > 0 {
		r, err := s.ReplaceRules(2, rules[:1])
		require.NoError(t, err)
		snaps = append(snaps, r)
	}
	return snaps
}
