package encap_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/header"
)

func TestNewEndpointsErrors(t *testing.T) {
	ok := encap.Endpoint{VNI: 1, MAC: dipMAC, Addrs: []netip.Addr{dip4}, Name: "a"}
	with := func(f func(*encap.Endpoint)) encap.Endpoint { l := ok; f(&l); return l }
	addrs := func(a ...netip.Addr) func(*encap.Endpoint) { return func(l *encap.Endpoint) { l.Addrs = a } }
	mapped := netip.AddrFrom16(dip4.As16())
	other6 := netip.MustParseAddr("2001:db8:10::6")
	cases := []struct {
		name   string
		locals []encap.Endpoint
		want   string
	}{
		{"VNI too big", []encap.Endpoint{with(func(l *encap.Endpoint) { l.VNI = 1 << 24 })}, `0 ("a"): VNI 16777216 does not fit 24 bits`},
		{"no MAC", []encap.Endpoint{with(func(l *encap.Endpoint) { l.MAC = header.MAC{} })}, `0 ("a"): no MAC address`},
		{"multicast MAC", []encap.Endpoint{with(func(l *encap.Endpoint) { l.MAC = header.MAC{1, 0, 0x5e, 0, 0, 1} })}, "MAC 01:00:5e:00:00:01 is a group address"},
		{"no addresses", []encap.Endpoint{with(addrs())}, `0 ("a"): no address`},
		{"invalid address", []encap.Endpoint{with(addrs(netip.Addr{}))}, `0 ("a"): no address`},
		{"invalid second address", []encap.Endpoint{with(addrs(dip4, netip.Addr{}))}, `0 ("a"): no address`},
		{"zone", []encap.Endpoint{with(addrs(netip.MustParseAddr("fe80::1%eth0")))}, "address fe80::1%eth0 has a zone"},
		{"three addresses", []encap.Endpoint{with(addrs(dip4, dip6, other6))}, "3 addresses; an endpoint has at most one IPv4 and one IPv6 address"},
		{"two IPv6", []encap.Endpoint{with(addrs(dip6, other6))}, "two IPv6 addresses, 2001:db8:10::5 and 2001:db8:10::6; an endpoint has at most one per family"},
		{"two IPv4", []encap.Endpoint{with(addrs(dip4, netip.MustParseAddr("198.19.10.6")))}, "two IPv4 addresses, 198.19.10.5 and 198.19.10.6"},
		{"two IPv4, one mapped", []encap.Endpoint{with(addrs(dip4, mapped))}, "two IPv4 addresses, 198.19.10.5 and 198.19.10.5"},
		{"duplicate VNI and MAC", []encap.Endpoint{ok, with(func(l *encap.Endpoint) { l.Addrs, l.Name = []netip.Addr{dip6}, "b" })},
			`1 ("b"): VNI 1 MAC 02:00:00:00:aa:01 already used by 0 ("a")`},
		{"duplicate VNI and address", []encap.Endpoint{ok, with(func(l *encap.Endpoint) { l.MAC, l.Name = hopMAC, "b" })},
			`1 ("b"): VNI 1 address 198.19.10.5 already used by 0 ("a")`},
		{"duplicate address, mapped", []encap.Endpoint{ok, with(func(l *encap.Endpoint) { l.MAC, l.Addrs = hopMAC, []netip.Addr{mapped} })},
			"VNI 1 address 198.19.10.5 already used by 0"},
		{"duplicate second address", []encap.Endpoint{with(addrs(dip4, dip6)), with(func(l *encap.Endpoint) { l.MAC, l.Addrs = hopMAC, []netip.Addr{dip6} })},
			"VNI 1 address 2001:db8:10::5 already used by 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := encap.NewEndpoints(tc.locals)
			require.ErrorIs(t, err, encap.ErrInvalidLocal)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// The same MAC and address in another VNI is another endpoint.
	ls, err := encap.NewEndpoints([]encap.Endpoint{ok, with(func(l *encap.Endpoint) { l.VNI = 2 })})
	require.NoError(t, err)
	assert.Equal(t, 2, ls.Len())
}

// TestLocalsDualStack: a dual-stack endpoint is one (VNI, MAC) entry with
// both addresses, unmapped and copied.
func TestLocalsDualStack(t *testing.T) {
	in := []encap.Endpoint{
		{VNI: 1, MAC: dipMAC, Addrs: []netip.Addr{netip.AddrFrom16(dip4.As16()), dip6}, OutPort: 3, Name: "vm"},
		{VNI: 1, MAC: hopMAC, Addrs: []netip.Addr{netip.MustParseAddr("2001:db8:10::6")}, OutPort: 4, Name: "v6only"},
	}
	ls, err := encap.NewEndpoints(in)
	require.NoError(t, err)
	in[0].Addrs[1] = netip.Addr{} // NewEndpoints copied
	require.Equal(t, 2, ls.Len())
	i, ok := ls.Lookup(1, dipMAC)
	require.True(t, ok)
	assert.Equal(t, []netip.Addr{dip4, dip6}, ls.At(i).Addrs)
	assert.EqualValues(t, 3, ls.At(i).OutPort)
	i, ok = ls.Lookup(1, hopMAC)
	require.True(t, ok)
	assert.Equal(t, "v6only", ls.At(i).Name)
}

func TestLocalsLookup(t *testing.T) {
	var in []encap.Endpoint
	for i := range 1000 {
		in = append(in, encap.Endpoint{
			VNI:     uint32(i % 7),
			MAC:     header.MAC{2, 0, 0, byte(i >> 16), byte(i >> 8), byte(i)},
			Addrs:   []netip.Addr{netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})},
			OutPort: uint16(i),
			Name:    fmt.Sprint("vm", i),
		})
	}
	ls, err := encap.NewEndpoints(in)
	require.NoError(t, err)
	in[0].Name = "changed" // NewEndpoints copied
	require.Equal(t, 1000, ls.Len())
	for i, l := range in {
		j, ok := ls.Lookup(l.VNI, l.MAC)
		require.True(t, ok, "local %d", i)
		require.Equal(t, i, j)
		assert.Equal(t, uint16(i), ls.At(j).OutPort)
		_, ok = ls.Lookup(l.VNI+1, l.MAC)
		assert.False(t, ok, "local %d in the wrong VNI", i)
	}
	assert.Equal(t, "vm0", ls.At(0).Name)
	assert.Len(t, ls.All(), 1000)
	_, ok := ls.Lookup(0, header.MAC{2, 0, 0, 9, 9, 9})
	assert.False(t, ok)

	var none *encap.Endpoints
	_, ok = none.Lookup(0, dipMAC)
	assert.False(t, ok)
	assert.Zero(t, none.Len())
	assert.Nil(t, none.All())
}

