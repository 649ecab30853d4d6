package fleetlab_test

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/internal/fleetlab"
)

var testServices = []fleetlab.Service{
	{Name: "web", Addr: fleetlab.FleetVIP, Proto: flow.ProtoTCP, Port: 80, VNI: fleetlab.FleetVNI, DIPPort: 8080,
		Probe: &health.Spec{Type: health.ProbeTCP, Interval: time.Second, Timeout: 300 * time.Millisecond, Rise: 1, Fall: 3}},
	{Name: "echo", Addr: fleetlab.FleetVIP, Proto: flow.ProtoUDP, Port: 7, VNI: fleetlab.FleetVNI, DIPPort: 7007},
}

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

func TestSubnetAddr(t *testing.T) {
	require.Equal(t, "198.18.21.2", fleetlab.SubnetAddr(21, 2).String())
	require.Equal(t, "198.18.1.2", fleetlab.FleetMuxAddr(1).String())
	require.Equal(t, "198.18.2.1", fleetlab.FleetMuxPeer(2).String())
	require.Equal(t, "198.18.22.2", fleetlab.FleetHostAddr(2).String())
	require.Equal(t, "198.18.11.2", fleetlab.FleetClientAddr(1).String())
}
