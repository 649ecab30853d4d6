package encap_test

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/header"
)

func TestNewLocalsErrors(t *testing.T) {
	ok := encap.Local{VNI: 1, MAC: dipMAC, Addr: dip4, Name: "a"}
	with := func(f func(*encap.Local)) encap.Local { l := ok; f(&l); return l }
	cases := []struct {
		name   string
		locals []encap.Local
	}{
		{"VNI too big", []encap.Local{with(func(l *encap.Local) { l.VNI = 1 << 24 })}},
		{"no MAC", []encap.Local{with(func(l *encap.Local) { l.MAC = header.MAC{} })}},
		{"multicast MAC", []encap.Local{with(func(l *encap.Local) { l.MAC = header.MAC{1, 0, 0x5e, 0, 0, 1} })}},
		{"no address", []encap.Local{with(func(l *encap.Local) { l.Addr = netip.Addr{} })}},
		{"zone", []encap.Local{with(func(l *encap.Local) { l.Addr = netip.MustParseAddr("fe80::1%eth0") })}},
		{"duplicate VNI and MAC", []encap.Local{ok, with(func(l *encap.Local) { l.Addr = dip6 })}},
		{"duplicate VNI and address", []encap.Local{ok, with(func(l *encap.Local) { l.MAC = hopMAC })}},
		{"duplicate address, mapped", []encap.Local{ok, with(func(l *encap.Local) { l.MAC, l.Addr = hopMAC, netip.AddrFrom16(dip4.As16()) })}},
	}
	for _, tc := range cases {
		_, err := encap.NewLocals(tc.locals)
		assert.True(t, errors.Is(err, encap.ErrInvalidLocal), "%s: %v", tc.name, err)
	}
	// The same MAC and address in another VNI is another endpoint.
	ls, err := encap.NewLocals([]encap.Local{ok, with(func(l *encap.Local) { l.VNI = 2 })})
	require.NoError(t, err)
	assert.Equal(t, 2, ls.Len())
}

func TestLocalsLookup(t *testing.T) {
	var in []encap.Local
	for i := range 1000 {
		in = append(in, encap.Local{
			VNI:     uint32(i % 7),
			MAC:     header.MAC{2, 0, 0, byte(i >> 16), byte(i >> 8), byte(i)},
			Addr:    netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}),
			OutPort: uint16(i),
			Name:    fmt.Sprint("vm", i),
		})
	}
	ls, err := encap.NewLocals(in)
	require.NoError(t, err)
	in[0].Name = "changed" // NewLocals copied
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

	var none *encap.Locals
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
	swapped, err := encap.NewLocals([]encap.Local{
		{VNI: testVNI + 1, MAC: dipMAC, Addr: dip4, OutPort: 8, Name: "vm2"},
		{VNI: testVNI, MAC: dipMAC, Addr: dip4, OutPort: 7, Name: "vm1"},
	})
	require.NoError(t, err)
	lt.Store(swapped)
	l, ok = lt.Load().Of(p)
	require.True(t, ok)
	assert.Equal(t, "vm2", l.Name)

	// Gone from the new snapshot.
	gone, err := encap.NewLocals([]encap.Local{{VNI: testVNI, MAC: dipMAC, Addr: dip4, Name: "vm1"}})
	require.NoError(t, err)
	_, ok = gone.Of(p)
	assert.False(t, ok)

	var none *encap.Locals
	_, ok = none.Of(p)
	assert.False(t, ok)
}
