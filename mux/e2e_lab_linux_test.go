package mux_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/netlab"
)

// The end-to-end topology (see TestMuxEndToEnd):
//
//	client [up 198.18.5.2] ── [c 198.18.5.1]
//	                                 router (BIRD 2, AS 65000, ECMP on L4)
//	mux1 [up 198.18.1.2] ──────── [m1 198.18.1.1]
//	mux2 [up 198.18.2.2] ──────── [m2 198.18.2.1]
//	host [up 198.18.3.2] ──────── [h 198.18.3.1]
//	     lo: the DIPs 198.18.4.1-3/32 (probe listeners on :8080)
//
// Every namespace but the router routes 198.18.0.0/15 to the router; the
// router routes the DIPs (198.18.4.0/24) to the host and learns the VIPs
// from the Muxes over BGP.
const (
	e2eClient   = "198.18.5.2"
	e2eHost     = "198.18.3.2"
	e2eVIPTCP   = "198.18.100.1"
	e2eVIPUDP   = "198.18.100.2"
	e2ePortTCP  = 80
	e2ePortUDP  = 7777
	e2eVNITCP   = 100
	e2eVNIUDP   = 200
	e2eSeed     = 0x5eed1234
	e2eProbe    = 8080
	e2eMetrics  = 9100
	e2eVXLAN    = 4789
	e2eMuxASN   = 65010
	e2eRouterAS = 65000
)

// e2eDIPs are the backends of both VIPs: name, DIP, MAC.
var e2eDIPs = []struct {
	name string
	addr string
	mac  string
}{
	{"vm-a", "198.18.4.1", "02:00:00:00:04:01"},
	{"vm-b", "198.18.4.2", "02:00:00:00:04:02"},
	{"vm-c", "198.18.4.3", "02:00:00:00:04:03"},
}

// e2eMux is one Mux's place in the topology.
type e2eMux struct {
	name   string
	addr   netip.Addr // on the uplink "up"
	router netip.Addr // the router's end of the link
}

var e2eMuxes = [2]e2eMux{
	{"mux1", netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("198.18.1.1")},
	{"mux2", netip.MustParseAddr("198.18.2.2"), netip.MustParseAddr("198.18.2.1")},
}

// e2eDocument is the desired-state document of Mux i. Only node and bgp
// differ between the Muxes; the VIPs and the hash seed are the fleet's.
func e2eDocument(i int) string {
	m := e2eMuxes[i]
	var b strings.Builder
	fmt.Fprintf(&b, `version: 1
hash_seed: %#x
node:
  name: %s
bgp:
  asn: %d
  router_id: %s
  hold_time: 9s
  withdraw_grace: 1s
  peers:
    - address: %s
      asn: %d
vips:
  - name: web
    address: %s
    protocol: tcp
    port: %d
    vni: %d
    probe:
      type: tcp
      interval: 200ms
      timeout: 100ms
      rise: 1
      fall: 2
    backends:
`, e2eSeed, m.name, e2eMuxASN, m.addr, m.router, e2eRouterAS, e2eVIPTCP, e2ePortTCP, e2eVNITCP)
	for _, d := range e2eDIPs {
		fmt.Fprintf(&b, "      - {name: %s, address: %s, port: %d, mac: %q, host: %s}\n", d.name, d.addr, e2eProbe, d.mac, e2eHost)
	}
	fmt.Fprintf(&b, `  - name: dns
    address: %s
    protocol: udp
    port: %d
    vni: %d
    backends:
`, e2eVIPUDP, e2ePortUDP, e2eVNIUDP)
	for _, d := range e2eDIPs {
		fmt.Fprintf(&b, "      - {name: %s, address: %s, mac: %q, host: %s}\n", d.name, d.addr, d.mac, e2eHost)
	}
	return b.String()
}

