package hostagent_test

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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/netlab"
)

// The end-to-end topology (TestHostAgentEndToEnd):
//
//	client [up 198.18.5.2] ── [c 198.18.5.1]
//	                                 router (static routes: VIP → mux, DIPs → host)
//	mux    [up 198.18.1.2] ── [m1 198.18.1.1]
//	host   [up 198.18.3.2] ── [h 198.18.3.1]
//	  host [vm_a] ── [eth0 198.18.4.1/32, 02:00:00:00:04:01] vma   (HTTP :8080, UDP echo :7007)
//	  host [vm_b] ── [eth0 198.18.4.2/32, 02:00:00:00:04:02] vmb
//
// The VIP 198.18.100.1 serves TCP port 80 (→ DIP port 8080) and UDP port 7
// (→ DIP port 7007) from both VMs, in VNI 100. The Mux probes the DIPs on
// port 8080 through the router and the host's kernel; the VMs' answers
// match the VM ports' steering rules but go to the kernel, because the
// Mux's subnet is an infrastructure prefix.
const (
	haClient  = "198.18.5.2"
	haMux     = "198.18.1.2"
	haHost    = "198.18.3.2"
	haVIP     = "198.18.100.1"
	haGateway = "198.18.4.254" // the VMs' next hop: the host-side veth (static neighbour)
	haMuxMet  = 9100
	haHostMet = 9101
)

var haVMs = []haVM{
	{"vm-a", "vm_a", "198.18.4.1", "02:00:00:00:04:01"},
	{"vm-b", "vm_b", "198.18.4.2", "02:00:00:00:04:02"},
}

// haDocument is the fleet's document, read by the Mux and the Host Agent
// alike.
func haDocument() string { return haDocumentOf(1, haVMs...) }

type haVM = struct{ name, port, addr, mac string }

// haDocumentOf is version v of the document with only vms as backends and
// as the host's VMs.
func haDocumentOf(v int, vms ...haVM) string {
	var b strings.Builder
	fmt.Fprintf(&b, `version: %d
hash_seed: 0x5eed1234
infra_prefixes: [198.18.1.0/24]
vips:
  - name: web
    address: %s
    protocol: tcp
    port: 80
    vni: 100
    probe: {type: tcp, interval: 1s, timeout: 300ms, rise: 1, fall: 3}
    backends:
`, v, haVIP)
	for _, vm := range vms {
		fmt.Fprintf(&b, "      - {name: %s, address: %s, port: 8080, mac: %q, host: %s}\n", vm.name, vm.addr, vm.mac, haHost)
	}
	fmt.Fprintf(&b, `  - name: echo
    address: %s
    protocol: udp
    port: 7
    vni: 100
    backends:
`, haVIP)
	for _, vm := range vms {
		fmt.Fprintf(&b, "      - {name: %s, address: %s, port: 7007, mac: %q, host: %s}\n", vm.name, vm.addr, vm.mac, haHost)
	}
	fmt.Fprintf(&b, "hosts:\n  - name: host-1\n    address: %s\n    vms:\n", haHost)
	for _, vm := range vms {
		fmt.Fprintf(&b, "      - {vni: 100, address: %s, mac: %q, interface: %s}\n", vm.addr, vm.mac, vm.port)
	}
	return b.String()
}

