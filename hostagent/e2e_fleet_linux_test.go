package hostagent_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/internal/netlab"
)

// The fleet topology of the failover tests: the lab's (examples/lab),
// driven by go test.
//
//	client [up 198.18.11.2] ─ [c1 198.18.11.1] ┐
//	mux1   [up 198.18.1.2]  ─ [m1 198.18.1.1]  ├ router (BIRD 2, eBGP with both Muxes,
//	mux2   [up 198.18.2.2]  ─ [m2 198.18.2.1]  ┤         ECMP hashed on L4: fib_multipath_hash_policy=1)
//	host1  [up 198.18.21.2] ─ [h1 198.18.21.1] ┤   host1: vm1 ─ vm11 (198.18.31.1), vm2 ─ vm12 (198.18.31.2),
//	host2  [up 198.18.22.2] ─ [h2 198.18.22.1] ┘          vm3 ─ vm13 (198.18.31.3, in no pool until a reload adds it)
//	                                                 host2: vm1 ─ vm21 (198.18.32.1), vm2 ─ vm22 (198.18.32.2)
//
// The VIP 198.18.100.1:80 (TCP, VNI 100) is served by the VMs' port 8080
// with the weights below, probed by TCP. Each VM runs an HTTP server whose
// answer to GET /?q=TOKEN is "NAME TOKEN": the client learns which VM
// answered which request. Keep-alive connections stay open as long as the
// client wants.
const (
	flVIP      = "198.18.100.1"
	flVIPPort  = 80
	flDIPPort  = 8080
	flVNI      = 100
	flClient   = "198.18.11.2"
	flGateway  = "198.18.30.254" // the VMs' next hop (a static neighbour on the host-side veth)
	flMetrics  = 9100
	flSeed     = 0x5eed1234
	flRouterAS = 65000
	flMuxAS    = 65010
)

// flProbe is the web VIP's probe: fast enough to keep the tests short,
// slow enough that a healthy DIP on a loaded CI machine never misses three
// 400 ms handshakes in a row. Its DownBound is 3.35 s, its UpBound 1.4 s.
var flProbe = health.Spec{Type: health.ProbeTCP, Interval: 500 * time.Millisecond,
	Timeout: 400 * time.Millisecond, Rise: 1, Fall: 3}

// flVM is one VM: name (also what it answers), host (1 or 2), port on the
// host, DIP, MAC and weight in the VIP's pool.
type flVM struct {
	name   string
	host   int
	port   string
	addr   string
	mac    string
	weight int
}

// flVMs are the backends of document version 1; flSpare is a VM that
// exists from the start but joins the pool only when a reload adds it.
var (
	flVMs = []flVM{
		{"vm11", 1, "vm1", "198.18.31.1", "02:00:00:00:31:01", 1},
		{"vm12", 1, "vm2", "198.18.31.2", "02:00:00:00:31:02", 2},
		{"vm21", 2, "vm1", "198.18.32.1", "02:00:00:00:32:01", 1},
		{"vm22", 2, "vm2", "198.18.32.2", "02:00:00:00:32:02", 4},
	}
	flSpare = flVM{"vm13", 1, "vm3", "198.18.31.3", "02:00:00:00:31:03", 2}
)

func flMuxAddr(i int) string  { return fmt.Sprintf("198.18.%d.2", i+1) }  // i = 0, 1
func flHostAddr(j int) string { return fmt.Sprintf("198.18.%d.2", 21+j) } // j = 0, 1

