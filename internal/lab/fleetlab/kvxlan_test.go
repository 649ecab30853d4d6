package fleetlab_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

// TestKernelVXLANDoc checks the document entry of a backend on a host
// without a Host Agent: its host is no entry of the hosts section, its
// port is 0 for every service (no NAT: the packet's port), and the
// document still round-trips through control.Parse, which accepts a
// backend whose host the hosts section does not list.
func TestKernelVXLANDoc(t *testing.T) {
	k := fleetlab.FleetKernelVXLAN()
	pool := append(fleetlab.FleetVMs(), k.Backend("kvx3", 3, 2))
	for _, mux := range []int{0, 1} {
		t.Run(fmt.Sprintf("mux%d", mux), func(t *testing.T) {
			d := fleetlab.FleetDoc(1, mux, true, testServices, pool)
			d.Hosts = append(d.Hosts, k.Host())
			want := d.Document()
			text, err := d.Marshal()
			require.NoError(t, err)
			got, err := control.Parse(text)
			require.NoError(t, err, "%s", text)
			require.Equal(t, want, got, "%s", text)

			require.Len(t, got.Hosts, fleetlab.FleetHosts, "only the Host Agents' hosts are listed")
			_, listed := got.Host(k.Addr.String())
			require.False(t, listed, "host3 in the hosts section")
			for _, v := range got.VIPs {
				b := v.Backends[len(v.Backends)-1]
				require.Equal(t, control.Backend{Name: "kvx3", Address: k.Addr, Port: 0, MAC: [6]byte(k.MAC),
					Host: k.Addr, Weight: 2}, b, "%s's kernel VXLAN backend", v.Name)
				require.NotZero(t, v.Backends[0].Port, "%s: the VMs behind Host Agents keep their DIP port", v.Name)
			}
		})
	}
}

// readmeKernelVXLAN is the host of the README's "Backends without a Host
// Agent" section.
var readmeKernelVXLAN = fleetlab.KernelVXLAN{Name: "host-3", Addr: netip.MustParseAddr("198.19.0.3"), Uplink: "eth0",
	VNI: 100, MAC: net.HardwareAddr{2, 0, 0, 0, 3, 0}, VIPs: []netip.Addr{netip.MustParseAddr("198.18.100.1")}}

// TestReadmeKernelVXLANRecipe keeps the README's recipe and the one the
// lab and the tests run (KernelVXLAN.Commands and Sysctls) the same.
func TestReadmeKernelVXLANRecipe(t *testing.T) {
	b, err := os.ReadFile("../../../README.md")
	require.NoError(t, err)
	readme := string(b)
	_, section, ok := strings.Cut(readme, "## Backends without a Host Agent")
	require.True(t, ok, "README has no section \"Backends without a Host Agent\"")
	section, _, _ = strings.Cut(section, "\n## ")
	for _, c := range readmeKernelVXLAN.Commands() {
		line := "ip " + strings.Join(c, " ") + "\n"
		require.True(t, strings.Contains(section, line), "the README's recipe lacks %q", line)
	}
	for _, kv := range readmeKernelVXLAN.Sysctls() {
		line := "sysctl -w " + kv[0] + "=" + kv[1] + "\n"
		require.True(t, strings.Contains(section, line), "the README's recipe lacks %q", line)
	}
}