// TestHostAgentEndToEnd runs examples/mux and examples/hostagent in
// namespaces and sends real HTTP and UDP traffic through the VIP:
//
//  1. the Mux's health probes reach the VMs through the host's kernel, and
//     their answers match the VM ports' DIP rules but are passed to the
//     kernel untranslated (infrastructure prefix);
//  2. every HTTP GET (many concurrent connections, no keep-alive) gets the
//     body of the VM that served it, and both VMs serve; the replies
//     bypass the Mux (Direct Server Return): the router sent the Mux only
//     about what the client sent, while the client received as many
//     packets again, all from the host;
//  3. UDP datagrams to VIP:7 come back from VIP:7 (a connected socket
//     accepts nothing else), echoed by either VM;
//  4. a new document version that removes a VM port makes the agent
//     rebuild its data path, and one that brings it back rebuilds it
//     again; traffic follows both;
//  5. SIGTERM stops the Host Agent cleanly: exit status 0, no XDP program
//     left on the uplink or the VM ports.
func TestHostAgentEndToEnd(t *testing.T) {
	l := newHALab(t)
	l.serveVMs()
	mux := l.start("mux", l.mux, "mux", "-interface", "up", "-metrics", netip.AddrPortFrom(netip.MustParseAddr(haMux), haMuxMet).String(), "-conns", "65536")
	agent := l.start("hostagent", l.host, "hostagent", "-uplink", "up", "-host", "host-1",
		"-metrics", netip.AddrPortFrom(netip.MustParseAddr(haHost), haHostMet).String(), "-conns", "65536")
	muxMetrics := func() map[string]float64 { return l.scrape(t, l.mux, haMux, haMuxMet) }
	hostMetrics := func() map[string]float64 { return l.scrape(t, l.host, haHost, haHostMet) }

	waitFor(t, "the Host Agent's data path", 30*time.Second, func() bool {
		m, err := scrapeErr(l.host, haHost, haHostMet)
		return err == nil && m["xdplb_datapath_up"] == 1 && m["xdplb_config_version"] == 1
	})
	t.Run("1_ProbesPassToKernel", func(t *testing.T) {
		waitFor(t, "both backends up on the Mux (probes answered through the host)", 30*time.Second, func() bool {
			m, err := scrapeErr(l.mux, haMux, haMuxMet)
			return err == nil && m[`xdplb_backend_up{backend="vm-a",vip="web"}`] == 1 &&
				m[`xdplb_backend_up{backend="vm-b",vip="web"}`] == 1
		})
		m := hostMetrics()
		infra := m[`xdplb_steer_packets_total{interface="vm_a",outcome="infra"}`] +
			m[`xdplb_steer_packets_total{interface="vm_b",outcome="infra"}`]
		t.Logf("steering: %v", nonZero(m, "xdplb_steer_packets_total"))
		require.Positive(t, infra, "probe answers matched a DIP rule and were passed for the infrastructure prefix")
		t.Logf("probe answers passed to the kernel by the VM ports' steering: %v", infra)
	})
	if t.Failed() {
		return
	}

	hc := l.httpClient()
	// The first connection waits for both next hops (the Mux's to the
	// host, the host's to the client) to be resolved: retry it.
	waitFor(t, "a first HTTP answer through the VIP", 30*time.Second, func() bool {
		_, err := get(hc)
		return err == nil
	})

	t.Run("2_HTTPThroughVIP", func(t *testing.T) {
		const conns, parallel = 300, 32
		cl0, m1, h0 := l.linkStats(l.client, "up"), l.linkStats(l.router, "m1"), l.linkStats(l.router, "h")
		mux0 := muxMetrics()
		bodies := map[string]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, conns)
		next := make(chan int, conns)
		for i := 0; i < conns; i++ {
			next <- i
		}
		close(next)
		for g := 0; g < parallel; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					body, err := get(hc)
					if err != nil {
						errs <- err
						continue
					}
					mu.Lock()
					bodies[body]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		t.Logf("HTTP GETs served per VM: %v", bodies)
		require.Len(t, bodies, 2, "both DIPs served: %v", bodies)
		require.Equal(t, conns, bodies["vm-a"]+bodies["vm-b"], "every body is a VM's name: %v", bodies)

		// DSR. The Mux's counters first, then the kernel counters of the
		// client's and the router's veths: the last ACKs may still be on
		// their way, and what the Mux counted the client has sent before.
		mux1 := muxMetrics()
		cl1, m2, h1 := l.linkStats(l.client, "up"), l.linkStats(l.router, "m1"), l.linkStats(l.router, "h")
		clTX, clRX := cl1.TxPackets-cl0.TxPackets, cl1.RxPackets-cl0.RxPackets
		toMux := m2.TxPackets - m1.TxPackets
		fromHost := h1.RxPackets - h0.RxPackets
		muxRX := mux1[`xdplb_packets_total{direction="rx"}`] - mux0[`xdplb_packets_total{direction="rx"}`]
		muxTX := mux1[`xdplb_packets_total{direction="tx"}`] - mux0[`xdplb_packets_total{direction="tx"}`]
		t.Logf("client sent %d and received %d packets; router → mux %d packets, host → router %d; mux data path rx %v tx %v",
			clTX, clRX, toMux, fromHost, muxRX, muxTX)
		require.GreaterOrEqual(t, clRX, uint64(3*conns), "each connection's replies reached the client")
		require.Less(t, toMux, clTX+clRX/2, "the Mux saw the requests only (probe traffic is the slack)")
		// The link counters are read one after the other: allow a few
		// packets of skew.
		require.GreaterOrEqual(t, fromHost+32, clRX, "every reply came from the host")
		require.LessOrEqual(t, muxRX, float64(clTX), "the Mux's data path received no more than the client sent")
		require.Equal(t, muxRX, muxTX, "the Mux forwarded all it received")

		m := hostMetrics()
		t.Logf("host agent: rx %v tx %v, NAT inbound %v return %v stateless %v, table %v, drops %v",
			m[`xdplb_packets_total{direction="rx"}`], m[`xdplb_packets_total{direction="tx"}`],
			m[`xdplb_nat_packets_total{outcome="inbound"}`], m[`xdplb_nat_packets_total{outcome="return"}`],
			m[`xdplb_nat_packets_total{outcome="return_stateless"}`], m["xdplb_nat_table_entries"], nonZero(m, "xdplb_drops_total"))
		require.GreaterOrEqual(t, m[`xdplb_nat_packets_total{outcome="return"}`], float64(conns), "replies translated from NAT state")
	})

	t.Run("3_UDPEcho", func(t *testing.T) {
		served := map[string]int{}
		for i := 0; i < 40; i++ {
			msg := fmt.Sprintf("ping %d", i)
			var got string
			var err error
			for try := 0; try < 5; try++ {
				if got, err = l.udpEcho(msg); err == nil {
					break
				}
			}
			require.NoError(t, err, "datagram %d", i)
			name, rest, ok := strings.Cut(got, ": ")
			require.True(t, ok, "echo %q", got)
			require.Equal(t, msg, rest)
			served[name]++
		}
		t.Logf("UDP flows echoed per VM: %v", served)
		require.Len(t, served, 2, "both DIPs echoed: %v", served)
	})

	t.Run("4_Reload", func(t *testing.T) {
		// Version 2 takes vm-b out of the pools and off the host: a VM
		// port goes away, so the agent rebuilds its data path; the Mux
		// reads the same file and sends every new flow to vm-a.
		l.writeDocument(haDocumentOf(2, haVMs[0]))
		waitFor(t, "version 2 applied by both", 20*time.Second, func() bool {
			h, err1 := scrapeErr(l.host, haHost, haHostMet)
			m, err2 := scrapeErr(l.mux, haMux, haMuxMet)
			return err1 == nil && err2 == nil && h["xdplb_config_version"] == 2 && m["xdplb_config_version"] == 2 &&
				h["xdplb_datapath_up"] == 1 && h["xdplb_datapath_builds_total"] == 2
		})
		h := hostMetrics()
		require.Equal(t, 1.0, h[`xdplb_local_dips{interface="vm_a"}`])
		_, hasB := h[`xdplb_local_dips{interface="vm_b"}`]
		require.False(t, hasB, "vm_b is no VM port any more")
		for i := 0; i < 20; i++ {
			body, err := get(hc)
			require.NoError(t, err)
			require.Equal(t, "vm-a", body)
		}
		// Version 3 brings vm-b back: another rebuild, both serve again.
		l.writeDocument(haDocumentOf(3, haVMs...))
		waitFor(t, "version 3 applied by both", 20*time.Second, func() bool {
			h, err1 := scrapeErr(l.host, haHost, haHostMet)
			m, err2 := scrapeErr(l.mux, haMux, haMuxMet)
			return err1 == nil && err2 == nil && h["xdplb_config_version"] == 3 && m["xdplb_config_version"] == 3 &&
				h["xdplb_datapath_up"] == 1 && h["xdplb_datapath_builds_total"] == 3 &&
				m[`xdplb_backend_up{backend="vm-b",vip="web"}`] == 1
		})
		seen := map[string]int{}
		for i := 0; i < 60; i++ {
			body, err := get(hc)
			require.NoError(t, err)
			seen[body]++
		}
		t.Logf("after version 3: %v", seen)
		require.Len(t, seen, 2)
	})

	t.Run("5_CleanShutdown", func(t *testing.T) {
		require.NoError(t, agent.stop(20*time.Second), "hostagent exits with status 0 after SIGTERM")
		for _, ifname := range []string{"up", "vm_a", "vm_b"} {
			lk, err := l.host.Link(ifname)
			require.NoError(t, err)
			x := lk.Attrs().Xdp
			require.False(t, x != nil && x.Attached, "%s: XDP program left attached", ifname)
		}
		require.NoError(t, mux.stop(20*time.Second), "mux exits with status 0 after SIGTERM")
	})
}