// flDocument is version v of the fleet's document with vms as the pool
// and the hosts' VMs. mux < 0 gives the Host Agents' copy; mux 0 or 1 the
// copy of that Mux, with its node name and BGP session to the router.
func flDocument(v, mux int, vms []flVM) string {
	var b strings.Builder
	fmt.Fprintf(&b, "version: %d\nhash_seed: %#x\n", v, flSeed)
	if mux >= 0 {
		fmt.Fprintf(&b, `node: {name: mux%d}
bgp:
  asn: %d
  router_id: %s
  hold_time: 9s
  withdraw_grace: 1s
  peers:
    - {address: %s, asn: %d}
`, mux+1, flMuxAS, flMuxAddr(mux), fmt.Sprintf("198.18.%d.1", mux+1), flRouterAS)
	}
	fmt.Fprintf(&b, `infra_prefixes: [198.18.1.0/24, 198.18.2.0/24]
vips:
  - name: web
    address: %s
    protocol: tcp
    port: %d
    vni: %d
    probe: {type: tcp, interval: %v, timeout: %v, rise: %d, fall: %d}
    backends:
`, flVIP, flVIPPort, flVNI, flProbe.Interval, flProbe.Timeout, flProbe.Rise, flProbe.Fall)
	for _, vm := range vms {
		fmt.Fprintf(&b, "      - {name: %s, address: %s, port: %d, mac: %q, host: %s, weight: %d}\n",
			vm.name, vm.addr, flDIPPort, vm.mac, flHostAddr(vm.host-1), vm.weight)
	}
	b.WriteString("hosts:\n")
	for j := 0; j < 2; j++ {
		fmt.Fprintf(&b, "  - name: host%d\n    address: %s\n    vms:\n", j+1, flHostAddr(j))
		for _, vm := range vms {
			if vm.host == j+1 {
				fmt.Fprintf(&b, "      - {vni: %d, address: %s, mac: %q, interface: %s}\n", flVNI, vm.addr, vm.mac, vm.port)
			}
		}
	}
	return b.String()
}

// flBIRDConfig is the router's BIRD configuration: both Muxes as eBGP
// peers, best routes exported to the kernel with equal-cost paths merged.
func flBIRDConfig() string {
	var b strings.Builder
	fmt.Fprintf(&b, `log stderr all;
router id 198.18.0.1;
protocol device { scan time 10; }
protocol kernel kernel4 {
	ipv4 { import none; export all; };
	merge paths on;
}
template bgp mux {
	local as %d;
	hold time 9;
	connect delay time 1;
	connect retry time 1;
	error wait time 1, 5;
	ipv4 { import all; export none; };
}
`, flRouterAS)
	for i := 0; i < 2; i++ {
		fmt.Fprintf(&b, "protocol bgp mux%d from mux { neighbor %s as %d; }\n", i+1, flMuxAddr(i), flMuxAS)
	}
	return b.String()
}

// fleetLab is the running fleet: namespaces, BIRD, two Muxes, two Host
// Agents, the VMs' servers, and the client.
type fleetLab struct {
	t        *testing.T
	dir      string
	lab      *netlab.Lab
	client   *netlab.NS
	router   *netlab.NS
	muxNS    [2]*netlab.NS
	hostNS   [2]*netlab.NS
	vmNS     map[string]*netlab.NS
	birdSock string
	muxes    [2]*proc
	agents   [2]*proc
	hostConf string
	muxConf  [2]string
	version  int
	pool     []flVM // the running document's pool

	port atomic.Uint32 // the last client port handed out
}

func requireBIRD(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"bird", "birdc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not found: install BIRD 2 (Debian/Ubuntu package bird2) to run the fleet end-to-end tests", bin)
		}
	}
}

