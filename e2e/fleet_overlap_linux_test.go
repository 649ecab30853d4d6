package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// The overlapping-tenants fleet (TestFleetOverlappingTenants): two
// tenants' VMs with one address on one host, each behind a VIP of its
// own, the fleet run from etcd.
//
//	client1 [up 198.18.11.2] ─ [c1 198.18.11.1] ┐
//	mux1    [up 198.18.1.2]  ─ [m1 198.18.1.1]  ├ router (BIRD 2: eBGP with both Muxes, ECMP on L4)
//	mux2    [up 198.18.2.2]  ─ [m2 198.18.2.1]  ┤
//	host1   [up 198.18.21.2] ─ [h1 198.18.21.1] ┘
//	  host1 [vm1] ─ [eth0 198.18.31.1, 02:00:00:00:31:01] ten100a (VNI 100)
//	  host1 [vm2] ─ [eth0 198.18.31.2, 02:00:00:00:31:02] ten100b (VNI 100)
//	  host1 [vm3] ─ [eth0 198.18.31.1, 02:00:00:00:31:03] ten200  (VNI 200)
//
// The host routes 198.18.31.1 to vm1 (WireVM); ten200 has the same
// address (WireTenantVM): only what the Host Agent delivers on vm3, and
// its probes bound to vm3, reach it. Every VM serves HTTP on 8080 and
// answers with its name.
//
// The document (ovDocument) is one for every node — the Muxes' router
// ids and peers in its nodes section — and lives in an etcd member
// embedded in the test, on a Unix socket every namespace reaches. It is
// written with the xdplbctl binary; every node reads it with -etcd and
// reports there; the Host Agent probes its DIPs through their VM ports
// and publishes the verdicts, which the Muxes follow instead of probing.
const ovDocument = `version: 1
hash_seed: 0x5eed1234
infra_prefixes: [198.18.1.0/24, 198.18.2.0/24]
mux_prefixes: [198.18.1.2/32, 198.18.2.2/32]
bgp:
  asn: 65010
  hold_time: 9s
  withdraw_grace: 1s
nodes:
  mux1:
    bgp: {router_id: 198.18.1.2, peers: [{address: 198.18.1.1, asn: 65000}]}
  mux2:
    bgp: {router_id: 198.18.2.2, peers: [{address: 198.18.2.1, asn: 65000}]}
vips:
  - name: web100
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    probe: {type: http, path: /healthz, interval: 500ms, timeout: 400ms, rise: 1, fall: 3}
    backends:
      - {name: ten100a, address: 198.18.31.1, port: 8080, mac: "02:00:00:00:31:01", host: 198.18.21.2}
      - {name: ten100b, address: 198.18.31.2, port: 8080, mac: "02:00:00:00:31:02", host: 198.18.21.2}
  - name: web200
    address: 198.18.100.2
    protocol: tcp
    port: 80
    vni: 200
    probe: {type: tcp, interval: 500ms, timeout: 400ms, rise: 1, fall: 3}
    backends:
      - {name: ten200, address: 198.18.31.1, port: 8080, mac: "02:00:00:00:31:03", host: 198.18.21.2}
hosts:
  - name: host1
    address: 198.18.21.2
    vms:
      - {vni: 100, address: 198.18.31.1, mac: "02:00:00:00:31:01", interface: vm1}
      - {vni: 100, address: 198.18.31.2, mac: "02:00:00:00:31:02", interface: vm2}
      - {vni: 200, address: 198.18.31.1, mac: "02:00:00:00:31:03", interface: vm3}
`

const ovMetrics = 9100

var (
	ovVIP100 = netip.MustParseAddr("198.18.100.1")
	ovVIP200 = netip.MustParseAddr("198.18.100.2")
	ovDIP    = netip.MustParseAddr("198.18.31.1") // both tenants'
	ovVMs    = []fleetlab.VM{
		{Name: "ten100a", Host: 1, Port: "vm1", Addr: ovDIP, MAC: net.HardwareAddr{2, 0, 0, 0, 0x31, 1}},
		{Name: "ten100b", Host: 1, Port: "vm2", Addr: netip.MustParseAddr("198.18.31.2"), MAC: net.HardwareAddr{2, 0, 0, 0, 0x31, 2}},
		{Name: "ten200", Host: 1, Port: "vm3", Addr: ovDIP, MAC: net.HardwareAddr{2, 0, 0, 0, 0x31, 3}},
	}
)

