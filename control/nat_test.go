package control

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
)

// natDoc maps VIP ports 50001-50002 to two VMs' port 22 (lines 12-18).
const natDoc = `version: 1
hosts:
  - name: host-1
    address: 198.19.0.1
    vms:
      - {vni: 100, address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm-a}
      - {vni: 100, address: 198.19.1.2, mac: "02:00:00:00:01:02", interface: vm-b}
  - name: host-2
    address: 198.19.0.2
    vms:
      - {vni: 100, address: 198.19.2.1, mac: "02:00:00:00:02:01", interface: vm-c}
inbound_nat:
  - name: ssh
    address: 198.18.100.1
    vni: 100
    ports: 50001-50002
    backend_port: 22
    targets: [198.19.1.2, 198.19.2.1]
`

func TestInboundNAT(t *testing.T) {
	d, err := Parse([]byte(natDoc))
	require.NoError(t, err)
	require.Len(t, d.InboundNAT, 1)
	require.Len(t, d.VIPs, 2)
	v := d.VIPs[1]
	assert.Equal(t, "ssh-50002", v.Name)
	assert.Equal(t, uint16(50002), v.Port)
	assert.Equal(t, uint8(flow.ProtoTCP), v.Protocol)
	assert.Equal(t, "ssh", v.InboundNAT)
	require.Len(t, v.Backends, 1)
	b := v.Backends[0]
	assert.Equal(t, netip.MustParseAddr("198.19.2.1"), b.Address)
	assert.Equal(t, uint16(22), b.Port)
	assert.Equal(t, netip.MustParseAddr("198.19.0.2"), b.Host, "the target's host, from hosts[]")
	assert.Equal(t, [6]byte{2, 0, 0, 0, 2, 1}, b.MAC)
	rules := d.Rules(nil)
	require.Len(t, rules, 2)
	assert.Equal(t, uint16(50001), rules[0].VIP.Port)

	text, err := d.Marshal()
	require.NoError(t, err)
	assert.Contains(t, string(text), "inbound_nat:")
	assert.NotContains(t, string(text), "ssh-50001", "the rule is written, not its VIPs")
	back, err := Parse(text)
	require.NoError(t, err, "%s", text)
	assert.Equal(t, d, back)
}

func TestInboundNATErrors(t *testing.T) {
	for _, tc := range []struct{ name, old, new, want string }{
		{"count", "ports: 50001-50002", "ports: 50001-50003", "<doc>:16:12: inbound_nat[0].ports: 3 ports for 2 targets"},
		{"unknown target", "targets: [198.19.1.2,", "targets: [198.19.9.9,", "inbound_nat[0].targets[0]: 198.19.9.9 is not a VM of VNI 100 in hosts[]"},
		{"other VNI", "    vni: 100\n    ports", "    vni: 200\n    ports", "is not a VM of VNI 200"},
		{"bad range", "ports: 50001-50002", "ports: 50002-50001", `inbound_nat[0].ports: "50002-50001" is not a port range`},
		{"family", "address: 198.18.100.1", "address: 2001:db8::1", "are of different families"},
		{"no backend port", "    backend_port: 22\n", "", "inbound_nat[0].backend_port: missing (want the VMs' port, 1..65535)"},
		{"clash with a VIP", "inbound_nat:", `vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 50002
    vni: 100
    backends: [{address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}]
inbound_nat:`, "tcp 198.18.100.1:50002 in VNI 100 is already served by vips[0]"},
		{"name clash", "inbound_nat:", `vips:
  - name: ssh-50001
    address: 198.18.100.2
    protocol: tcp
    port: 22
    vni: 100
    backends: [{address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}]
inbound_nat:`, `VIP name "ssh-50001" is used twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Contains(t, natDoc, tc.old)
			_, err := parse("<doc>", []byte(strings.Replace(natDoc, tc.old, tc.new, 1)))
			require.ErrorIs(t, err, ErrInvalid)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
