package steer

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidate(t *testing.T) {
	a4 := netip.MustParseAddr("198.18.0.1")
	for _, c := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"empty", Config{}, true},
		{"all kinds", Config{
			Dst:   []DstRule{{Addr: a4}, {Addr: a4, Proto: ProtoTCP}, {Addr: a4, Proto: ProtoUDP, Port: 53}, {Addr: a4, Proto: 50}},
			VXLAN: []VXLANRule{{Local: a4}},
			Src:   []SrcRule{{Addr: a4}, {Addr: a4, Port: 8080}},
			Infra: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("2001:db8::/32")},
		}, true},
		{"zero address", Config{Dst: []DstRule{{}}}, false},
		{"unspecified", Config{Src: []SrcRule{{Addr: netip.IPv6Unspecified()}}}, false},
		{"port without protocol", Config{Dst: []DstRule{{Addr: a4, Port: 80}}}, false},
		{"port with icmp", Config{Dst: []DstRule{{Addr: a4, Proto: 1, Port: 80}}}, false},
		{"vxlan zero address", Config{VXLAN: []VXLANRule{{Port: 4789}}}, false},
		{"invalid prefix", Config{Infra: []netip.Prefix{{}}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.ok {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrInvalidRule)
			}
		})
	}
}

func TestNormalize(t *testing.T) {
	in := Config{
		Dst: []DstRule{
			{Addr: netip.MustParseAddr("2001:db8::1"), Proto: ProtoTCP, Port: 443},
			{Addr: netip.MustParseAddr("::ffff:198.18.0.2")},
			{Addr: netip.MustParseAddr("198.18.0.2")}, // duplicate once unmapped
			{Addr: netip.MustParseAddr("fe80::1%eth0")},
		},
		VXLAN: []VXLANRule{{Local: netip.MustParseAddr("198.18.1.1")}},
		Src:   []SrcRule{{Addr: netip.MustParseAddr("198.18.2.1"), Port: 8080}},
		Infra: []netip.Prefix{
			netip.MustParsePrefix("::ffff:198.18.3.7/120"),
			netip.MustParsePrefix("2001:db8:3::7/48"),
		},
	}
	want := Config{
		Dst: []DstRule{
			{Addr: netip.MustParseAddr("198.18.0.2")},
			{Addr: netip.MustParseAddr("2001:db8::1"), Proto: ProtoTCP, Port: 443},
			{Addr: netip.MustParseAddr("fe80::1")},
		},
		VXLAN: []VXLANRule{{Local: netip.MustParseAddr("198.18.1.1"), Port: DefaultVXLANPort}},
		Src:   []SrcRule{{Addr: netip.MustParseAddr("198.18.2.1"), Port: 8080}},
		Infra: []netip.Prefix{
			netip.MustParsePrefix("198.18.3.0/24"),
			netip.MustParsePrefix("2001:db8:3::/48"),
		},
	}
	require.NoError(t, in.Validate())
	assert.Equal(t, want, in.Normalize())
	assert.Equal(t, want, want.Normalize(), "idempotent")
}

func TestRuleKeys(t *testing.T) {
	k, err := DstRule{Addr: netip.MustParseAddr("198.18.0.1"), Proto: ProtoTCP, Port: 0x1234}.key()
	require.NoError(t, err)
	// The port is stored in network byte order, as the program reads it.
	assert.Equal(t, binary.NativeEndian.Uint16([]byte{0x12, 0x34}), k.Port)
	assert.Equal(t, uint16(0x1234), k.port())
	assert.Equal(t, uint8(kindDst4), k.Kind)
	assert.Equal(t, classDstPort, k.class())

	k, err = SrcRule{Addr: netip.MustParseAddr("2001:db8::1")}.key()
	require.NoError(t, err)
	assert.Equal(t, uint8(kindSrc6), k.Kind)
	assert.Equal(t, classSrcAddr, k.class())

	lk, err := infraKey(netip.MustParsePrefix("198.18.0.0/15"))
	require.NoError(t, err)
	assert.Equal(t, uint32(8+15), lk.Prefixlen)
	assert.Equal(t, uint8(4), lk.Family)
}

func TestStrings(t *testing.T) {
	a := netip.MustParseAddr("198.18.0.1")
	assert.Equal(t, "dst 198.18.0.1", DstRule{Addr: a}.String())
	assert.Equal(t, "dst 198.18.0.1 udp", DstRule{Addr: a, Proto: ProtoUDP}.String())
	assert.Equal(t, "dst 198.18.0.1:80 tcp", DstRule{Addr: a, Proto: ProtoTCP, Port: 80}.String())
	assert.Equal(t, "dst 198.18.0.1 proto 50", DstRule{Addr: a, Proto: 50}.String())
	assert.Equal(t, "vxlan 198.18.0.1:4789", VXLANRule{Local: a, Port: 4789}.String())
	assert.Equal(t, "src 198.18.0.1", SrcRule{Addr: a}.String())
	assert.Equal(t, "src 198.18.0.1:8080", SrcRule{Addr: a, Port: 8080}.String())
}