func nonZero(m map[string]float64, prefix string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if strings.HasPrefix(k, prefix) && v != 0 {
			out[strings.TrimPrefix(k, prefix)] = v
		}
	}
	return out
}

// haLab is the running topology.
type haLab struct {
	t      *testing.T
	dir    string
	lab    *netlab.Lab
	client *netlab.NS
	router *netlab.NS
	mux    *netlab.NS
	host   *netlab.NS
	vms    []*netlab.NS
	conf   string
	bin    string // the directory of the example binaries
}

func newHALab(t *testing.T) *haLab {
	t.Helper()
	lab := netlab.New(t, "hae2e")
	l := &haLab{t: t, dir: t.TempDir(), lab: lab}
	ns := func(name string) *netlab.NS {
		n, err := lab.Namespace(name)
		require.NoError(t, err)
		return n
	}
	l.client, l.router, l.mux, l.host = ns("client"), ns("router"), ns("mux"), ns("host")
	link := func(n *netlab.NS, rif string, subnet int) {
		_, _, err := lab.Veth(l.router, rif, n, "up")
		require.NoError(t, err)
		require.NoError(t, l.router.AddAddr(rif, fmt.Sprintf("198.18.%d.1/24", subnet)))
		require.NoError(t, n.AddAddr("up", fmt.Sprintf("198.18.%d.2/24", subnet)))
		require.NoError(t, n.AddRoute("198.18.0.0/15", fmt.Sprintf("198.18.%d.1", subnet)))
		require.NoError(t, l.router.SetSysctl("net.ipv4.conf."+rif+".rp_filter", "0"))
	}
	require.NoError(t, l.router.SetSysctl("net.ipv4.ip_forward", "1"))
	require.NoError(t, l.router.SetSysctl("net.ipv4.conf.all.rp_filter", "0"))
	link(l.mux, "m1", 1)
	link(l.host, "h", 3)
	link(l.client, "c", 5)
	// The client's frames cross the Mux's and the host's AF_XDP data
	// paths: they must carry complete checksums.
	require.NoError(t, l.client.DisableChecksumOffload("up"))
	require.NoError(t, l.router.AddRoute(haVIP+"/32", haMux))
	require.NoError(t, l.router.AddRoute("198.18.4.0/24", haHost))
	// The host's kernel forwards the probes to the VMs and their answers.
	require.NoError(t, l.host.SetSysctl("net.ipv4.ip_forward", "1"))

	for _, vm := range haVMs {
		n := ns(strings.ReplaceAll(vm.name, "-", ""))
		l.vms = append(l.vms, n)
		wireVM(t, lab, l.host, n, vm.port, vm.addr, vm.mac, haGateway)
	}

	l.conf = filepath.Join(l.dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(l.conf, []byte(haDocument()), 0o644))
	l.build()
	return l
}

