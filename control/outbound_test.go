package control

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// outDoc is natDoc with a VIP on port 80 and an outbound section for the
// VIP's address (lines 19-).
const outDoc = natDoc + `vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    backends: [{address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}]
outbound:
  - address: 198.18.100.1
    vni: 100
    dips: [198.19.1.1, 198.19.1.2]
    ports: 1024-65535
    unit: 1024
    static:
      - {dip: 198.19.1.1, ports: 1024-2047}
      - {dip: 198.19.1.2, ports: 2048-4095}
    local: [198.19.0.0/16, 10.0.0.0/8]
`

func TestOutbound(t *testing.T) {
	d, err := Parse([]byte(outDoc))
	require.NoError(t, err)
	require.Len(t, d.Outbound, 1)
	ob := d.Outbound[0]
	assert.Equal(t, uint16(1024), ob.Unit)
	// 50001 and 50002 (inbound NAT) fall in the block 49152-50175: it
	// is left out of the pool; port 80 is below it.
	assert.Equal(t, []PortRange{{1024, 49151}, {50176, 65535}}, ob.Pool)
	assert.Equal(t, []StaticAllocation{
		{netip.MustParseAddr("198.19.1.1"), PortRange{1024, 2047}},
		{netip.MustParseAddr("198.19.1.2"), PortRange{2048, 4095}},
	}, ob.Static)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16"), netip.MustParsePrefix("10.0.0.0/8")}, ob.Local)
	text, err := d.Marshal()
	require.NoError(t, err)
	back, err := Parse(text)
	require.NoError(t, err, "%s", text)
	assert.Equal(t, d, back)
}

func TestOutboundErrors(t *testing.T) {
	for _, tc := range []struct{ name, old, new, want string }{
		{"not a VM", "dips: [198.19.1.1,", "dips: [198.19.7.7,", "outbound[0].dips[0]: 198.19.7.7 is not a VM of VNI 100 in hosts[]"},
		{"unit", "unit: 1024", "unit: 1000", "outbound[0].unit: 1000 is not a power of two"},
		{"misaligned", "ports: 1024-2047}", "ports: 1000-2047}", "outbound[0].static[0].ports: 1000-2047 is not whole units of 1024 ports"},
		{"outside the pool", "ports: 2048-4095}", "ports: 49152-50175}", "is not within the pool"},
		{"overlap", "ports: 2048-4095}", "ports: 1024-2047}", "overlaps another static allocation"},
		{"not a dip", "{dip: 198.19.1.2,", "{dip: 198.19.2.1,", "198.19.2.1 is not in this section's dips"},
		{"every port inbound", "    port: 80\n", "    port: all\n", "serves every port inbound"},
		{"local family", "local: [198.19.0.0/16,", "local: [2001:db8::/32,", "outbound[0].local[0]: 2001:db8::/32 and the VIP 198.18.100.1 are of different families"},
		{"local not a prefix", "local: [198.19.0.0/16,", "local: [198.19.0.1,", "outbound[0].local[0]: \"198.19.0.1\" is an address"},
		{"local listed twice", "10.0.0.0/8]", "198.19.0.0/16]", "outbound[0].local[1]: prefix 198.19.0.0/16 is listed twice"},
		{"twice", "outbound:\n", "outbound:\n  - {address: 198.18.100.1, vni: 100, dips: [198.19.1.1]}\n", "has an outbound section already"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Contains(t, outDoc, tc.old)
			_, err := parse("<doc>", []byte(strings.Replace(outDoc, tc.old, tc.new, 1)))
			require.ErrorIs(t, err, ErrInvalid)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
