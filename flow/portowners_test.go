package flow

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPortOwners(t *testing.T) {
	vip := netip.MustParseAddr("198.18.100.1")
	vip6 := netip.MustParseAddr("2001:db8:100::1")
	// An IPv6 address whose first four bytes are the IPv4 VIP's: a
	// Key of either family must not find the other's.
	twin := netip.AddrFrom16([16]byte{198, 18, 100, 1})
	vip2 := netip.MustParseAddr("198.18.100.2")
	o := func(i byte) PortOwner {
		return PortOwner{DIP: netip.AddrFrom4([4]byte{198, 19, 1, i}), Host: netip.AddrFrom4([4]byte{198, 19, 0, i}), VNI: 100}
	}
	tab, err := NewPortOwners([]PortAllocation{
		{VIP: vip, First: 1024, Last: 1087, Owner: o(1)},
		{VIP: vip, First: 1088, Last: 1215, Owner: o(2)},
		{VIP: vip, First: 4096, Last: 8191, Owner: o(3)},
		{VIP: vip6, First: 1024, Last: 2047, Owner: o(4)},
		// A short range at a well-aligned start: the blocks must be
		// the range's size, not its start's alignment.
		{VIP: vip2, First: 8192, Last: 8223, Owner: o(5)},
	})
	require.NoError(t, err)
	for _, tc := range []struct {
		vip  netip.Addr
		port uint16
		want byte // 0: none
	}{
		{vip, 1023, 0}, {vip, 1024, 1}, {vip, 1087, 1}, {vip, 1088, 2}, {vip, 1215, 2}, {vip, 1216, 0},
		{vip, 4095, 0}, {vip, 4096, 3}, {vip, 8191, 3}, {vip, 8192, 0}, {vip, 65535, 0}, {vip, 0, 0},
		{vip6, 1024, 4}, {vip6, 2048, 0}, {twin, 1024, 0}, {vip2, 1024, 0},
		{vip2, 8191, 0}, {vip2, 8192, 5}, {vip2, 8223, 5}, {vip2, 8224, 0}, {netip.MustParseAddr("198.18.100.3"), 1024, 0},
	} {
		got, ok := tab.LookupAddr(tc.vip, tc.port)
		if tc.want == 0 {
			assert.False(t, ok, "%v:%d", tc.vip, tc.port)
			continue
		}
		assert.True(t, ok, "%v:%d", tc.vip, tc.port)
		assert.Equal(t, o(tc.want), got, "%v:%d", tc.vip, tc.port)
		// And from a packet's key.
		client := netip.MustParseAddr("198.51.100.1")
		if tc.vip.Is6() {
			client = netip.MustParseAddr("2001:db8::9")
		}
		k := KeyFrom(0, ProtoTCP, netip.AddrPortFrom(client, 80), netip.AddrPortFrom(tc.vip, tc.port))
		got, ok = tab.Lookup(&k)
		assert.True(t, ok)
		assert.Equal(t, o(tc.want), got)
	}
	_, err = NewPortOwners([]PortAllocation{{VIP: vip, First: 1024, Last: 2047}, {VIP: vip, First: 2000, Last: 3000}})
	assert.ErrorContains(t, err, "overlap")
	var none *PortOwners
	_, ok := none.LookupAddr(vip, 1024)
	assert.False(t, ok)
	k := KeyFrom(0, ProtoTCP, netip.MustParseAddrPort("198.51.100.1:80"), netip.AddrPortFrom(vip, 1024))
	assert.Equal(t, -1, none.LookupIndex(&k))
	assert.Zero(t, none.Len())
}

// TestPortOwnersAgainstModel: random non-overlapping allocations of
// random sizes, every port checked against a plain list.
func TestPortOwnersAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	vip := netip.MustParseAddr("198.18.100.1")
	for round := range 20 {
		var allocs []PortAllocation
		for p := 1 + r.IntN(100); p < 65000; {
			n := 1 + r.IntN(300)
			if r.IntN(3) > 0 {
				allocs = append(allocs, PortAllocation{VIP: vip, First: uint16(p), Last: uint16(min(p+n-1, 65535)),
					Owner: PortOwner{VNI: uint32(len(allocs) + 1)}})
			}
			p += n + r.IntN(50)
		}
		tab, err := NewPortOwners(allocs)
		require.NoError(t, err)
		for port := range 65536 {
			want := uint32(0)
			for _, a := range allocs {
				if uint16(port) >= a.First && uint16(port) <= a.Last {
					want = a.Owner.VNI
				}
			}
			got, ok := tab.LookupAddr(vip, uint16(port))
			if ok != (want != 0) || got.VNI != want {
				t.Fatalf("round %d port %d: got %v %v, want %d", round, port, got, ok, want)
			}
			// LookupIndex names the same allocation, in the table's
			// order (by port within an address).
			k := KeyFrom(0, ProtoUDP, netip.MustParseAddrPort("198.51.100.1:53"), netip.AddrPortFrom(vip, uint16(port)))
			switch i := tab.LookupIndex(&k); {
			case want == 0 && i != -1, want != 0 && (i < 0 || i >= tab.Len() || tab.Owner(i).VNI != want):
				t.Fatalf("round %d port %d: LookupIndex %d, want the allocation of owner %d", round, port, i, want)
			}
		}
	}
}

func TestPortOwnersNoAllocs(t *testing.T) {
	tab, err := NewPortOwners([]PortAllocation{{VIP: netip.MustParseAddr("198.18.100.1"), First: 1024, Last: 2047}})
	require.NoError(t, err)
	k := KeyFrom(0, ProtoTCP, netip.MustParseAddrPort("198.51.100.1:80"), netip.MustParseAddrPort("198.18.100.1:1500"))
	assert.Zero(t, testing.AllocsPerRun(100, func() { tab.Lookup(&k) }))
	assert.Zero(t, testing.AllocsPerRun(100, func() { tab.LookupIndex(&k) }))
}

func BenchmarkPortOwners(b *testing.B) {
	var allocs []PortAllocation
	for v := range 64 {
		vip := netip.AddrFrom4([4]byte{198, 18, 100, byte(v)})
		for p := 1024; p+63 <= 65535; p += 64 {
			allocs = append(allocs, PortAllocation{VIP: vip, First: uint16(p), Last: uint16(p + 63), Owner: PortOwner{VNI: uint32(p)}})
		}
	}
	tab, err := NewPortOwners(allocs)
	require.NoError(b, err)
	keys := make([]Key, 1024)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range keys {
		vip := netip.AddrFrom4([4]byte{198, 18, 100, byte(r.IntN(64))})
		keys[i] = KeyFrom(0, ProtoTCP, netip.MustParseAddrPort("198.51.100.1:80"), netip.AddrPortFrom(vip, uint16(1024+r.IntN(64000))))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		tab.Lookup(&keys[i&1023])
	}
	b.ReportMetric(float64(len(allocs)), "allocations")
}