// TestFleetOverlappingTenants runs a fleet from etcd — two Muxes, a Host
// Agent, BIRD — whose host has two tenants' VMs with one address:
// ten100a in VNI 100 behind VIP 198.18.100.1 (with ten100b beside it) and
// ten200 in VNI 200 behind VIP 198.18.100.2. With traffic to both VIPs,
// ten100a's server stops. Then:
//
//   - both Muxes take ten100a out of service (xdplb_backend_up 0), and
//     new flows to its VIP all go to ten100b: every request is answered,
//     by ten100b, and ten100a's new-flow counters stand still;
//   - ten200, same address, other VNI, stays in service on both Muxes,
//     and VIP 198.18.100.2's requests — sent all along, each on a new
//     connection — are all answered by ten200 (0 failures);
//   - xdplbctl status (the binary) shows ten100a down and ten200 up,
//     and -o json says the same.
//
// When ten100a serves again, it is back in service on both Muxes and in
// xdplbctl status, and answers through its VIP again. Everything is
// removed at cleanup, also when the test fails.
func TestFleetOverlappingTenants(t *testing.T) {
	lab := netlab.New(t, "ovl")
	fleetlabtest.RequireBIRD(t, "the fleet test of overlapping tenants")
	began := time.Now()
	fleetlabtest.Examples(t)
	built := time.Now()
	l := newOvLab(t, lab)

	// Everything up (newOvLab: both Muxes take new flows to all three
	// backends), and each VM answers through its VIP.
	for _, want := range []struct {
		vip netip.Addr
		vm  string
	}{{ovVIP100, "ten100a"}, {ovVIP100, "ten100b"}, {ovVIP200, "ten200"}} {
		fleetlabtest.WaitFor(t, fmt.Sprintf("a first answer from %s through %v", want.vm, want.vip), 30*time.Second, func() bool {
			name, err := l.get(want.vip, "warm")
			return err == nil && name == want.vm
		})
	}
	l.requireStatus(map[string]string{"ten100a": "up", "ten100b": "up", "ten200": "up"})
	t.Logf("fleet ready after %v (and %v building the binaries)", time.Since(built).Round(time.Millisecond),
		built.Sub(began).Round(time.Millisecond))

	// Traffic to both VIPs, from now to the end, a new connection per
	// request; VIP 198.18.100.1's reaches both its VMs before ten100a stops.
	began2 := time.Now()
	vni100, vni200 := l.startTraffic(ovVIP100), l.startTraffic(ovVIP200)
	vni100.waitAnswers(t, began2, "ten100a", 5, "through 198.18.100.1 before it stops")
	vni100.waitAnswers(t, began2, "ten100b", 5, "through 198.18.100.1 before ten100a stops")

	// ten100a's server stops.
	stopped := time.Now()
	require.NoError(t, l.servers["ten100a"].Close())
	l.servers["ten100a"] = nil
	l.waitBackends("ten100a out of service on both Muxes, ten100b and ten200 in",
		map[string]float64{"ten100a": 0, "ten100b": 1, "ten200": 1})
	down := time.Now()
	flows0 := l.newFlows("web100", "ten100a")
	refused := 0
	for _, r := range vni100.between(stopped, down) {
		if r.err != nil {
			refused++
		}
	}
	t.Logf("ten100a out of service on both Muxes %v after its server stopped; meanwhile %d requests to 198.18.100.1 failed (new flows still placed on ten100a)",
		down.Sub(stopped).Round(time.Millisecond), refused)
	l.requireStatus(map[string]string{"ten100a": "down", "ten100b": "up", "ten200": "up"})

	// New flows to VIP 198.18.100.1 go to ten100b only: every request
	// started since is answered by ten100b — 40 of them would all land
	// there by chance with probability 2⁻⁴⁰, were ten100a in service —
	// and no Mux places a flow on ten100a.
	vni100.waitAnswers(t, down, "ten100b", 40, "through 198.18.100.1 with ten100a down")
	vni200.waitAnswers(t, down, "ten200", 20, "through 198.18.100.2 with ten100a down")
	require.Equal(t, flows0, l.newFlows("web100", "ten100a"), "new flows placed on ten100a while it is down")
	restart := time.Now()
	requireAll(t, vni100.between(down, restart), "ten100b", "198.18.100.1 with ten100a out of service")

	// ten100a serves again: back in service, in status, and answering.
	l.serve("ten100a")
	l.waitBackends("ten100a back in service on both Muxes", map[string]float64{"ten100a": 1, "ten100b": 1, "ten200": 1})
	l.requireStatus(map[string]string{"ten100a": "up", "ten100b": "up", "ten200": "up"})
	vni100.waitAnswers(t, restart, "ten100a", 5, "through 198.18.100.1 again")
	vni200.waitAnswers(t, restart, "ten200", 20, "through 198.18.100.2 with ten100a back")

	vni100.stop()
	vni200.stop()
	requireAll(t, vni200.between(began2, time.Time{}), "ten200",
		"198.18.100.2 all along, while ten100a ran, stopped and came back")
	t.Logf("test ran %v", time.Since(began).Round(time.Millisecond))
}

