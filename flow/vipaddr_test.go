package flow

import (
	"fmt"
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
			s, err := NewSnapshot(1, tt.rules, nil)
			require.NoError(t, err)
			snaps := []*Snapshot{s}
			if len(tt.rules) > 0 {
				r, err := s.ReplaceRules(2, tt.rules[:1])
				require.NoError(t, err)
				snaps = append(snaps, r)
			}
			for i, s := range snaps {
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
