package hostagent_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/hostagent"
	"github.com/xdplb/xdplb/nat"
)

const planDoc = `version: 3
node: {name: host-2}
infra_prefixes: [198.18.0.0/24]
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    backends:
      - {address: 198.19.1.1, port: 8080, mac: "02:00:00:00:01:01", host: 198.19.0.1}
      - {address: 198.19.1.2, port: 8080, mac: "02:00:00:00:01:02", host: 198.19.0.2}
      - {address: 198.19.1.3, mac: "02:00:00:00:01:03", host: 198.19.0.2}
  - name: any
    address: 198.18.100.2
    protocol: udp
    port: all
    vni: 100
    backends:
      - {address: 198.19.1.3, mac: "02:00:00:00:01:03", host: 198.19.0.2}
  - name: other-tenant
    address: 198.18.100.3
    protocol: tcp
    port: 443
    vni: 200
    backends:
      - {address: 198.19.1.2, mac: "02:00:00:00:02:02", host: 198.19.0.2}
hosts:
  - name: host-1
    address: 198.19.0.1
    vms:
      - {vni: 100, address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm1}
  - name: host-2
    address: 198.19.0.2
    vxlan_port: 4790
    vms:
      - {vni: 100, address: 198.19.1.3, mac: "02:00:00:00:01:03", interface: vm3}
      - {vni: 100, address: 198.19.1.2, mac: "02:00:00:00:01:02", interface: vm2}
      - {vni: 200, address: 198.19.1.2, mac: "02:00:00:00:02:02", interface: vm2t}
`

func mustDoc(t *testing.T, s string) *control.Document {
	t.Helper()
	doc, err := control.Parse([]byte(s))
	require.NoError(t, err)
	return doc
}

func TestNewPlan(t *testing.T) {
	doc := mustDoc(t, planDoc)
	pfx := netip.MustParsePrefix
	addr := netip.MustParseAddr
	for _, host := range []string{"host-2", "198.19.0.2"} {
		t.Run(host, func(t *testing.T) {
			p, err := hostagent.NewPlan(doc, host, []netip.Prefix{pfx("198.18.9.0/24")})
			require.NoError(t, err)
			assert.EqualValues(t, 3, p.Version)
			assert.Equal(t, "host-2", p.Host.Name)
			assert.Equal(t, []steer.VXLANRule{{Local: addr("198.19.0.2"), Port: 4790}}, p.Uplink.VXLAN)
			assert.Equal(t, []netip.Prefix{pfx("198.18.0.0/24"), pfx("198.18.9.0/24"), pfx("198.19.0.2/32")}, p.Infra)

			// Ports sorted by name, numbered after the uplink.
			require.Len(t, p.Ports, 3)
			names := []string{p.Ports[0].Interface, p.Ports[1].Interface, p.Ports[2].Interface}
			assert.Equal(t, []string{"vm2", "vm2t", "vm3"}, names)
			for i, vp := range p.Ports {
				assert.EqualValues(t, hostagent.UplinkPort+1+i, vp.Index)
				assert.Equal(t, p.Infra, vp.Steer.Infra, vp.Interface)
			}
			assert.EqualValues(t, 100, p.Ports[0].VNI)
			assert.EqualValues(t, 200, p.Ports[1].VNI)

			// Steering: the DIP endpoints that serve a VIP, per port and
			// tenant. vm2 serves web on 8080; vm2t (the same address in
			// VNI 200) serves other-tenant on 443, its VIP port; vm3 serves
			// web on port 80 (backend port 0) and every port of "any".
			assert.Equal(t, []steer.SrcRule{{Addr: addr("198.19.1.2"), Port: 8080}}, p.Ports[0].Steer.Src)
			assert.Equal(t, []steer.SrcRule{{Addr: addr("198.19.1.2"), Port: 443}}, p.Ports[1].Steer.Src)
			assert.ElementsMatch(t, []steer.SrcRule{{Addr: addr("198.19.1.3"), Port: 0}, {Addr: addr("198.19.1.3"), Port: 80}}, p.Ports[2].Steer.Src)

			// Endpoints for Decap, DIPs for NAT: in document order.
			require.Len(t, p.Endpoints, 3)
			assert.Equal(t, encap.Endpoint{VNI: 100, MAC: [6]byte{2, 0, 0, 0, 1, 3}, Addrs: []netip.Addr{addr("198.19.1.3")}, OutPort: 3, Name: "vm3/198.19.1.3"}, p.Endpoints[0])
			assert.EqualValues(t, 1, p.Endpoints[1].OutPort)
			assert.EqualValues(t, 2, p.Endpoints[2].OutPort)
			assert.Equal(t, []nat.DIP{{VNI: 100, Addr: addr("198.19.1.3")}, {VNI: 100, Addr: addr("198.19.1.2")}, {VNI: 200, Addr: addr("198.19.1.2")}}, p.DIPs)
		})
	}
}

