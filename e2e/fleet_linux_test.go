package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// The fleet topology of the failover tests: the lab's (examples/lab,
// fleetlab.BuildFleet), driven by go test, with one client.
//
//	client [up 198.18.11.2] ─ [c1 198.18.11.1] ┐
//	mux1   [up 198.18.1.2]  ─ [m1 198.18.1.1]  ├ router (BIRD 2, eBGP with both Muxes,
//	mux2   [up 198.18.2.2]  ─ [m2 198.18.2.1]  ┤         ECMP hashed on L4: fib_multipath_hash_policy=1)
//	host1  [up 198.18.21.2] ─ [h1 198.18.21.1] ┤   host1: vm1 ─ vm11 (198.18.31.1), vm2 ─ vm12 (198.18.31.2),
//	host2  [up 198.18.22.2] ─ [h2 198.18.22.1] ┘          vm3 ─ vm13 (198.18.31.3, in no pool until a reload adds it)
//	                                                 host2: vm1 ─ vm21 (198.18.32.1), vm2 ─ vm22 (198.18.32.2)
//
// The VIP 198.18.100.1:80 (TCP, VNI 100) is served by the VMs' port 8080
// with the weights of fleetlab.FleetVMs (1:2:1:4), probed by TCP. Each VM
// runs an HTTP server whose answer to GET /?q=TOKEN is "NAME TOKEN": the
// client learns which VM answered which request. Keep-alive connections
// stay open as long as the client wants.
const (
	flVIPPort = 80
	flDIPPort = 8080
	flMetrics = 9100
)

var (
	flVIP    = fleetlab.FleetVIP
	flClient = fleetlab.FleetClientAddr(1)
)

// flProbe is the web VIP's probe: fast enough to keep the tests short,
// slow enough that a healthy DIP on a loaded CI machine never misses three
// 400 ms handshakes in a row. Its DownBound is 3.35 s, its UpBound 1.4 s.
var flProbe = health.Spec{Type: health.ProbeTCP, Interval: 500 * time.Millisecond,
	Timeout: 400 * time.Millisecond, Rise: 1, Fall: 3}

// flServices is the fleet's one VIP.
var flServices = []fleetlab.Service{{Name: "web", Addr: flVIP, Proto: flow.ProtoTCP, Port: flVIPPort,
	VNI: fleetlab.FleetVNI, DIPPort: flDIPPort, Probe: &flProbe}}

// flVMs are the backends of document version 1; flSpare is a VM that
// exists from the start but joins the pool only when a reload adds it.
var (
	flVMs   = fleetlab.FleetVMs()
	flSpare = fleetlab.VM{Name: "vm13", Host: 1, Port: "vm3", Addr: netip.MustParseAddr("198.18.31.3"),
		MAC: net.HardwareAddr{2, 0, 0, 0, 0x31, 3}, Weight: 2}
)

// flDocument is version v of the fleet's document with vms as the pool
// and the hosts' VMs. mux 0 gives the Host Agents' copy; mux 1 or 2 the
// copy of that Mux, with its node name and BGP session to the router.
func flDocument(v uint64, mux int, vms []fleetlab.VM) *fleetlab.Doc {
	return fleetlab.FleetDoc(v, mux, true, flServices, vms)
}

// fleetLab is the running fleet: namespaces, BIRD, two Muxes, two Host
// Agents, the VMs' servers, and the client.
type fleetLab struct {
	t        *testing.T
	dir      string
	fleet    *fleetlab.Fleet
	client   *netlab.NS
	router   *netlab.NS
	bird     *fleetlab.BIRD
	muxes    [2]*fleetlab.Proc
	agents   [2]*fleetlab.Proc
	hostConf string
	muxConf  [2]string
	version  uint64
	pool     []fleetlab.VM // the running document's pool

	port atomic.Uint32 // the last client port handed out

	// edit, when set, changes every document the lab writes (e.g. adds
	// outbound sections).
	edit func(*fleetlab.Doc)
}