func ipNet(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

// build builds (once per test binary) examples/mux and
// examples/hostagent.
func (l *haLab) build() { l.bin = examplesDir(l.t) }

// examples holds the binaries of examples/mux and examples/hostagent,
// built once for all the end-to-end tests of the binary and removed by
// TestMain.
var examples struct {
	once sync.Once
	dir  string
	err  error
}

// examplesDir builds examples/mux and examples/hostagent on first use and
// returns the directory holding them (as mux and hostagent).
func examplesDir(t *testing.T) string {
	t.Helper()
	examples.once.Do(func() {
		dir, err := os.MkdirTemp("", "xdplb-hostagent-e2e-")
		if err != nil {
			examples.err = err
			return
		}
		examples.dir = dir
		goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goBin); err != nil {
			goBin = "go"
		}
		cmd := exec.Command(goBin, "build", "-o", dir+string(filepath.Separator),
			"github.com/xdplb/xdplb/examples/mux", "github.com/xdplb/xdplb/examples/hostagent")
		if out, err := cmd.CombinedOutput(); err != nil {
			examples.err = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	require.NoError(t, examples.err)
	return examples.dir
}

// TestMain removes the binaries examplesDir built.
func TestMain(m *testing.M) {
	code := m.Run()
	if examples.dir != "" {
		os.RemoveAll(examples.dir)
	}
	os.Exit(code)
}

// writeDocument replaces the document atomically (the watchers see a
// rename).
func (l *haLab) writeDocument(doc string) {
	tmp := l.conf + ".tmp"
	require.NoError(l.t, os.WriteFile(tmp, []byte(doc), 0o644))
	require.NoError(l.t, os.Rename(tmp, l.conf))
}

// serveVMs starts each VM's HTTP server (DIP:8080, the body is the VM's
// name) and UDP echo (DIP:7007, "name: payload").
func (l *haLab) serveVMs() {
	t := l.t
	for i, vm := range haVMs {
		name := vm.name
		ln, err := l.vms[i].Listen(context.Background(), "tcp4", vm.addr+":8080")
		require.NoError(t, err)
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, name) })}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })

		pc, err := l.vms[i].ListenPacket(context.Background(), "udp4", vm.addr+":7007")
		require.NoError(t, err)
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(append([]byte(name+": "), buf[:n]...), from)
			}
		}()
		t.Cleanup(func() { pc.Close() })
	}
}