// newFleetLab builds the topology, starts BIRD, the Muxes and the Host
// Agents with document version 1, and returns once the router routes the
// VIP over both Muxes, both Muxes see every backend up, both agents
// forward, and every VM has answered a request through the VIP. Everything
// is removed at cleanup, also when the test fails.
func newFleetLab(t *testing.T) *fleetLab {
	t.Helper()
	lab := netlab.New(t, "flt")
	requireBIRD(t)
	began := time.Now()
	l := &fleetLab{t: t, dir: t.TempDir(), lab: lab, vmNS: map[string]*netlab.NS{}}
	l.port.Store(10000 - 1) // see nextPort
	ns := func(name string) *netlab.NS {
		n, err := lab.Namespace(name)
		require.NoError(t, err)
		return n
	}
	l.client, l.router = ns("client"), ns("router")
	for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.fib_multipath_hash_policy", "1"}} {
		require.NoError(t, l.router.SetSysctl(kv[0], kv[1]))
	}
	link := func(n *netlab.NS, rif string, subnet int) {
		_, _, err := lab.Veth(l.router, rif, n, "up")
		require.NoError(t, err)
		require.NoError(t, l.router.AddAddr(rif, fmt.Sprintf("198.18.%d.1/24", subnet)))
		require.NoError(t, n.AddAddr("up", fmt.Sprintf("198.18.%d.2/24", subnet)))
		require.NoError(t, n.AddRoute("198.18.0.0/15", fmt.Sprintf("198.18.%d.1", subnet)))
		require.NoError(t, l.router.SetSysctl("net.ipv4.conf."+rif+".rp_filter", "0"))
	}
	link(l.client, "c1", 11)
	// The client's frames cross the Muxes' and the hosts' AF_XDP data
	// paths: they must carry complete checksums.
	require.NoError(t, l.client.DisableChecksumOffload("up"))
	for i := range l.muxNS {
		l.muxNS[i] = ns(fmt.Sprintf("mux%d", i+1))
		link(l.muxNS[i], fmt.Sprintf("m%d", i+1), i+1)
	}
	for j := range l.hostNS {
		l.hostNS[j] = ns(fmt.Sprintf("host%d", j+1))
		link(l.hostNS[j], fmt.Sprintf("h%d", j+1), 21+j)
		// The hosts' kernels forward the Muxes' probes to the VMs.
		require.NoError(t, l.hostNS[j].SetSysctl("net.ipv4.ip_forward", "1"))
		require.NoError(t, l.router.AddRoute(fmt.Sprintf("198.18.%d.0/24", 31+j), flHostAddr(j)))
	}
	for _, vm := range append(slices.Clone(flVMs), flSpare) {
		n := ns(vm.name)
		l.vmNS[vm.name] = n
		wireVM(t, lab, l.hostNS[vm.host-1], n, vm.port, vm.addr, vm.mac, flGateway)
		l.serveVM(n, vm)
	}

	l.startBIRD()
	bin := examplesDir(t)
	l.hostConf = filepath.Join(l.dir, "fleet.yaml")
	for i := range l.muxConf {
		l.muxConf[i] = filepath.Join(l.dir, fmt.Sprintf("mux%d.yaml", i+1))
	}
	l.writeDocuments(1, flVMs)
	for i := range l.muxes {
		l.muxes[i] = startProc(t, fmt.Sprintf("mux%d", i+1), l.muxNS[i], filepath.Join(bin, "mux"),
			"-interface", "up", "-config", l.muxConf[i], "-conns", "65536",
			"-metrics", net.JoinHostPort(flMuxAddr(i), strconv.Itoa(flMetrics)))
	}
	for j := range l.agents {
		l.agents[j] = startProc(t, fmt.Sprintf("host%d", j+1), l.hostNS[j], filepath.Join(bin, "hostagent"),
			"-uplink", "up", "-host", fmt.Sprintf("host%d", j+1), "-config", l.hostConf, "-conns", "65536",
			"-metrics", net.JoinHostPort(flHostAddr(j), strconv.Itoa(flMetrics)))
	}
	l.waitApplied(1)
	waitFor(t, "the router's ECMP route to the VIP over both Muxes", 30*time.Second, func() bool {
		return len(l.nextHops()) == 2
	})
	l.warm()
	t.Logf("fleet ready after %v (topology, build, BGP, probes, a first answer from every VM)", time.Since(began).Round(time.Millisecond))
	return l
}