// ovLab is the running fleet of TestFleetOverlappingTenants.
type ovLab struct {
	t       *testing.T
	client  *netlab.NS
	muxes   [2]*netlab.NS
	host    *netlab.NS
	vms     map[string]*netlab.NS
	servers map[string]*fleetlab.VMServer
	ctl     string // the xdplbctl binary
	etcd    string // the etcd endpoint
	port    atomic.Uint32
}

// newOvLab builds the topology, starts etcd and applies the document with
// xdplbctl, then starts BIRD, the Muxes and the Host Agent, and returns
// once xdplbctl status shows every node running version 1, both Muxes
// have every backend in service, and the router routes both VIPs over
// both Muxes.
func newOvLab(t *testing.T, lab *netlab.Lab) *ovLab {
	t.Helper()
	l := &ovLab{t: t, vms: map[string]*netlab.NS{}, servers: map[string]*fleetlab.VMServer{}}
	l.port.Store(10000 - 1) // see get
	star, err := fleetlab.NewStar(lab)
	require.NoError(t, err)
	l.client, err = star.Attach("client1", "c1", 11)
	require.NoError(t, err)
	for i := range l.muxes {
		l.muxes[i], err = star.Attach(fmt.Sprintf("mux%d", i+1), fmt.Sprintf("m%d", i+1), i+1)
		require.NoError(t, err)
	}
	l.host, err = star.Attach("host1", "h1", 21)
	require.NoError(t, err)
	for _, vm := range ovVMs {
		n, err := lab.Namespace(vm.Name)
		require.NoError(t, err)
		l.vms[vm.Name] = n
		wire := fleetlab.WireVM
		if vm.Name == "ten200" {
			wire = fleetlab.WireTenantVM // the host routes ovDIP to ten100a
		}
		require.NoError(t, wire(lab, l.host, n, vm, fleetlab.FleetGateway), vm.Name)
		l.serve(vm.Name)
	}
	t.Cleanup(func() {
		for _, s := range l.servers {
			if s != nil {
				s.Close()
			}
		}
	})

	// etcd, embedded, on a Unix socket; stopped after the nodes (cleanups
	// run last first), so they revoke their leases on the way out.
	dir := t.TempDir()
	cluster := etcdlab.NewCluster(dir, 1)
	e, err := cluster.Start(0, 30*time.Second)
	require.NoError(t, err)
	t.Cleanup(e.Close)
	l.etcd = cluster.Endpoints()[0]
	bin := fleetlabtest.Examples(t)
	l.ctl = filepath.Join(bin, "xdplbctl")
	doc := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(doc, []byte(ovDocument), 0o644))
	out, err := l.xdplbctl("apply", "-f", doc)
	require.NoError(t, err, out)
	require.Contains(t, out, "applied version 1")

	bird := fleetlabtest.StartBIRD(t, star.Router, fleetlab.FleetBIRD())
	for i, n := range l.muxes {
		name := fmt.Sprintf("mux%d", i+1)
		fleetlabtest.Start(t, n, name, filepath.Join(bin, "mux"), "-interface", "up", "-etcd", l.etcd, "-node", name,
			"-conns", "65536", "-metrics", netip.AddrPortFrom(fleetlab.FleetMuxAddr(i+1), ovMetrics).String())
	}
	fleetlabtest.Start(t, l.host, "host1", filepath.Join(bin, "hostagent"), "-uplink", "up", "-etcd", l.etcd, "-host", "host1",
		"-conns", "65536", "-metrics", netip.AddrPortFrom(fleetlab.FleetHostAddr(1), ovMetrics).String())

	fleetlabtest.WaitFor(t, "xdplbctl status: version 1 live on every node", 30*time.Second, func() bool {
		r, err := l.status()
		if err != nil || r.Live != "version 1: 2/2 Muxes, 1/1 hosts" {
			return false
		}
		for _, n := range r.Nodes {
			if n.DataPath != "running" || n.LastError != "" {
				return false
			}
		}
		return true
	})
	l.waitBackends("every backend in service on both Muxes", map[string]float64{"ten100a": 1, "ten100b": 1, "ten200": 1})
	for _, vip := range []netip.Addr{ovVIP100, ovVIP200} {
		fleetlabtest.WaitNextHops(t, star.Router, bird, 30*time.Second, netip.PrefixFrom(vip, 32),
			fleetlab.FleetMuxAddr(1), fleetlab.FleetMuxAddr(2))
	}
	return l
}

