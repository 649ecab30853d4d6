package fleetlab_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/hostagent"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

var testServices = []fleetlab.Service{
	{Name: "web", Addr: fleetlab.FleetVIP, Proto: flow.ProtoTCP, Port: 80, VNI: fleetlab.FleetVNI, DIPPort: 8080,
		Probe: &health.Spec{Type: health.ProbeTCP, Interval: time.Second, Timeout: 300 * time.Millisecond, Rise: 1, Fall: 3}},
	{Name: "echo", Addr: fleetlab.FleetVIP, Proto: flow.ProtoUDP, Port: 7, VNI: fleetlab.FleetVNI, DIPPort: 7007},
}

// testServices6 are testServices and their IPv6 twins on FleetVIP6.
var testServices6 = append(slices.Clone(testServices),
	fleetlab.Service{Name: "web6", Addr: fleetlab.FleetVIP6, Proto: flow.ProtoTCP, Port: 80, VNI: fleetlab.FleetVNI, DIPPort: 8080},
	fleetlab.Service{Name: "echo6", Addr: fleetlab.FleetVIP6, Proto: flow.ProtoUDP, Port: 7, VNI: fleetlab.FleetVNI, DIPPort: 7007})

// TestDocRoundTrip checks that Document resolves every default as
// control.Parse does: what the nodes read back from the file is exactly
// the document a test computes its expectations from.
func TestDocRoundTrip(t *testing.T) {
	lo := []fleetlab.VM{
		{Name: "a", Host: 1, Addr: netip.MustParseAddr("198.18.4.1"), MAC: net.HardwareAddr{2, 0, 0, 0, 4, 1}},
		{Name: "b", Host: 1, Addr: netip.MustParseAddr("198.18.4.2"), MAC: net.HardwareAddr{2, 0, 0, 0, 4, 2}, Weight: 3},
	}
	for _, tc := range []struct {
		name string
		doc  *fleetlab.Doc
	}{
		{"fleet, host agents", fleetlab.FleetDoc(1, 0, true, testServices, fleetlab.FleetVMs())},
		{"fleet, mux2 with BGP", fleetlab.FleetDoc(7, 2, true, testServices, fleetlab.FleetVMs())},
		{"fleet, mux1 without BGP", fleetlab.FleetDoc(2, 1, false, testServices, fleetlab.FleetVMs()[:1])},
		{"dual-stack fleet, host agents", fleetlab.FleetDoc6(1, 0, true, testServices6, fleetlab.FleetVMs(), fleetlab.FleetVMs6(fleetlab.FleetVMs()))},
		{"dual-stack fleet, mux1 with BGP", fleetlab.FleetDoc6(4, 1, true, testServices6, fleetlab.FleetVMs(), fleetlab.FleetVMs6(fleetlab.FleetVMs()))},
		{"no hosts section, backends keep the port", &fleetlab.Doc{Version: 1, Node: "m",
			BGP: fleetlab.MuxBGP(fleetlab.SubnetAddr(1, 2), fleetlab.SubnetAddr(1, 1)),
			Services: []fleetlab.Service{{Name: "dns", Addr: netip.MustParseAddr("198.18.100.2"), Proto: flow.ProtoUDP,
				Port: 53, VNI: 200}},
			Pool: lo, Hosts: []fleetlab.Host{{Name: "h", Addr: fleetlab.SubnetAddr(3, 2)}}, OmitHosts: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.doc.Document()
			text, err := tc.doc.Marshal()
			require.NoError(t, err)
			got, err := control.Parse(text)
			require.NoError(t, err, "%s", text)
			require.Equal(t, want, got, "%s", text)

			// What WriteDocument writes: sealed, and the same document.
			path := filepath.Join(t.TempDir(), "doc.yaml")
			require.NoError(t, fleetlab.WriteDocument(path, tc.doc))
			written, err := os.ReadFile(path)
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(string(written), "checksum: sha256:"), "%s", written)
			got, err = control.Load(path)
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
}

func TestFleetDoc(t *testing.T) {
	pool := fleetlab.FleetVMs()[1:] // vm11 out
	hosts := fleetlab.FleetDoc(3, 0, true, testServices, pool).Document()
	require.Equal(t, uint64(3), hosts.Version)
	require.Empty(t, hosts.Node.Name, "the Host Agents' copy names no node")
	require.Nil(t, hosts.BGP, "the Host Agents' copy has no BGP")
	require.Len(t, hosts.VIPs, 2)
	for _, v := range hosts.VIPs {
		require.Len(t, v.Backends, 3, "%s: the pool", v.Name)
	}
	require.Equal(t, fleetlab.FleetHostAddr(1), hosts.VIPs[0].Backends[0].Host, "vm12 on host1")
	require.Equal(t, uint32(2), hosts.VIPs[0].Backends[0].Weight)
	require.Equal(t, uint16(7007), hosts.VIPs[1].Backends[0].Port)
	require.Len(t, hosts.Hosts, 2)
	require.Len(t, hosts.Hosts[0].VMs, 1, "host1 lists only the pool's VMs")
	require.Equal(t, "vm2", hosts.Hosts[0].VMs[0].Interface)
	require.Len(t, hosts.Hosts[1].VMs, 2)

	mux := fleetlab.FleetDoc(3, 2, true, testServices, pool).Document()
	require.Equal(t, "mux2", mux.Node.Name)
	require.NotNil(t, mux.BGP)
	require.Equal(t, fleetlab.FleetMuxAddr(2), mux.BGP.RouterID)
	require.Equal(t, []control.Peer{{Address: fleetlab.FleetMuxPeer(2), ASN: fleetlab.RouterASN, Port: 179}}, mux.BGP.Peers)
	require.Nil(t, fleetlab.FleetDoc(3, 2, false, testServices, pool).Document().BGP)
}

// TestFleetDoc6: the dual-stack fleet's document serves the IPv6 VIP
// from the VMs' IPv6 addresses, lists every VM once per family on one
// port and MAC, announces IPv6 VIPs with the Mux's IPv6 next hop, and a
// Host Agent plans it: one endpoint per VM with both addresses.
func TestFleetDoc6(t *testing.T) {
	vms := fleetlab.FleetVMs()
	vms6 := fleetlab.FleetVMs6(vms)
	require.Equal(t, "2001:db8:0:31::1", vms6[0].Addr.String())
	require.Equal(t, "2001:db8:0:32::2", vms6[3].Addr.String())
	require.Equal(t, vms[3].MAC, vms6[3].MAC)

	doc := fleetlab.FleetDoc6(1, 0, true, testServices6, vms, vms6).Document()
	require.Len(t, doc.VIPs, 4)
	for _, v := range doc.VIPs {
		for i, b := range v.Backends {
			require.Equal(t, v.Address.Is6(), b.Address.Is6(), "%s backend %d", v.Name, i)
		}
	}
	require.Equal(t, vms6[1].Addr, doc.VIPs[2].Backends[1].Address)
	require.Len(t, doc.Hosts[0].VMs, 4, "host1: two VMs, two families")
	require.Contains(t, doc.InfraPrefixes, netip.MustParsePrefix("2001:db8:0:1::/64"))

	p, err := hostagent.NewPlan(doc, "host1", nil)
	require.NoError(t, err)
	require.Len(t, p.Endpoints, 2)
	require.Equal(t, []netip.Addr{vms[0].Addr, vms6[0].Addr}, p.Endpoints[0].Addrs)
	require.Len(t, p.DIPs, 4)

	mux := fleetlab.FleetDoc6(1, 2, true, testServices6, vms, vms6).Document()
	require.Equal(t, fleetlab.FleetMuxAddr6(2), mux.BGP.NextHop6)
	require.Equal(t, "2001:db8:0:2::2", mux.BGP.NextHop6.String())
}

func TestSubnetAddr(t *testing.T) {
	require.Equal(t, "198.18.21.2", fleetlab.SubnetAddr(21, 2).String())
	require.Equal(t, "198.18.1.2", fleetlab.FleetMuxAddr(1).String())
	require.Equal(t, "198.18.2.1", fleetlab.FleetMuxPeer(2).String())
	require.Equal(t, "198.18.22.2", fleetlab.FleetHostAddr(2).String())
	require.Equal(t, "198.18.11.2", fleetlab.FleetClientAddr(1).String())
}

// TestFleetShared: the shared document parses back to itself and gives
// each Mux what its per-node document gives it.
func TestFleetShared(t *testing.T) {
	d := fleetlab.FleetShared(3, true, []fleetlab.Service{{Name: "web", Addr: fleetlab.FleetVIP, Proto: 6, Port: 80, VNI: fleetlab.FleetVNI, DIPPort: 8080}}, fleetlab.FleetVMs(), fleetlab.FleetVMs6(fleetlab.FleetVMs()))
	text, err := d.Marshal()
	require.NoError(t, err)
	doc, err := control.Parse(text)
	require.NoError(t, err, "%s", text)
	for i := 1; i <= fleetlab.FleetMuxes; i++ {
		m, err := doc.ForNode(fmt.Sprintf("mux%d", i))
		require.NoError(t, err)
		own := fleetlab.FleetDoc6(3, i, true, d.Services, d.Pool, d.Pool6).Document()
		require.Equal(t, own.BGP, m.BGP, "mux%d", i)
	}
}

// outboundDoc is the fleet's document with inbound NAT rules and an
// outbound section on the web VIP with a static allocation.
func outboundDoc() *fleetlab.Doc {
	d := fleetlab.FleetDoc(1, 0, true, testServices, fleetlab.FleetVMs())
	vip := testServices[0].Addr
	d.InboundNAT = []control.InboundNAT{{Name: "ssh", Address: vip, Protocol: flow.ProtoTCP, VNI: testServices[0].VNI,
		FirstPort: 50001, LastPort: 50001, BackendPort: 22, Targets: []netip.Addr{fleetlab.FleetVMs()[0].Addr}}}
	d.Outbound = []control.Outbound{{Address: vip, VNI: testServices[0].VNI, DIPs: []netip.Addr{fleetlab.FleetVMs()[0].Addr},
		Static: []control.StaticAllocation{{DIP: fleetlab.FleetVMs()[0].Addr, Ports: control.PortRange{First: 2048, Last: 4095}}}}}
	return d
}

func TestDocOutboundPool(t *testing.T) {
	d := outboundDoc()
	doc := d.Document()
	require.Len(t, doc.Outbound, 1)
	// The web VIP's port 80 is below the pool; 50001 leaves its block out.
	require.Equal(t, []control.PortRange{{First: 1024, Last: 49983}, {First: 50048, Last: 65535}}, doc.Outbound[0].Pool)
	// As a node parses it (the inbound NAT rule's VIP appears only then).
	text, err := d.Marshal()
	require.NoError(t, err)
	got, err := control.Parse(text)
	require.NoError(t, err, "%s", text)
	require.Equal(t, doc.Outbound, got.Outbound)
}

// TestServiceBackends: a service with Backends is served by those VMs of
// the pool only, the others by the whole pool, and the hosts section
// lists every VM of the pool.
func TestServiceBackends(t *testing.T) {
	svcs := []fleetlab.Service{
		{Name: "a", Addr: fleetlab.FleetVIP, Proto: flow.ProtoTCP, Port: 80, VNI: fleetlab.FleetVNI, DIPPort: 8080,
			Backends: []string{"vm11", "vm12"}},
		{Name: "b", Addr: netip.MustParseAddr("198.18.100.2"), Proto: flow.ProtoTCP, Port: 80, VNI: fleetlab.FleetVNI,
			DIPPort: 8080, Backends: []string{"vm22"}},
		{Name: "all", Addr: netip.MustParseAddr("198.18.100.3"), Proto: flow.ProtoTCP, Port: 80, VNI: fleetlab.FleetVNI,
			DIPPort: 8080},
	}
	d := fleetlab.FleetShared(1, true, svcs, fleetlab.FleetVMs(), nil)
	text, err := d.Marshal()
	require.NoError(t, err)
	doc, err := control.Parse(text)
	require.NoError(t, err, "%s", text)
	require.Equal(t, d.Document(), doc)
	names := func(v control.VIP) []string {
		var out []string
		for _, b := range v.Backends {
			out = append(out, b.Name)
		}
		return out
	}
	require.Len(t, doc.VIPs, 3)
	require.Equal(t, []string{"vm11", "vm12"}, names(doc.VIPs[0]))
	require.Equal(t, []string{"vm22"}, names(doc.VIPs[1]))
	require.Equal(t, []string{"vm11", "vm12", "vm21", "vm22"}, names(doc.VIPs[2]))
	require.Len(t, doc.Hosts, 2)
	require.Len(t, doc.Hosts[0].VMs, 2)
	require.Len(t, doc.Hosts[1].VMs, 2)

	// A name not in the pool (a typo) is refused where it is made.
	d.Services[1].Backends = []string{"vm23"}
	require.PanicsWithValue(t, `fleetlab: service b names backend "vm23", not a VM of its pool`, func() { d.Document() })
}