// wireVM connects a VM namespace to its host: a veth from the host (port,
// the VM port named in the document) to eth0 in the VM, with the
// document's MAC and DIP; the VM sends everything to the host-side veth
// (gw, a static neighbour), the host routes the DIP to the port (a static
// neighbour too). Frames of the VM cross the host's AF_XDP data path: they
// carry complete checksums.
func wireVM(t *testing.T, lab *netlab.Lab, host, n *netlab.NS, port, addr, macText, gwText string) {
	t.Helper()
	hostEnd, vmEnd, err := lab.Veth(host, port, n, "eth0")
	require.NoError(t, err)
	mac, err := net.ParseMAC(macText)
	require.NoError(t, err)
	dip, gw := netip.MustParseAddr(addr), netip.MustParseAddr(gwText)

	vl, err := n.Link("eth0")
	require.NoError(t, err)
	nl := n.Netlink()
	require.NoError(t, nl.LinkSetDown(vl))
	require.NoError(t, nl.LinkSetHardwareAddr(vl, mac))
	require.NoError(t, nl.LinkSetUp(vl))
	require.NoError(t, n.AddAddr("eth0", addr+"/32"))
	require.NoError(t, nl.NeighAdd(&netlink.Neigh{LinkIndex: vmEnd.Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: gw.AsSlice(), HardwareAddr: hostEnd.MAC}))
	require.NoError(t, nl.RouteAdd(vmRoute(vmEnd.Index, gw)))
	require.NoError(t, n.DisableChecksumOffload("eth0"))

	hl := host.Netlink()
	require.NoError(t, hl.RouteAdd(&netlink.Route{LinkIndex: hostEnd.Index, Dst: ipNet(addr + "/32"), Scope: netlink.SCOPE_LINK}))
	require.NoError(t, hl.NeighAdd(&netlink.Neigh{LinkIndex: hostEnd.Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: dip.AsSlice(), HardwareAddr: mac}))
}

// vmRoute is a VM's route to the test range: through the host-side veth.
func vmRoute(eth0 int, gw netip.Addr) *netlink.Route {
	return &netlink.Route{LinkIndex: eth0, Dst: ipNet("198.18.0.0/15"), Gw: gw.AsSlice(), Flags: int(netlink.FLAG_ONLINK)}
}

// serveVM starts the VM's HTTP server on DIP:8080: GET /?q=TOKEN answers
// "NAME TOKEN". Connections are kept alive until the client closes them.
func (l *fleetLab) serveVM(n *netlab.NS, vm flVM) {
	ln, err := n.Listen(context.Background(), "tcp4", net.JoinHostPort(vm.addr, strconv.Itoa(flDIPPort)))
	require.NoError(l.t, err)
	name := vm.name
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, name+" "+r.URL.Query().Get("q"))
		})}
	go srv.Serve(ln)
	l.t.Cleanup(func() { srv.Close() })
}

func (l *fleetLab) startBIRD() {
	t := l.t
	conf := filepath.Join(l.dir, "bird.conf")
	l.birdSock = filepath.Join(l.dir, "bird.ctl")
	require.NoError(t, os.WriteFile(conf, []byte(flBIRDConfig()), 0o644))
	startProc(t, "bird", l.router, "bird", "-f", "-c", conf, "-s", l.birdSock)
	waitFor(t, "BIRD's control socket", 10*time.Second, func() bool {
		_, err := l.birdc("show status")
		return err == nil
	})
}

func (l *fleetLab) birdc(args string) (string, error) {
	out, err := exec.Command("birdc", append([]string{"-s", l.birdSock}, strings.Fields(args)...)...).CombinedOutput()
	return string(out), err
}

// writeDocuments writes version v, with pool as the VIP's backends, for
// the Host Agents and for each Mux (each file replaced atomically).
func (l *fleetLab) writeDocuments(v int, pool []flVM) {
	write := func(path, doc string) {
		tmp := path + ".tmp"
		require.NoError(l.t, os.WriteFile(tmp, []byte(doc), 0o644))
		require.NoError(l.t, os.Rename(tmp, path))
	}
	write(l.hostConf, flDocument(v, -1, pool))
	for i, p := range l.muxConf {
		write(p, flDocument(v, i, pool))
	}
	l.version, l.pool = v, slices.Clone(pool)
}