// e2eBIRDConfig is the router's configuration: both Muxes as eBGP peers,
// best routes exported to the kernel with equal-cost paths merged.
func e2eBIRDConfig() string {
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
`, e2eRouterAS)
	for _, m := range e2eMuxes {
		fmt.Fprintf(&b, "protocol bgp %s from mux { neighbor %s as %d; }\n", m.name, m.addr, e2eMuxASN)
	}
	return b.String()
}

// e2eLab is the running topology.
type e2eLab struct {
	t      *testing.T
	dir    string
	lab    *netlab.Lab
	client *netlab.NS
	router *netlab.NS
	host   *netlab.NS
	muxNS  [2]*netlab.NS
	sock   string // BIRD's control socket
	bin    string // the examples/mux binary
}

func requireBIRD(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"bird", "birdc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not found: install BIRD 2 (Debian/Ubuntu package bird2) to run the Mux end-to-end test", bin)
		}
	}
}

// newE2ELab builds the namespaces, links, addresses and routes, starts
// BIRD in the router and builds the Mux binary. Everything is removed at
// cleanup, also when the test fails.
func newE2ELab(t *testing.T) *e2eLab {
	t.Helper()
	lab := netlab.New(t, "muxe2e")
	requireBIRD(t)
	l := &e2eLab{t: t, dir: t.TempDir(), lab: lab}
	ns := func(name string) *netlab.NS {
		n, err := lab.Namespace(name)
		require.NoError(t, err)
		return n
	}
	l.client, l.router, l.host = ns("client"), ns("router"), ns("host")
	l.muxNS[0], l.muxNS[1] = ns("mux1"), ns("mux2")

	link := func(n *netlab.NS, rif string, subnet int) {
		_, _, err := lab.Veth(l.router, rif, n, "up")
		require.NoError(t, err)
		require.NoError(t, l.router.AddAddr(rif, fmt.Sprintf("198.18.%d.1/24", subnet)))
		require.NoError(t, n.AddAddr("up", fmt.Sprintf("198.18.%d.2/24", subnet)))
		require.NoError(t, n.AddRoute("198.18.0.0/15", fmt.Sprintf("198.18.%d.1", subnet)))
	}
	link(l.muxNS[0], "m1", 1)
	link(l.muxNS[1], "m2", 2)
	link(l.host, "h", 3)
	link(l.client, "c", 5)
	// The client's frames cross the Muxes' AF_XDP data path inside VXLAN:
	// they must carry complete checksums (see DisableChecksumOffload).
	require.NoError(t, l.client.DisableChecksumOffload("up"))
	for _, d := range e2eDIPs {
		require.NoError(t, l.host.AddAddr("lo", d.addr+"/32"))
	}
	require.NoError(t, l.router.AddRoute("198.18.4.0/24", e2eHost))
	require.NoError(t, l.router.SetSysctl("net.ipv4.ip_forward", "1"))
	require.NoError(t, l.router.SetSysctl("net.ipv4.fib_multipath_hash_policy", "1"))

	l.startBIRD()
	l.buildMux()
	return l
}

func (l *e2eLab) startBIRD() {
	t := l.t
	conf := filepath.Join(l.dir, "bird.conf")
	l.sock = filepath.Join(l.dir, "bird.ctl")
	require.NoError(t, os.WriteFile(conf, []byte(e2eBIRDConfig()), 0o644))
	out, err := exec.Command("bird", "-p", "-c", conf).CombinedOutput()
	require.NoError(t, err, "bird -p (parse only): %s", out)
	logs := new(syncBuffer)
	cmd := l.router.Command(context.Background(), "bird", "-f", "-c", conf, "-s", l.sock)
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		stopOrKill(cmd, 10*time.Second)
		if t.Failed() {
			t.Logf("BIRD log:\n%s", logs.String())
		}
	})
	waitFor(t, "BIRD's control socket", 10*time.Second, func() bool {
		_, err := l.birdc("show status")
		return err == nil
	})
}

func (l *e2eLab) birdc(args string) (string, error) {
	out, err := exec.Command("birdc", append([]string{"-s", l.sock}, strings.Fields(args)...)...).CombinedOutput()
	return string(out), err
}

// buildMux builds examples/mux into the test's temporary directory.
func (l *e2eLab) buildMux() {
	t := l.t
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	l.bin = filepath.Join(l.dir, "mux")
	cmd := exec.Command(goBin, "build", "-o", l.bin, "github.com/xdplb/xdplb/examples/mux")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build examples/mux: %s", out)
}

// nextHops returns the gateways of the router's kernel route to p, sorted;
// nil when there is none.
func (l *e2eLab) nextHops(p netip.Prefix) []netip.Addr {
	l.t.Helper()
	routes, err := l.router.Netlink().RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{Table: syscall.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	require.NoError(l.t, err)
	var gws []netip.Addr
	add := func(ip net.IP) {
		if g, ok := netip.AddrFromSlice(ip); ok {
			gws = append(gws, g.Unmap())
		}
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		a, _ := netip.AddrFromSlice(r.Dst.IP)
		if netip.PrefixFrom(a.Unmap(), ones) != p {
			continue
		}
		if r.Gw != nil {
			add(r.Gw)
		}
		for _, nh := range r.MultiPath {
			add(nh.Gw)
		}
	}
	slices.SortFunc(gws, netip.Addr.Compare)
	return gws
}

// waitNextHops polls the router's kernel table until the route to p has
// exactly want as next hops and returns when it saw that. The deadline is a
// hang guard, not a timing assertion.
func (l *e2eLab) waitNextHops(p netip.Prefix, want ...netip.Addr) time.Time {
	l.t.Helper()
	slices.SortFunc(want, netip.Addr.Compare)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := l.nextHops(p)
		if slices.Equal(got, want) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			out, _ := l.birdc("show route all")
			proto, _ := l.birdc("show protocols")
			l.t.Fatalf("router route %v: next hops %v, want %v\nBIRD protocols:\n%s\nBIRD routes:\n%s", p, got, want, proto, out)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// muxProc is a running examples/mux process.
type muxProc struct {
	name string
	ns   *netlab.NS
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
	err  error // Wait's result, once done is closed
}

// startMux writes Mux i's document and runs the binary in its namespace.
func (l *e2eLab) startMux(i int) *muxProc {
	t := l.t
	m := e2eMuxes[i]
	conf := filepath.Join(l.dir, m.name+".yaml")
	require.NoError(t, os.WriteFile(conf, []byte(e2eDocument(i)), 0o644))
	p := &muxProc{name: m.name, ns: l.muxNS[i], log: new(syncBuffer), done: make(chan struct{})}
	p.cmd = p.ns.Command(context.Background(), l.bin,
		"-interface", "up",
		"-config", conf,
		"-metrics", netip.AddrPortFrom(m.addr, e2eMetrics).String(),
		"-conns", "65536",
	)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	require.NoError(t, p.cmd.Start())
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(15 * time.Second)
		if t.Failed() || testing.Verbose() {
			t.Logf("%s log:\n%s", p.name, p.log.String())
		}
	})
	return p
}

// stop sends SIGTERM and waits for the process to exit (killing it after
// grace); it returns the process's exit error.
func (p *muxProc) stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return p.err
}

// exited reports whether the process has ended.
func (p *muxProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// metrics scrapes the Mux's /metrics endpoint from inside its namespace
// and returns the samples, keyed by the metric line's name and labels as
// printed (e.g. `xdplb_packets_total{direction="rx"}`).
func (p *muxProc) metrics(addr netip.Addr) (map[string]float64, error) {
	client := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
				return p.ns.Dial(ctx, "tcp", address)
			},
			DisableKeepAlives: true,
		},
	}
	resp, err := client.Get("http://" + netip.AddrPortFrom(addr, e2eMetrics).String() + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format's sample lines.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// vxlanCapture receives the VXLAN datagrams that reach the host: the kernel
// delivers the UDP payload (VXLAN header and inner frame) and the outer
// source (the Mux that sent it).
type vxlanCapture struct {
	conn net.PacketConn
	mu   sync.Mutex
	got  []captured
	done chan struct{}
}

// captured is one decoded VXLAN datagram.
type captured struct {
	outerSrc netip.Addr
	vni      uint32
	innerDst net.HardwareAddr
	src, dst netip.AddrPort
	proto    uint8
	syn      bool
	payload  []byte
	err      error // decoding failed: what was wrong
}

func (l *e2eLab) captureVXLAN() *vxlanCapture {
	t := l.t
	conn, err := l.host.ListenPacket(context.Background(), "udp4", netip.AddrPortFrom(netip.MustParseAddr(e2eHost), e2eVXLAN).String())
	require.NoError(t, err)
	c := &vxlanCapture{conn: conn, done: make(chan struct{})}
	go c.run()
	t.Cleanup(func() {
		conn.Close()
		<-c.done
	})
	return c
}

func (c *vxlanCapture) run() {
	defer close(c.done)
	buf := make([]byte, 65536)
	for {
		n, from, err := c.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		rec := decodeVXLAN(buf[:n])
		if ua, ok := from.(*net.UDPAddr); ok {
			rec.outerSrc = ua.AddrPort().Addr().Unmap()
		}
		c.mu.Lock()
		c.got = append(c.got, rec)
		c.mu.Unlock()
	}
}

// take returns and forgets what was captured so far.
func (c *vxlanCapture) take() []captured {
	c.mu.Lock()
	defer c.mu.Unlock()
	got := c.got
	c.got = nil
	return got
}

// decodeVXLAN decodes a VXLAN header and the inner frame with gopacket,
// the independent oracle.
func decodeVXLAN(b []byte) captured {
	var rec captured
	pkt := gopacket.NewPacket(b, layers.LayerTypeVXLAN, gopacket.Default)
	if el := pkt.ErrorLayer(); el != nil {
		rec.err = fmt.Errorf("gopacket: %v", el.Error())
		return rec
	}
	vx, ok := pkt.Layer(layers.LayerTypeVXLAN).(*layers.VXLAN)
	if !ok || !vx.ValidIDFlag {
		rec.err = fmt.Errorf("no VXLAN header with the I flag")
		return rec
	}
	rec.vni = vx.VNI
	eth, ok := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if !ok {
		rec.err = fmt.Errorf("no inner Ethernet header")
		return rec
	}
	rec.innerDst = eth.DstMAC
	ip, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if !ok {
		rec.err = fmt.Errorf("no inner IPv4 header (EtherType %v)", eth.EthernetType)
		return rec
	}
	src, _ := netip.AddrFromSlice(ip.SrcIP.To4())
	dst, _ := netip.AddrFromSlice(ip.DstIP.To4())
	rec.proto = uint8(ip.Protocol)
	switch l4 := pkt.TransportLayer().(type) {
	case *layers.UDP:
		rec.src, rec.dst = netip.AddrPortFrom(src, uint16(l4.SrcPort)), netip.AddrPortFrom(dst, uint16(l4.DstPort))
		rec.payload = bytes.Clone(l4.Payload)
	case *layers.TCP:
		rec.src, rec.dst = netip.AddrPortFrom(src, uint16(l4.SrcPort)), netip.AddrPortFrom(dst, uint16(l4.DstPort))
		rec.syn = l4.SYN && !l4.ACK
		rec.payload = bytes.Clone(l4.Payload)
	default:
		rec.err = fmt.Errorf("inner protocol %v", ip.Protocol)
	}
	return rec
}

func stopOrKill(cmd *exec.Cmd, grace time.Duration) {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

// waitFor polls cond until it holds; the deadline is a hang guard.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s after %v", what, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