// TestLocalsOf: a later stage finds the endpoint Decap chose even when the
// table was swapped in between.
func TestLocalsOf(t *testing.T) {
	lt := locals(t)
	d := newDecap(t, encap.DecapConfig{}, lt)
	r := newRig(t)
	f := vxlan{src: mux4, dst: host4, vni: testVNI + 1, inner: withDst(v4pkt().build(), dipMAC, nil)}.build()
	ps := r.loadRaw(f)
	r.run(d)
	require.Equal(t, "", reason(ps[0]))
	p := ps[0]
	require.Equal(t, int32(1), p.Backend)

	l, ok := lt.Load().Of(p)
	require.True(t, ok)
	assert.Equal(t, "vm2", l.Name)

	// A new snapshot in another order: index 1 is now another endpoint.
	swapped, err := encap.NewEndpoints([]encap.Endpoint{
		{VNI: testVNI + 1, MAC: dipMAC, Addrs: []netip.Addr{dip4}, OutPort: 8, Name: "vm2"},
		{VNI: testVNI, MAC: dipMAC, Addrs: []netip.Addr{dip4}, OutPort: 7, Name: "vm1"},
	})
	require.NoError(t, err)
	lt.Store(swapped)
	l, ok = lt.Load().Of(p)
	require.True(t, ok)
	assert.Equal(t, "vm2", l.Name)

	// Gone from the new snapshot.
	gone, err := encap.NewEndpoints([]encap.Endpoint{{VNI: testVNI, MAC: dipMAC, Addrs: []netip.Addr{dip4}, Name: "vm1"}})
	require.NoError(t, err)
	_, ok = gone.Of(p)
	assert.False(t, ok)

	var none *encap.Endpoints
	_, ok = none.Of(p)
	assert.False(t, ok)
}
