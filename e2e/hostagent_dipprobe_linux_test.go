package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// The DIP probe topology (TestHostAgentProbesDIPs): one host, two
// tenants' VMs with the same address behind two VM ports.
//
//	host [up 198.18.3.2] ── [h 198.18.3.1] router
//	  host [vm_a] ── [eth0 198.18.4.1/32, 02:00:00:00:04:01] vmten100  (VNI 100, HTTP :8080)
//	  host [vm_t] ── [eth0 198.18.4.1/32, 02:00:00:00:04:02] vmten200  (VNI 200, HTTP :8080)
//
// The host routes 198.18.4.1 to vm_a (as WireVM does); it cannot route the
// same address to vm_t too, so only a probe bound to vm_t reaches the
// VNI 200 VM. Both VMs resolve their gateway (198.18.4.254, on both
// host-side veths) by ARP and keep the kernel's offloads.
const dipProbeDoc = `version: 1
infra_prefixes: [198.18.1.0/24]
mux_prefixes: [198.18.1.2/32]
vips:
  - name: web100
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    probe: {type: http, path: /healthz, interval: 300ms, timeout: 1s, rise: 2, fall: 2}
    backends:
      - {name: ten100, address: 198.18.4.1, port: 8080, mac: "02:00:00:00:04:01", host: 198.18.3.2}
  - name: web200
    address: 198.18.100.2
    protocol: tcp
    port: 80
    vni: 200
    probe: {type: tcp, interval: 300ms, timeout: 1s, rise: 2, fall: 2}
    backends:
      - {name: ten200, address: 198.18.4.1, port: 8080, mac: "02:00:00:00:04:02", host: 198.18.3.2}
hosts:
  - name: host-1
    address: 198.18.3.2
    vms:
      - {vni: 100, address: 198.18.4.1, mac: "02:00:00:00:04:01", interface: vm_a}
      - {vni: 200, address: 198.18.4.1, mac: "02:00:00:00:04:02", interface: vm_t}
`

// TestHostAgentProbesDIPs runs examples/hostagent with -probe-dips on a
// host whose two VMs, in VNI 100 and VNI 200, have the same address and
// serve the same probe port (HTTP probe for one, TCP for the other). The
// agent probes each through its own VM port: both come up; when one VM's
// server stops, exactly that one goes down and the other stays up; when
// it serves again it comes back. Each VM in turn, so the VM the host's
// routes do not lead to is covered as well as the one they do. The
// probes' answers match the VM ports' steering rules (DIP:8080 serves a
// VIP) and reach the kernel because the host's own address, where the
// probes come from, is an infrastructure address.
func TestHostAgentProbesDIPs(t *testing.T) {
	lab := netlab.New(t, "dipprobe")
	star, err := fleetlab.NewStar(lab)
	require.NoError(t, err)
	host, err := star.Attach("host", "h", 3)
	require.NoError(t, err)
	gw := netip.MustParseAddr(haGateway)
	dip := netip.MustParseAddr("198.18.4.1")

	type tenant struct {
		vni  int
		name string
		port string
		mac  net.HardwareAddr
		ns   *netlab.NS
		srv  *fleetlab.VMServer
	}
	tenants := []*tenant{
		{vni: 100, name: "vmten100", port: "vm_a", mac: net.HardwareAddr{2, 0, 0, 0, 4, 1}},
		{vni: 200, name: "vmten200", port: "vm_t", mac: net.HardwareAddr{2, 0, 0, 0, 4, 2}},
	}
	for i, tn := range tenants {
		tn.ns, err = lab.Namespace(tn.name)
		require.NoError(t, err)
		vm := fleetlab.VM{Name: tn.name, Host: 1, Port: tn.port, Addr: dip, MAC: tn.mac}
		if i == 0 {
			require.NoError(t, fleetlab.WireVM(lab, host, tn.ns, vm, gw))
		} else {
			require.NoError(t, fleetlab.WireTenantVM(lab, host, tn.ns, vm, gw))
		}
	}
	serve := func(tn *tenant) {
		tn.srv, err = fleetlab.ServeVM(tn.ns, tn.name, dip, 8080, 0)
		require.NoError(t, err)
	}
	for _, tn := range tenants {
		serve(tn)
	}
	t.Cleanup(func() {
		for _, tn := range tenants {
			if tn.srv != nil {
				tn.srv.Close()
			}
		}
	})

	dir := t.TempDir()
	conf := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(conf, []byte(dipProbeDoc), 0o644))
	bin := fleetlabtest.Examples(t)
	metrics := netip.AddrPortFrom(netip.MustParseAddr(haHost), haHostMet)
	fleetlabtest.Start(t, host, "hostagent", filepath.Join(bin, "hostagent"), "-uplink", "up", "-host", "host-1",
		"-metrics", metrics.String(), "-conns", "4096", "-probe-dips", "-config", conf)

	health := func(vni int) string {
		return fmt.Sprintf(`xdplb_dip_health{dip="198.18.4.1",port="8080",vni="%d"}`, vni)
	}
	const missing = -1 // not a value the gauge takes
	verdicts := func() (map[int]float64, map[string]float64) {
		m, err := fleetlab.Scrape(host, metrics)
		if err != nil {
			return nil, nil
		}
		out := map[int]float64{}
		for _, tn := range tenants {
			v, ok := m[health(tn.vni)]
			if !ok {
				v = missing
			}
			out[tn.vni] = v
		}
		return out, m
	}
	waitVerdicts := func(what string, want map[int]float64) {
		t.Helper()
		waitFor(t, what, 30*time.Second, func() bool {
			got, m := verdicts()
			return got != nil && m["xdplb_datapath_up"] == 1 && got[100] == want[100] && got[200] == want[200]
		})
	}
	waitVerdicts("both tenants' DIPs up", map[int]float64{100: 1, 200: 1})

	for _, down := range tenants {
		t.Run(fmt.Sprintf("VNI%dStops", down.vni), func(t *testing.T) {
			require.NoError(t, down.srv.Close())
			down.srv = nil
			want := map[int]float64{100: 1, 200: 1}
			want[down.vni] = 0
			waitVerdicts(fmt.Sprintf("VNI %d down, the other up", down.vni), want)
			// The other tenant's DIP keeps passing its probes meanwhile:
			// more rounds of its probes do not move it.
			other := tenants[0]
			if other == down {
				other = tenants[1]
			}
			answers := fmt.Sprintf(`xdplb_steer_packets_total{interface=%q,outcome="infra"}`, other.port)
			m0, err := fleetlab.Scrape(host, metrics)
			require.NoError(t, err)
			waitFor(t, "more probe answers from the other tenant", 30*time.Second, func() bool {
				m, err := fleetlab.Scrape(host, metrics)
				return err == nil && m[answers] >= m0[answers]+6
			})
			got, _ := verdicts()
			require.Equal(t, want, got, "exactly VNI %d down", down.vni)

			serve(down)
			waitVerdicts(fmt.Sprintf("VNI %d up again", down.vni), map[int]float64{100: 1, 200: 1})
		})
	}
	_, m := verdicts()
	t.Logf("steering: %v", nonZero(m, "xdplb_steer_packets_total"))
	for _, port := range []string{"vm_a", "vm_t"} {
		require.Positive(t, m[fmt.Sprintf(`xdplb_steer_packets_total{interface=%q,outcome="infra"}`, port)],
			"%s: the probe answers matched a DIP rule and passed to the kernel for the infrastructure address", port)
	}
}