func TestNewPlanErrors(t *testing.T) {
	doc := mustDoc(t, planDoc)
	tests := []struct {
		name  string
		doc   *control.Document
		host  string
		infra []netip.Prefix
		want  string
	}{
		{name: "unknown host", doc: doc, host: "host-9", want: "host not in the document"},
		{name: "unknown address", doc: doc, host: "198.19.0.9", want: "host not in the document"},
		{name: "invalid infra", doc: doc, host: "host-1", infra: []netip.Prefix{{}}, want: "invalid infrastructure prefix"},
		// The document format gives each VM its own interface; a
		// Document built in code may not.
		{name: "two VNIs on a port", doc: &control.Document{Version: 1, Hosts: []control.Host{{Name: "h",
			Address: netip.MustParseAddr("198.19.0.2"), VXLANPort: 4789, VMs: []control.VM{
				{VNI: 100, Address: netip.MustParseAddr("198.19.1.2"), MAC: [6]byte{2, 0, 0, 0, 1, 2}, Interface: "vm"},
				{VNI: 200, Address: netip.MustParseAddr("198.19.1.3"), MAC: [6]byte{2, 0, 0, 0, 1, 3}, Interface: "vm"},
			}}}}, host: "h", want: "interface vm has VMs in VNI 100 and VNI 200"},
		{name: "a MAC on two interfaces", doc: vmDoc(
			control.VM{VNI: 100, Address: netip.MustParseAddr("198.19.1.2"), MAC: [6]byte{2, 0, 0, 0, 1, 2}, Interface: "vm"},
			control.VM{VNI: 100, Address: netip.MustParseAddr("2001:db8:1::2"), MAC: [6]byte{2, 0, 0, 0, 1, 2}, Interface: "vm6"},
		), host: "h", want: `host "h": VNI 100 MAC 02:00:00:00:01:02 is on interface vm (198.19.1.2) and on interface vm6 (2001:db8:1::2); a MAC names one VM port`},
		{name: "two IPv4 addresses on a MAC", doc: vmDoc(
			control.VM{VNI: 100, Address: netip.MustParseAddr("198.19.1.2"), MAC: [6]byte{2, 0, 0, 0, 1, 2}, Interface: "vm"},
			control.VM{VNI: 100, Address: netip.MustParseAddr("198.19.1.3"), MAC: [6]byte{2, 0, 0, 0, 1, 2}, Interface: "vm"},
		), host: "h", want: `host "h": VNI 100 MAC 02:00:00:00:01:02 on interface vm has 198.19.1.2 and 198.19.1.3; a VM has at most one address per family`},
		{name: "two IPv6 addresses on a dual-stack MAC", doc: vmDoc(
			control.VM{VNI: 100, Address: netip.MustParseAddr("2001:db8:1::2"), MAC: [6]byte{2, 0, 0, 0, 1, 2}, Interface: "vm"},
			control.VM{VNI: 100, Address: netip.MustParseAddr("198.19.1.2"), MAC: [6]byte{2, 0, 0, 0, 1, 2}, Interface: "vm"},
			control.VM{VNI: 100, Address: netip.MustParseAddr("2001:db8:1::3"), MAC: [6]byte{2, 0, 0, 0, 1, 2}, Interface: "vm"},
		), host: "h", want: "on interface vm has 2001:db8:1::2 and 2001:db8:1::3; a VM has at most one address per family"},
		{name: "an address on two MACs", doc: vmDoc(
			control.VM{VNI: 100, Address: netip.MustParseAddr("2001:db8:1::2"), MAC: [6]byte{2, 0, 0, 0, 1, 2}, Interface: "vm"},
			control.VM{VNI: 100, Address: netip.MustParseAddr("2001:db8:1::2"), MAC: [6]byte{2, 0, 0, 0, 1, 3}, Interface: "vm"},
		), host: "h", want: `VNI 100 address 2001:db8:1::2 already used by 0 ("vm/2001:db8:1::2")`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := hostagent.NewPlan(tc.doc, tc.host, tc.infra)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// vmDoc is a one-host document built in code, with VMs the document format
// would refuse.
func vmDoc(vms ...control.VM) *control.Document {
	return &control.Document{Version: 1, Hosts: []control.Host{{Name: "h",
		Address: netip.MustParseAddr("198.19.0.2"), VXLANPort: 4789, VMs: vms}}}
}

// TestNewPlanDualStack: a VM listed once per family with one MAC and
// interface is one Decap endpoint with both addresses, two NAT DIPs, and
// the steering rules of the VIPs of both families on its one port.
func TestNewPlanDualStack(t *testing.T) {
	const dual = `version: 1
vips:
  - {name: web4, address: 198.18.100.1, protocol: tcp, port: 80, vni: 100, backends: [
      {address: 198.19.1.2, port: 8080, mac: "02:00:00:00:01:02", host: 198.19.0.2}]}
  - {name: web6, address: "2001:db8:100::1", protocol: tcp, port: 80, vni: 100, backends: [
      {address: "2001:db8:1::2", port: 8080, mac: "02:00:00:00:01:02", host: 198.19.0.2},
      {address: "2001:db8:1::3", mac: "02:00:00:00:01:03", host: 198.19.0.2}]}
hosts:
  - name: h
    address: 198.19.0.2
    vms:
      - {vni: 100, address: 198.19.1.2, mac: "02:00:00:00:01:02", interface: vm2}
      - {vni: 100, address: "2001:db8:1::3", mac: "02:00:00:00:01:03", interface: vm3}
      - {vni: 100, address: "2001:db8:1::2", mac: "02:00:00:00:01:02", interface: vm2}
`
	addr := netip.MustParseAddr
	p, err := hostagent.NewPlan(mustDoc(t, dual), "h", nil)
	require.NoError(t, err)
	assert.Equal(t, []encap.Endpoint{
		{VNI: 100, MAC: [6]byte{2, 0, 0, 0, 1, 2}, Addrs: []netip.Addr{addr("198.19.1.2"), addr("2001:db8:1::2")}, OutPort: 1, Name: "vm2/198.19.1.2,2001:db8:1::2"},
		{VNI: 100, MAC: [6]byte{2, 0, 0, 0, 1, 3}, Addrs: []netip.Addr{addr("2001:db8:1::3")}, OutPort: 2, Name: "vm3/2001:db8:1::3"},
	}, p.Endpoints)
	assert.Equal(t, []nat.DIP{{VNI: 100, Addr: addr("198.19.1.2")}, {VNI: 100, Addr: addr("2001:db8:1::3")}, {VNI: 100, Addr: addr("2001:db8:1::2")}}, p.DIPs)
	require.Len(t, p.Ports, 2)
	assert.ElementsMatch(t, []steer.SrcRule{{Addr: addr("198.19.1.2"), Port: 8080}, {Addr: addr("2001:db8:1::2"), Port: 8080}}, p.Ports[0].Steer.Src)
	assert.Equal(t, []steer.SrcRule{{Addr: addr("2001:db8:1::3"), Port: 80}}, p.Ports[1].Steer.Src)

	// The data path indexes it: one port, found by (VNI, MAC); both DIPs
	// found by address.
	ls, err := encap.NewEndpoints(p.Endpoints)
	require.NoError(t, err)
	i, ok := ls.Lookup(100, [6]byte{2, 0, 0, 0, 1, 2})
	require.True(t, ok)
	assert.EqualValues(t, 1, ls.At(i).OutPort)
	dips, err := nat.NewDIPs(p.DIPs)
	require.NoError(t, err)
	assert.True(t, dips.Contains(100, addr("2001:db8:1::2")))
	assert.True(t, dips.Contains(100, addr("198.19.1.2")))
}

func TestPlanSameStructure(t *testing.T) {
	p, err := hostagent.NewPlan(mustDoc(t, planDoc), "host-2", nil)
	require.NoError(t, err)
	tests := []struct {
		name  string
		edits []string // old, new, old, new, ...: each replaced once
		same  bool
	}{
		{"itself", nil, true},
		{"a VIP port changes", []string{"port: 443", "port: 8443"}, true},
		{"a VM's MAC changes", []string{
			`mac: "02:00:00:00:02:02", interface: vm2t`, `mac: "02:00:00:00:02:03", interface: vm2t`,
			`{address: 198.19.1.2, mac: "02:00:00:00:02:02"`, `{address: 198.19.1.2, mac: "02:00:00:00:02:03"`}, true},
		{"another host's VM moves", []string{"interface: vm1", "interface: vm9"}, true},
		{"a VM moves to another port", []string{"interface: vm3", "interface: vm4"}, false},
		{"the host's VXLAN port", []string{"vxlan_port: 4790", "vxlan_port: 4791"}, false},
		{"the infrastructure prefixes", []string{"infra_prefixes: [198.18.0.0/24]", "infra_prefixes: [198.18.0.0/23]"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := planDoc
			for i := 0; i < len(tc.edits); i += 2 {
				require.Contains(t, s, tc.edits[i])
				s = strings.Replace(s, tc.edits[i], tc.edits[i+1], 1)
			}
			q, err := hostagent.NewPlan(mustDoc(t, s), "host-2", nil)
			require.NoError(t, err)
			assert.Equal(t, tc.same, p.SameStructure(q))
		})
	}
	assert.False(t, p.SameStructure(nil))
}

func TestNewConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  hostagent.Config
		want string
	}{
		{"no uplink", hostagent.Config{ConfigPath: "x"}, "Uplink is empty"},
		{"no document", hostagent.Config{Uplink: "eth0"}, "ConfigPath is empty"},
		{"negative workers", hostagent.Config{Uplink: "eth0", ConfigPath: "x", Workers: -1}, "Workers"},
		{"invalid prefix", hostagent.Config{Uplink: "eth0", ConfigPath: "x", TunnelSources: []netip.Prefix{{}}}, "invalid prefix"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := hostagent.New(tc.cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	a, err := hostagent.New(hostagent.Config{Uplink: "eth0", ConfigPath: "x"})
	require.NoError(t, err)
	assert.Nil(t, a.Plan())
	assert.False(t, a.Forwarding())
	assert.Zero(t, a.Stats().RX)
}