// newFleetLab builds the topology, starts BIRD, the Muxes and the Host
// Agents with document version 1, and returns once the router routes the
// VIP over both Muxes, both Muxes see every backend up, both agents
// forward, and every VM has answered a request through the VIP. Everything
// is removed at cleanup, also when the test fails.
func newFleetLab(t *testing.T) *fleetLab { t.Helper(); return newFleetLabOf(t, nil) }

// newFleetLabOf is newFleetLab with edit applied to every document.
func newFleetLabOf(t *testing.T, edit func(*fleetlab.Doc)) *fleetLab {
	t.Helper()
	lab := netlab.New(t, "flt")
	fleetlabtest.RequireBIRD(t, "the fleet end-to-end tests")
	began := time.Now()
	l := &fleetLab{t: t, dir: t.TempDir(), edit: edit}
	l.port.Store(10000 - 1) // see nextPort
	f, err := fleetlab.BuildFleet(lab, 1, append(slices.Clone(flVMs), flSpare))
	require.NoError(t, err)
	l.fleet, l.client, l.router = f, f.Clients[0], f.Router
	for name, n := range f.VMs {
		fleetlabtest.ServeVM(t, n, name, vmAddr(name), flDIPPort, 0)
	}

	l.bird = fleetlabtest.StartBIRD(t, l.router, fleetlab.FleetBIRD())
	bin := fleetlabtest.Examples(t)
	l.hostConf = filepath.Join(l.dir, "fleet.yaml")
	for i := range l.muxConf {
		l.muxConf[i] = filepath.Join(l.dir, fmt.Sprintf("mux%d.yaml", i+1))
	}
	l.writeDocuments(1, flVMs)
	for i := range l.muxes {
		l.muxes[i] = fleetlabtest.Start(t, f.Muxes[i], fmt.Sprintf("mux%d", i+1), filepath.Join(bin, "mux"),
			"-interface", "up", "-config", l.muxConf[i], "-conns", "65536",
			"-metrics", net.JoinHostPort(fleetlab.FleetMuxAddr(i+1).String(), strconv.Itoa(flMetrics)))
	}
	for j := range l.agents {
		l.startAgent(j)
	}
	l.waitApplied(1)
	waitFor(t, "the router's ECMP route to the VIP over both Muxes", 30*time.Second, func() bool {
		return len(l.nextHops()) == 2
	})
	l.warm()
	t.Logf("fleet ready after %v (topology, build, BGP, probes, a first answer from every VM)", time.Since(began).Round(time.Millisecond))
	return l
}

// startAgent starts the Host Agent of host j (from 0).
func (l *fleetLab) startAgent(j int) {
	l.agents[j] = fleetlabtest.Start(l.t, l.fleet.Hosts[j], fmt.Sprintf("host%d", j+1), filepath.Join(fleetlabtest.Examples(l.t), "hostagent"),
		"-uplink", "up", "-host", fmt.Sprintf("host%d", j+1), "-config", l.hostConf, "-conns", "65536",
		"-metrics", net.JoinHostPort(fleetlab.FleetHostAddr(j+1).String(), strconv.Itoa(flMetrics)))
}

// vmAddr returns the DIP of the fleet's VM called name.
func vmAddr(name string) netip.Addr {
	for _, vm := range append(slices.Clone(flVMs), flSpare) {
		if vm.Name == name {
			return vm.Addr
		}
	}
	panic("no VM " + name)
}

// writeDocuments writes version v, with pool as the VIP's backends, for
// the Host Agents and for each Mux (each file replaced atomically).
func (l *fleetLab) writeDocuments(v uint64, pool []fleetlab.VM) {
	doc := func(mux int) *fleetlab.Doc {
		d := flDocument(v, mux, pool)
		if l.edit != nil {
			l.edit(d)
		}
		return d
	}
	fleetlabtest.WriteDocument(l.t, l.hostConf, doc(0))
	for i, p := range l.muxConf {
		fleetlabtest.WriteDocument(l.t, p, doc(i+1))
	}
	l.version, l.pool = v, slices.Clone(pool)
}

