package hostagent_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/hostagent"
)

// probeDoc: host-2 has 198.19.1.2 twice, in VNI 100 (vm2) and VNI 200
// (vm2t), both backends of probed VIPs; 198.19.1.3 backs two probed VIPs
// on the same probe port (probed once) and one without a probe.
const probeDoc = `version: 4
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    probe: {type: http, port: 8080, path: /healthz, interval: 2s, timeout: 5s, rise: 3, fall: 3}
    backends:
      - {address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}
      - {address: 198.19.1.2, mac: "02:00:00:00:01:02", host: 198.19.0.2}
      - {address: 198.19.1.3, mac: "02:00:00:00:01:03", host: 198.19.0.2}
  - name: web-too
    address: 198.18.100.4
    protocol: tcp
    port: 80
    vni: 100
    probe: {type: tcp, port: 8080}
    backends:
      - {address: 198.19.1.3, mac: "02:00:00:00:01:03", host: 198.19.0.2}
  - name: unprobed
    address: 198.18.100.2
    protocol: udp
    port: 53
    vni: 100
    backends:
      - {address: 198.19.1.3, mac: "02:00:00:00:01:03", host: 198.19.0.2}
  - name: other-tenant
    address: 198.18.100.3
    protocol: tcp
    port: 443
    vni: 200
    probe: {type: tcp}
    backends:
      - {address: 198.19.1.2, port: 8443, mac: "02:00:00:00:02:02", host: 198.19.0.2}
hosts:
  - name: host-1
    address: 198.19.0.1
    vms:
      - {vni: 100, address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm1}
  - name: host-2
    address: 198.19.0.2
    vms:
      - {vni: 100, address: 198.19.1.3, mac: "02:00:00:00:01:03", interface: vm3}
      - {vni: 100, address: 198.19.1.2, mac: "02:00:00:00:01:02", interface: vm2}
      - {vni: 200, address: 198.19.1.2, mac: "02:00:00:00:02:02", interface: vm2t}
`

func TestPlanProbes(t *testing.T) {
	doc := mustDoc(t, probeDoc)
	addr := netip.MustParseAddr
	web := health.Spec{Type: health.ProbeHTTP, Port: 8080, Path: "/healthz", Interval: 2 * time.Second,
		Timeout: 5 * time.Second, Rise: 3, Fall: 3}.WithDefaults()
	tcp := health.Spec{Type: health.ProbeTCP}.WithDefaults()
	p, err := hostagent.NewPlan(doc, "host-2", nil)
	require.NoError(t, err)
	assert.Equal(t, []hostagent.DIPProbe{
		{VNI: 100, Addr: addr("198.19.1.2"), Port: 8080, Interface: "vm2", Spec: web, VIP: "web", Backend: "198.19.1.2:0"},
		{VNI: 100, Addr: addr("198.19.1.3"), Port: 8080, Interface: "vm3", Spec: web, VIP: "web", Backend: "198.19.1.3:0"},
		{VNI: 200, Addr: addr("198.19.1.2"), Port: 8443, Interface: "vm2t", Spec: tcp, VIP: "other-tenant", Backend: "198.19.1.2:8443"},
	}, p.Probes)
	assert.Equal(t, health.VerdictKey{VNI: 200, Addr: addr("198.19.1.2"), Port: 8443}, p.Probes[2].Key())

	p1, err := hostagent.NewPlan(doc, "host-1", nil)
	require.NoError(t, err)
	assert.Equal(t, []hostagent.DIPProbe{
		{VNI: 100, Addr: addr("198.19.1.1"), Port: 8080, Interface: "vm1", Spec: web, VIP: "web", Backend: "198.19.1.1:0"},
	}, p1.Probes)
}
