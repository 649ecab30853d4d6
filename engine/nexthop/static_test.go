package nexthop_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/xdplb/xdplb/engine/nexthop"
)

func TestStatic(t *testing.T) {
	a, b, c := netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("198.18.1.3")
	ha, hd := nexthop.Hop{IfIndex: 2, DstMAC: [6]byte{2, 0, 0, 0, 0, 1}}, nexthop.Hop{IfIndex: 3, DstMAC: [6]byte{2, 0, 0, 0, 0, 2}}
	cases := []struct {
		name string
		s    nexthop.Static
		dst  netip.Addr
		want nexthop.Hop
		ok   bool
	}{
		{"listed", nexthop.Static{Hops: map[netip.Addr]nexthop.Hop{a: ha}}, a, ha, true},
		{"not listed, no default", nexthop.Static{Hops: map[netip.Addr]nexthop.Hop{a: ha}}, b, nexthop.Hop{}, false},
		{"not listed, default", nexthop.Static{Hops: map[netip.Addr]nexthop.Hop{a: ha}, Default: hd}, b, hd, true},
		{"listed beats default", nexthop.Static{Hops: map[netip.Addr]nexthop.Hop{a: ha}, Default: hd}, a, ha, true},
		{"listed zero hop: a miss despite the default", nexthop.Static{Hops: map[netip.Addr]nexthop.Hop{c: {}}, Default: hd}, c, nexthop.Hop{}, false},
		{"zero Static", nexthop.Static{}, a, nexthop.Hop{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, ok := tc.s.Lookup(tc.dst)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, h)
			assert.Equal(t, uint64(1), tc.s.Version())
		})
	}
}