// waitApplied waits until both Muxes and both agents run version v, every
// backend of the pool is up on both Muxes, and both agents forward.
func (l *fleetLab) waitApplied(v uint64) {
	l.t.Helper()
	waitFor(l.t, fmt.Sprintf("version %d applied everywhere, every backend up, both data paths up", v), 30*time.Second, func() bool {
		for i := range l.muxes {
			m, err := l.muxMetrics(i)
			if err != nil || m["xdplb_config_version"] != float64(v) {
				return false
			}
			for _, vm := range l.pool {
				if m[backendUp(vm.Name)] != 1 {
					return false
				}
			}
		}
		for j := range l.agents {
			m, err := l.agentMetrics(j)
			if err != nil || m["xdplb_config_version"] != float64(v) || m["xdplb_datapath_up"] != 1 {
				return false
			}
		}
		return true
	})
}

func backendUp(name string) string {
	return fmt.Sprintf(`xdplb_backend_up{backend=%q,vip="web"}`, name)
}

func (l *fleetLab) muxMetrics(i int) (map[string]float64, error) {
	return fleetlab.Scrape(l.fleet.Muxes[i], netip.AddrPortFrom(fleetlab.FleetMuxAddr(i+1), flMetrics))
}

func (l *fleetLab) agentMetrics(j int) (map[string]float64, error) {
	return fleetlab.Scrape(l.fleet.Hosts[j], netip.AddrPortFrom(fleetlab.FleetHostAddr(j+1), flMetrics))
}

// muxRX returns each Mux's data-path receive counter.
func (l *fleetLab) muxRX() [2]float64 {
	rx, _ := l.muxPackets()
	return rx
}

// muxPackets returns each Mux's data-path receive and transmit counters.
func (l *fleetLab) muxPackets() (rx, tx [2]float64) {
	l.t.Helper()
	for i := range l.muxes {
		m, err := l.muxMetrics(i)
		require.NoError(l.t, err)
		rx[i], tx[i] = m[`xdplb_packets_total{direction="rx"}`], m[`xdplb_packets_total{direction="tx"}`]
	}
	return rx, tx
}

// nextHops returns the gateways of the router's kernel route to the VIP,
// sorted.
func (l *fleetLab) nextHops() []netip.Addr {
	return fleetlabtest.NextHops(l.t, l.router, netip.PrefixFrom(flVIP, 32))
}

// nextPort hands out a client port never used before in this lab, so
// that every connection is a new flow for the Muxes and the agents: from
// 10000 up to flSpreadPorts, below the ephemeral range (the client's
// other sockets never take one).
func (l *fleetLab) nextPort() uint16 {
	p := l.port.Add(1)
	if p >= flSpreadPorts {
		panic("fleetLab: out of client ports")
	}
	return uint16(p)
}

// flSpreadPorts is the first of the ports TestFleetSpreadMatchesWeights
// uses, the same on every run; nextPort stays below.
const flSpreadPorts = 20000

// warm sends one request to each backend of the pool through the VIP (a
// port the library places there), retrying until it is answered: the
// Muxes' and the hosts' next hops are resolved before a test counts
// anything.
func (l *fleetLab) warm() {
	t := l.t
	t.Helper()
	o := l.oracle()
	for _, vm := range l.pool {
		waitFor(t, "a first answer from "+vm.Name+" through the VIP", 30*time.Second, func() bool {
			p := l.nextPort()
			for o.pick(p) != vm.Name {
				p = l.nextPort()
			}
			name, err := l.oneShot(p, "warm", 2*time.Second)
			return err == nil && name == vm.Name
		})
	}
}

// fleetOracle is the library's answer to "which backend does a new flow
// from this client port go to", computed offline from the document with
// the fleet's seed, as every Mux computes it: flow.Rules, flow.Hasher,
// Rule.Pick.
type fleetOracle struct {
	rule   *flow.Rule
	hasher flow.Hasher
}

// oracle returns the oracle of the running document with every backend
// of the pool up.
func (l *fleetLab) oracle(down ...string) *fleetOracle {
	return newFleetOracle(l.t, flDocument(l.version, 0, l.pool), down...)
}