// waitApplied waits until both Muxes and both agents run version v, every
// backend of the pool is up on both Muxes, and both agents forward.
func (l *fleetLab) waitApplied(v int) {
	l.t.Helper()
	waitFor(l.t, fmt.Sprintf("version %d applied everywhere, every backend up, both data paths up", v), 30*time.Second, func() bool {
		for i := range l.muxes {
			m, err := l.muxMetrics(i)
			if err != nil || m["xdplb_config_version"] != float64(v) {
				return false
			}
			for _, vm := range l.pool {
				if m[backendUp(vm.name)] != 1 {
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
	return scrapeErr(l.muxNS[i], flMuxAddr(i), flMetrics)
}

func (l *fleetLab) agentMetrics(j int) (map[string]float64, error) {
	return scrapeErr(l.hostNS[j], flHostAddr(j), flMetrics)
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
func (l *fleetLab) nextHops() []string {
	routes, err := l.router.Netlink().RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil
	}
	var gws []string
	for _, r := range routes {
		if r.Dst == nil || r.Dst.String() != flVIP+"/32" {
			continue
		}
		if r.Gw != nil {
			gws = append(gws, r.Gw.String())
		}
		for _, nh := range r.MultiPath {
			gws = append(gws, nh.Gw.String())
		}
	}
	slices.Sort(gws)
	return gws
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
		waitFor(t, "a first answer from "+vm.name+" through the VIP", 30*time.Second, func() bool {
			p := l.nextPort()
			for o.pick(p) != vm.name {
				p = l.nextPort()
			}
			name, err := l.oneShot(p, "warm", 2*time.Second)
			return err == nil && name == vm.name
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
	return newFleetOracle(l.t, flDocument(l.version, -1, l.pool), down...)
}

// newFleetOracle builds the oracle for doc with the backends named in
// down marked down by their probes (out of the Maglev table).
func newFleetOracle(t *testing.T, doc string, down ...string) *fleetOracle {
	t.Helper()
	d, err := control.Parse([]byte(doc))
	require.NoError(t, err)
	rules := flow.NewRules()
	snap, err := rules.Update(d.Version, d.Rules(func(vip, backend string) (bool, bool) {
		return !slices.Contains(down, backend), true
	}))
	require.NoError(t, err)
	vip := flow.VIP{Addr: netip.MustParseAddr(flVIP), Proto: flow.ProtoTCP, Port: flVIPPort, VNI: flVNI}
	r := snap.LookupVIP(vip)
	require.NotNil(t, r, "no rule for %v", vip)
	return &fleetOracle{rule: r, hasher: flow.NewHasher(d.HashSeed)}
}

// pick returns the name of the backend a new flow from the client's port
// goes to.
func (o *fleetOracle) pick(port uint16) string {
	k := flow.KeyFrom(flVNI, flow.ProtoTCP, netip.AddrPortFrom(netip.MustParseAddr(flClient), port),
		netip.AddrPortFrom(netip.MustParseAddr(flVIP), flVIPPort))
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
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(flClient), port)),
			Timeout: timeout}
		c, err = d.Dial("tcp4", net.JoinHostPort(flVIP, strconv.Itoa(flVIPPort)))
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

// blackhole makes the VM stop answering: its route to the test range
// becomes a blackhole, so nothing leaves it (no SYN-ACK, no RST, no ICMP);
// what reaches it is silently unanswered. restore undoes it.
func (l *fleetLab) blackhole(vm string) (restore func()) {
	t := l.t
	n := l.vmNS[vm]
	nl := n.Netlink()
	eth0, err := n.Link("eth0")
	require.NoError(t, err)
	require.NoError(t, nl.RouteReplace(&netlink.Route{Dst: ipNet("198.18.0.0/15"), Type: syscall.RTN_BLACKHOLE}))
	var once sync.Once
	restore = func() {
		once.Do(func() {
			require.NoError(t, nl.RouteReplace(vmRoute(eth0.Attrs().Index, netip.MustParseAddr(flGateway))))
		})
	}
	t.Cleanup(restore)
	return restore
}

// signalTerm sends SIGTERM without waiting.
func (p *proc) signalTerm() error { return p.cmd.Process.Signal(syscall.SIGTERM) }

func linkStatsOf(t *testing.T, n *netlab.NS, ifname string) netlink.LinkStatistics {
	t.Helper()
	lk, err := n.Link(ifname)
	require.NoError(t, err)
	return *lk.Attrs().Statistics
}