// serve starts the HTTP server of the VM called name.
func (l *ovLab) serve(name string) {
	l.t.Helper()
	s, err := fleetlab.ServeVM(l.vms[name], name, ovDIPOf(name), 8080, 0)
	require.NoError(l.t, err)
	l.servers[name] = s
}

// xdplbctl runs the xdplbctl binary against the fleet's etcd and returns
// its standard output; an exit status other than 0 is an error carrying
// its standard error.
func (l *ovLab) xdplbctl(args ...string) (string, error) {
	var out, errb bytes.Buffer
	cmd := exec.Command(l.ctl, append([]string{"-etcd", l.etcd}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("xdplbctl %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// status runs xdplbctl status -o json.
func (l *ovLab) status() (fleet.StatusReport, error) {
	var r fleet.StatusReport
	out, err := l.xdplbctl("status", "-o", "json")
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal([]byte(out), &r)
}

// ovRow matches the table row of xdplbctl status for the backend called
// name, capturing its health.
func ovRow(name string) *regexp.Regexp {
	service := map[string]string{"web100": `198\.18\.100\.1 tcp/80 vni 100`, "web200": `198\.18\.100\.2 tcp/80 vni 200`}
	vip := ovVIPOf(name)
	return regexp.MustCompile(`(?m)^` + vip + `\s+` + service[vip] + `\s+` + name + `\s+` +
		regexp.QuoteMeta(netip.AddrPortFrom(ovDIPOf(name), 8080).String()) + `\s+host1\s+active\s+(\S.*?)\s*$`)
}

// requireStatus waits until xdplbctl status shows each backend of want
// with the health given ("up", or "down" for any "down: <why>"), in its
// table and in -o json alike.
func (l *ovLab) requireStatus(want map[string]string) {
	t := l.t
	t.Helper()
	healthIs := func(got, want string) bool {
		return got == want || (want == "down" && strings.HasPrefix(got, "down"))
	}
	var last string
	err := fleetlab.Poll(context.Background(), fmt.Sprintf("xdplbctl status showing %v", want), 30*time.Second, func() bool {
		out, err := l.xdplbctl("status")
		if err != nil {
			last = err.Error()
			return false
		}
		last = out
		for name, h := range want {
			m := ovRow(name).FindStringSubmatch(out)
			if m == nil || !healthIs(m[1], h) {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("%v; it showed last:\n%s", err, last)
	}
	t.Logf("xdplbctl status:\n%s", last)
	// -o json, read right after, says the same.
	r, err := l.status()
	require.NoError(t, err)
	type row struct {
		vip string
		fleet.BackendReport
	}
	got := map[string]row{}
	for _, v := range r.VIPs {
		for _, b := range v.Backends {
			got[b.Name] = row{v.Name, b}
		}
	}
	for name, h := range want {
		g, ok := got[name]
		require.True(t, ok, "%s missing from xdplbctl status -o json: %+v", name, r.VIPs)
		require.Equal(t, []string{ovVIPOf(name), netip.AddrPortFrom(ovDIPOf(name), 8080).String(), "host1", "active"},
			[]string{g.vip, g.DIP, g.Host, g.State}, name)
		require.True(t, healthIs(g.Health, h), "%s: health %q in xdplbctl status -o json, want %s", name, g.Health, h)
	}
}

// ovVIPOf and ovDIPOf return the VIP name and the DIP of the VM called
// name.
func ovVIPOf(name string) string {
	if strings.HasPrefix(name, "ten100") {
		return "web100"
	}
	return "web200"
}

func ovDIPOf(name string) netip.Addr {
	for _, vm := range ovVMs {
		if vm.Name == name {
			return vm.Addr
		}
	}
	panic(name)
}

func (l *ovLab) muxMetrics(i int) (map[string]float64, error) {
	return fleetlab.Scrape(l.muxes[i], netip.AddrPortFrom(fleetlab.FleetMuxAddr(i+1), ovMetrics))
}

func ovBackendUp(name string) string {
	return fmt.Sprintf(`xdplb_backend_up{backend=%q,vip=%q}`, name, ovVIPOf(name))
}

// waitBackends waits until both Muxes show xdplb_backend_up as want says
// for each backend; when they do not within the hang guard, the test
// fails with what they showed last.
func (l *ovLab) waitBackends(what string, want map[string]float64) {
	l.t.Helper()
	var last [2]map[string]float64
	err := fleetlab.Poll(context.Background(), what, 30*time.Second, func() bool {
		match := true
		for i := range l.muxes {
			m, err := l.muxMetrics(i)
			if err != nil {
				return false
			}
			last[i] = map[string]float64{}
			for name, up := range want {
				v, ok := m[ovBackendUp(name)]
				if !ok {
					v = -1
				}
				last[i][name] = v
				match = match && v == up
			}
		}
		return match
	})
	if err != nil {
		l.t.Fatalf("%v: xdplb_backend_up on mux1 %v, on mux2 %v (-1: missing)", err, last[0], last[1])
	}
}

// newFlows returns the flows both Muxes together placed on the backend of
// vip.
func (l *ovLab) newFlows(vip, backend string) float64 {
	l.t.Helper()
	var sum float64
	for i := range l.muxes {
		m, err := l.muxMetrics(i)
		require.NoError(l.t, err)
		sum += m[fmt.Sprintf(`xdplb_backend_new_flows_total{backend=%q,vip=%q}`, backend, vip)]
	}
	return sum
}

// get sends GET /?q=token to vip:80 on a new connection from a client
// port never used before in this lab (from 10000 up, below the ephemeral
// range: every request is a new flow for the Muxes), and returns the name
// of the VM that answered; the answer must echo the token.
func (l *ovLab) get(vip netip.Addr, token string) (string, error) {
	port := l.port.Add(1)
	if port >= 30000 {
		panic("ovLab: out of client ports")
	}
	const timeout = 5 * time.Second
	var c net.Conn
	err := l.client.Do(func() (err error) {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(fleetlab.FleetClientAddr(1), uint16(port))),
			Timeout: timeout}
		c, err = d.Dial("tcp4", netip.AddrPortFrom(vip, 80).String())
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if _, err := fmt.Fprintf(c, "GET /?q=%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", token, vip); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", err
	}
	name, got, ok := strings.Cut(string(body), " ")
	if resp.StatusCode != http.StatusOK || !ok || got != token {
		return "", fmt.Errorf("%s: answer %q to token %q", resp.Status, body, token)
	}
	return name, nil
}

// ovTraffic is a stream of requests to one VIP, one after another, each
// on a new connection, and what became of each.
type ovTraffic struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	results []ovResult
}

// ovResult is one request of an ovTraffic: when it started, and the VM
// that answered or why none did.
type ovResult struct {
	start time.Time
	vm    string
	err   error
}

// startTraffic sends requests to vip until stop (or the test's end).
func (l *ovLab) startTraffic(vip netip.Addr) *ovTraffic {
	ctx, cancel := context.WithCancel(context.Background())
	tr := &ovTraffic{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		for i := 0; ctx.Err() == nil; i++ {
			start := time.Now()
			name, err := l.get(vip, fmt.Sprintf("s%d", i))
			tr.mu.Lock()
			tr.results = append(tr.results, ovResult{start, name, err})
			tr.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	l.t.Cleanup(tr.stop)
	return tr
}

// stop ends the stream and waits for its last request.
func (tr *ovTraffic) stop() {
	tr.cancel()
	<-tr.done
}

// between returns the requests started at from or later and before to
// (the zero time: no end).
func (tr *ovTraffic) between(from, to time.Time) []ovResult {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []ovResult
	for _, r := range tr.results {
		if !r.start.Before(from) && (to.IsZero() || r.start.Before(to)) {
			out = append(out, r)
		}
	}
	return out
}

// waitAnswers waits until the requests started from from on include n
// answered by vm.
func (tr *ovTraffic) waitAnswers(t *testing.T, from time.Time, vm string, n int, what string) {
	t.Helper()
	fleetlabtest.WaitFor(t, fmt.Sprintf("%d answers from %s %s", n, vm, what), 30*time.Second, func() bool {
		k := 0
		for _, r := range tr.between(from, time.Time{}) {
			if r.err == nil && r.vm == vm {
				k++
			}
		}
		return k >= n
	})
}

// requireAll fails the test unless every request of rs was answered by
// vm, and says how many there were.
func requireAll(t *testing.T, rs []ovResult, vm, what string) {
	t.Helper()
	failed := 0
	var first error
	for i, r := range rs {
		err := r.err
		if err == nil && r.vm != vm {
			err = fmt.Errorf("answered by %s, not %s", r.vm, vm)
		}
		if err != nil {
			if failed++; first == nil {
				first = fmt.Errorf("request %d of %d: %w", i, len(rs), err)
			}
		}
	}
	t.Logf("%s: %d requests, %d failed", what, len(rs), failed)
	require.Zero(t, failed, "%s: the first failure: %v", what, first)
}