// newFleetOracle builds the oracle for doc with the backends named in
// down marked down by their probes (out of the Maglev table).
func newFleetOracle(t *testing.T, doc *fleetlab.Doc, down ...string) *fleetOracle {
	t.Helper()
	text, err := doc.Marshal()
	require.NoError(t, err)
	d, err := control.Parse(text)
	require.NoError(t, err)
	rules := flow.NewRules()
	snap, err := rules.Update(d.Version, d.Rules(func(vip, backend string) (bool, bool) {
		return !slices.Contains(down, backend), true
	}))
	require.NoError(t, err)
	vip := flow.VIP{Addr: flVIP, Proto: flow.ProtoTCP, Port: flVIPPort, VNI: fleetlab.FleetVNI}
	r := snap.LookupVIP(vip)
	require.NotNil(t, r, "no rule for %v", vip)
	return &fleetOracle{rule: r, hasher: flow.NewHasher(d.HashSeed)}
}

// pick returns the name of the backend a new flow from the client's port
// goes to.
func (o *fleetOracle) pick(port uint16) string {
	k := flow.KeyFrom(fleetlab.FleetVNI, flow.ProtoTCP, netip.AddrPortFrom(flClient, port),
		netip.AddrPortFrom(flVIP, flVIPPort))
	idx, ok := o.rule.Pick(o.hasher.Hash(&k, o.rule.Mode))
	if !ok {
		return ""
	}
	return o.rule.Backends[idx].Name
}

// shares returns each backend's share of the Maglev table's slots, and
// the table size.
func (o *fleetOracle) shares() (map[string]float64, int) {
	mg := o.rule.Maglev()
	out := map[string]float64{}
	for i := range o.rule.Backends {
		out[o.rule.Backends[i].Name] = float64(mg.Slots(i)) / float64(mg.Size())
	}
	return out, mg.Size()
}

// flConn is a client connection to the VIP from a chosen port.
type flConn struct {
	port uint16
	c    net.Conn
	br   *bufio.Reader
}

// dial connects to the VIP from the client's port (bound explicitly, so
// the flow is known in advance).
func (l *fleetLab) dial(port uint16, timeout time.Duration) (*flConn, error) {
	var c net.Conn
	err := l.client.Do(func() (err error) {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(flClient, port)),
			Timeout: timeout}
		c, err = d.Dial("tcp4", netip.AddrPortFrom(flVIP, flVIPPort).String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return &flConn{port: port, c: c, br: bufio.NewReader(c)}, nil
}

// get sends GET /?q=token on the connection (asking the server to close
// it when last) and returns the name of the VM that answered; the answer
// must echo the token.
func (c *flConn) get(token string, last bool, timeout time.Duration) (string, error) {
	if err := c.c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	hdr := ""
	if last {
		hdr = "Connection: close\r\n"
	}
	if _, err := fmt.Fprintf(c.c, "GET /?q=%s HTTP/1.1\r\nHost: %s\r\n%s\r\n", token, flVIP, hdr); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return "", err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET: %s", resp.Status)
	}
	name, got, ok := strings.Cut(string(body), " ")
	if !ok || got != token {
		return "", fmt.Errorf("answer %q to token %q", body, token)
	}
	return name, nil
}

func (c *flConn) close() { c.c.Close() }

// oneShot opens a connection from port, sends one request and returns
// the name of the VM that answered.
func (l *fleetLab) oneShot(port uint16, token string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	c, err := l.dial(port, timeout)
	if err != nil {
		return "", err
	}
	defer c.close()
	return c.get(token, true, time.Until(deadline))
}

// blackhole makes the VM stop answering (fleetlab.BlackholeVM): nothing
// leaves it, what reaches it goes unanswered. restore undoes it.
func (l *fleetLab) blackhole(vm string) (restore func()) {
	t := l.t
	n := l.fleet.VMs[vm]
	require.NoError(t, fleetlab.BlackholeVM(n))
	var once sync.Once
	restore = func() {
		once.Do(func() { require.NoError(t, fleetlab.RestoreVM(n, fleetlab.FleetGateway)) })
	}
	t.Cleanup(restore)
	return restore
}
