package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
)

const doc1 = `version: 1
bgp:
  asn: 65010
nodes:
  mux-1:
    bgp: {router_id: 198.18.0.11}
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    probe: {type: tcp}
    backends:
      - {name: vm-a, address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}
hosts:
  - name: host-1
    address: 198.19.0.1
    vms:
      - {vni: 100, address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm-a}
`

func ctl(t *testing.T, endpoint string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	rc := run(append([]string{"-etcd", endpoint}, args...), &out, &errb)
	return rc, out.String(), errb.String()
}

func TestXdplbctl(t *testing.T) {
	dir := t.TempDir()
	c := etcdlab.NewCluster(dir, 1)
	e, err := c.Start(0, 30*time.Second)
	require.NoError(t, err)
	defer e.Close()
	ep := c.Endpoints()[0]
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
		return p
	}

	// Invalid: refused with file:line:column and field; nothing written.
	bad := write("bad.yaml", strings.Replace(doc1, "port: 80", "port: 80000", 1))
	rc, _, stderr := ctl(t, ep, "apply", "-f", bad)
	assert.Equal(t, 1, rc)
	assert.Contains(t, stderr, "bad.yaml:11:11: vips[0].port: 80000 is out of range")
	rc, _, stderr = ctl(t, ep, "get")
	assert.Equal(t, 1, rc, "nothing was written")
	assert.Contains(t, stderr, "no document yet")

	good := write("fleet.yaml", doc1)
	rc, out, stderr := ctl(t, ep, "diff", "-f", good)
	require.Equal(t, 0, rc, stderr)
	assert.Contains(t, out, "version 0 -> 1")
	assert.Contains(t, out, "+ vip web 198.18.100.1 tcp/80 vni 100, 1 backends")
	rc, out, stderr = ctl(t, ep, "apply", "-f", good)
	require.Equal(t, 0, rc, stderr)
	assert.Contains(t, out, "applied version 1")

	// The same version again: stale, refused, exit status 3.
	again := write("again.yaml", strings.Replace(doc1, "vni: 100\n    probe", "vni: 100\n    distribution: 3-tuple\n    probe", 1))
	rc, _, stderr = ctl(t, ep, "apply", "-f", again)
	assert.Equal(t, 3, rc)
	assert.Contains(t, stderr, "version 1 is not above the fleet's version 1")

	v2 := write("v2.yaml", strings.Replace(strings.Replace(doc1, "version: 1", "version: 2", 1),
		"      - {name: vm-a", "      - {name: vm-b, address: 198.19.1.2, mac: \"02:00:00:00:01:02\", host: 198.19.0.1}\n      - {name: vm-a", 1))
	rc, out, _ = ctl(t, ep, "diff", "-f", v2)
	require.Equal(t, 0, rc)
	assert.Equal(t, "version 1 -> 2\n+ vip web backend vm-b 198.19.1.2:0 on 198.19.0.1\n", out)

	// status: the document, no nodes yet, the VIP with no health report.
	rc, out, stderr = ctl(t, ep, "status")
	require.Equal(t, 0, rc, stderr)
	assert.Contains(t, out, "document: version 1 (revision")
	assert.Contains(t, out, "live: version 1: 0/0 Muxes, 0/0 hosts")
	assert.Regexp(t, `web\s+198.18.100.1 tcp/80 vni 100\s+vm-a\s+198.19.1.1:0\s+host-1\s+active\s+no report`, out)

	// A node reports; status counts it, and -o json says the same.
	cli, err := etcdlab.Client(c.Endpoints())
	require.NoError(t, err)
	defer cli.Close()
	rep, err := fleet.NewReporter(fleet.ReporterConfig{Client: cli, Role: fleet.RoleMux, Name: "mux-1",
		Status: func() fleet.NodeStatus { return fleet.NodeStatus{Version: 1, DataPath: "running"} }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rep.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool {
		_, out, _ := ctl(t, ep, "status")
		return strings.Contains(out, "live: version 1: 1/1 Muxes, 0/0 hosts")
	}, 20*time.Second, 50*time.Millisecond)
	rc, out, _ = ctl(t, ep, "status", "-o", "json")
	require.Equal(t, 0, rc)
	var r fleet.StatusReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Len(t, r.Nodes, 1)
	assert.Equal(t, "mux-1", r.Nodes[0].Name)
	assert.Equal(t, "running", r.Nodes[0].DataPath)
	assert.Equal(t, "no report", r.VIPs[0].Backends[0].Health)
}

const outboundDoc = `version: 1
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    backends:
      - {name: vm-a, address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}
hosts:
  - name: host-1
    address: 198.19.0.1
    vms:
      - {vni: 100, address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm-a}
      - {vni: 100, address: 198.19.1.2, mac: "02:00:00:00:01:02", interface: vm-b}
outbound:
  - address: 198.18.100.1
    vni: 100
    dips: [198.19.1.1, 198.19.1.2]
    ports: 1024-2047
    unit: 64
    static: [{dip: 198.19.1.2, ports: 1024-1087}]
`

// TestXdplbctlOutbound: status shows each outbound VIP's pool and every
// DIP's ranges, claimed (by a Host Agent's PortAllocator) and static;
// -o json says the same.
func TestXdplbctlOutbound(t *testing.T) {
	dir := t.TempDir()
	c := etcdlab.NewCluster(dir, 1)
	e, err := c.Start(0, 30*time.Second)
	require.NoError(t, err)
	defer e.Close()
	ep := c.Endpoints()[0]
	p := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(p, []byte(outboundDoc), 0o600))
	rc, _, stderr := ctl(t, ep, "apply", "-f", p)
	require.Equal(t, 0, rc, stderr)
	doc, err := control.Load(p)
	require.NoError(t, err)

	cli, err := etcdlab.Client(c.Endpoints())
	require.NoError(t, err)
	defer cli.Close()
	a, err := fleet.NewPortAllocator(fleet.PortAllocatorConfig{Client: cli, Host: "host-1", MinRanges: 2})
	require.NoError(t, err)
	a.SetDIPs(fleet.OutboundDIPs(doc, "host-1"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { return len(a.Allocations()) == 3 }, 20*time.Second, 20*time.Millisecond)

	rc, out, stderr := ctl(t, ep, "status")
	require.Equal(t, 0, rc, stderr)
	assert.Regexp(t, `OUTBOUND\s+VNI\s+UNIT\s+UNITS\s+FREE\s+HELD\s+STATIC\s+GUARDED\n198.18.100.1\s+100\s+64\s+16\s+12\s+3\s+1\s+0\n`, out)
	assert.Regexp(t, `198.18.100.1\s+198.19.1.1\s+host-1\s+128\s+\d+-\d+, \d+-\d+\n`, out)
	assert.Regexp(t, `198.18.100.1\s+198.19.1.2\s+host-1\s+128\s+1024-1087 \(static\), \d+-\d+\n`, out)

	rc, out, _ = ctl(t, ep, "status", "-o", "json")
	require.Equal(t, 0, rc)
	var r fleet.StatusReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Len(t, r.Outbound, 1)
	o := r.Outbound[0]
	assert.Equal(t, []int{16, 12, 3, 1, 0}, []int{o.Units, o.Free, o.Held, o.Static, o.Guarded})
	require.Len(t, o.Holders, 2)
	assert.Equal(t, "198.19.1.2", o.Holders[1].DIP)
	assert.Equal(t, "1024-1087 (static)", o.Holders[1].Ranges[0])
}