func (l *haLab) httpClient() *http.Client {
	return &http.Client{
		Timeout: 15 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
				return l.client.Dial(ctx, "tcp4", address)
			},
			DisableKeepAlives: true,
		},
	}
}

// get fetches http://VIP/ and returns the body.
func get(hc *http.Client) (string, error) {
	resp, err := hc.Get("http://" + haVIP + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET: %s", resp.Status)
	}
	return string(b), nil
}

// udpEcho sends msg to VIP:7 from a new connected socket (a new flow)
// and returns the answer.
func (l *haLab) udpEcho(msg string) (string, error) {
	c, err := l.client.Dial(context.Background(), "udp4", haVIP+":7")
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func (l *haLab) linkStats(n *netlab.NS, ifname string) netlink.LinkStatistics {
	l.t.Helper()
	lk, err := n.Link(ifname)
	require.NoError(l.t, err)
	return *lk.Attrs().Statistics
}

// proc is a running example binary.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
	err  error
}

func (l *haLab) start(name string, n *netlab.NS, bin string, args ...string) *proc {
	return startProc(l.t, name, n, filepath.Join(l.bin, bin), append(args, "-config", l.conf)...)
}

// startProc runs the program at path in n; the test's cleanup stops it
// (SIGTERM, then SIGKILL) and prints its output when the test failed or
// runs verbosely.
func startProc(t *testing.T, name string, n *netlab.NS, path string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, log: new(syncBuffer), done: make(chan struct{})}
	p.cmd = n.Command(context.Background(), path, args...)
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

// stop sends SIGTERM and waits for the process (killing it after grace);
// it returns the exit error.
func (p *proc) stop(grace time.Duration) error {
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

func (l *haLab) scrape(t *testing.T, n *netlab.NS, addr string, port int) map[string]float64 {
	t.Helper()
	m, err := scrapeErr(n, addr, port)
	require.NoError(t, err)
	return m
}

// scrapeErr reads a /metrics endpoint from inside n.
func scrapeErr(n *netlab.NS, addr string, port int) (map[string]float64, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			return n.Dial(ctx, "tcp", address)
		},
		DisableKeepAlives: true,
	}}
	resp, err := hc.Get("http://" + net.JoinHostPort(addr, strconv.Itoa(port)) + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
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

// waitFor polls cond until it holds; the deadline is a hang guard.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s after %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
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
