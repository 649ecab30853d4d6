package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// The end-to-end topology (TestHostAgentEndToEnd), a fleetlab.Star:
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
	haGateway = "198.18.4.254" // the VMs' next hop: the host-side veth, resolved by ARP
	haMuxMet  = 9100
	haHostMet = 9101
)

var haVMs = []fleetlab.VM{
	{Name: "vm-a", Host: 1, Port: "vm_a", Addr: netip.MustParseAddr("198.18.4.1"), MAC: net.HardwareAddr{2, 0, 0, 0, 4, 1}},
	{Name: "vm-b", Host: 1, Port: "vm_b", Addr: netip.MustParseAddr("198.18.4.2"), MAC: net.HardwareAddr{2, 0, 0, 0, 4, 2}},
}

// haDocument is the fleet's document, read by the Mux and the Host Agent
// alike.
func haDocument() *fleetlab.Doc { return haDocumentOf(1, haVMs...) }

// haDocumentOf is version v of the document with only vms as backends and
// as the host's VMs: a web VIP (TCP 80 → 8080, probed) and an echo VIP
// (UDP 7 → 7007), both in VNI 100.
func haDocumentOf(v uint64, vms ...fleetlab.VM) *fleetlab.Doc {
	vip := netip.MustParseAddr(haVIP)
	return &fleetlab.Doc{
		Version:     v,
		Infra:       []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")},
		MuxPrefixes: []netip.Prefix{netip.PrefixFrom(netip.MustParseAddr(haMux), 32)},
		Services: []fleetlab.Service{
			{Name: "web", Addr: vip, Proto: flow.ProtoTCP, Port: 80, VNI: 100, DIPPort: 8080,
				Probe: &health.Spec{Type: health.ProbeTCP, Interval: time.Second, Timeout: 300 * time.Millisecond, Rise: 1, Fall: 3}},
			{Name: "echo", Addr: vip, Proto: flow.ProtoUDP, Port: 7, VNI: 100, DIPPort: 7007},
		},
		Pool:  vms,
		Hosts: []fleetlab.Host{{Name: "host-1", Addr: netip.MustParseAddr(haHost)}},
	}
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
//     again; traffic follows both, and keep-alive connections to the VM
//     that stays exchange requests throughout without losing a packet
//     (no segment retransmitted that its peer had not received);
//  5. the running version rewritten in place with other content is a
//     conflict: both nodes keep what they run, say so in
//     xdplb_config_error{reason="conflict"}, and apply the next version;
//  6. SIGTERM stops the Host Agent cleanly: exit status 0, no XDP program
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
		// The Mux's first probes may have been answered before the VM
		// ports' steering programs were attached (the backends are up
		// either way): wait for an answer that crossed them. Probes come
		// every 2 s; a steering program that does not pass them keeps
		// this at 0 and fails the test.
		var m map[string]float64
		var infra float64
		waitFor(t, "probe answers matched a DIP rule and passed for the infrastructure prefix", 30*time.Second, func() bool {
			m = hostMetrics()
			infra = m[`xdplb_steer_packets_total{interface="vm_a",outcome="infra"}`] +
				m[`xdplb_steer_packets_total{interface="vm_b",outcome="infra"}`]
			return infra > 0
		})
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
		// The warm-up's last packets (a delayed ACK, a worker's backlog
		// on a loaded machine) can reach the Mux's counters after the
		// window below opens, with the link counters read before them:
		// CI saw the Mux count 2 packets more than the client sent. Open
		// the window once the Mux's data path has gone quiet.
		lastRX := -1.0
		waitFor(t, "the Mux's data path to go quiet", 30*time.Second, func() bool {
			time.Sleep(200 * time.Millisecond)
			rx := muxMetrics()[`xdplb_packets_total{direction="rx"}`]
			quiet := rx == lastRX
			lastRX = rx
			return quiet
		})
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
		// Keep-alive connections to vm-a exchange requests through both
		// rebuilds: vm-a's port stays, so its connections must not
		// notice them.
		conns := l.connsTo(t, "vm-a", 4)
		dips := []string{"vm-a", "vm-a", "vm-a", "vm-a"}
		ex := startExchanges(conns, dips, 2*time.Millisecond)
		defer ex.finish(t)
		ex.waitRounds(t, 2)
		ends := append([]*netlab.NS{l.client}, l.vms...) // both ends of the connections
		retrans0 := readRetrans(t, ends...)
		h0, m0 := hostMetrics(), muxMetrics()
		ex.resetSlow()

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
		ex.waitRounds(t, 3)
		ex.finish(t)
		// Where a lost segment went, if one was: the drops the two nodes
		// counted during the step.
		h1, m1 := hostMetrics(), muxMetrics()
		t.Logf("drops during the step: host agent %v, mux %v, host steering %v",
			delta(nonZero(h1, "xdplb_drops_total"), nonZero(h0, "xdplb_drops_total")),
			delta(nonZero(m1, "xdplb_drops_total"), nonZero(m0, "xdplb_drops_total")),
			delta(nonZero(h1, "xdplb_steer_packets_total"), nonZero(h0, "xdplb_steer_packets_total")))
		requireUndisturbed(t, readRetrans(t, ends...).since(retrans0), ex,
			"to vm-a while the agent rebuilt its data path twice (vm_b's port removed, then added back)")
	})

	t.Run("5_VersionConflict", func(t *testing.T) {
		const conflict = `xdplb_config_error{reason="conflict"}`
		// Version 3 again, without vm-b, written in place.
		b, err := haDocumentOf(3, haVMs[0]).Marshal()
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(l.conf, b, 0o644))
		waitFor(t, "the conflict reported by both", 20*time.Second, func() bool {
			h, err1 := scrapeErr(l.host, haHost, haHostMet)
			m, err2 := scrapeErr(l.mux, haMux, haMuxMet)
			return err1 == nil && err2 == nil && h[conflict] == 1 && m[conflict] == 1
		})
		h, m := hostMetrics(), muxMetrics()
		require.Equal(t, 3.0, h["xdplb_config_version"])
		require.Equal(t, 3.0, m["xdplb_config_version"])
		require.Equal(t, 1.0, h[`xdplb_local_dips{interface="vm_b"}`], "the host keeps vm-b's port")
		seen := map[string]int{}
		for i := 0; i < 60; i++ {
			body, err := get(hc)
			require.NoError(t, err)
			seen[body]++
		}
		require.Len(t, seen, 2, "both VMs still serve: %v", seen)

		// A higher version applies, and clears the error.
		l.writeDocument(haDocumentOf(4, haVMs...))
		waitFor(t, "version 4 applied by both, no error", 20*time.Second, func() bool {
			h, err1 := scrapeErr(l.host, haHost, haHostMet)
			m, err2 := scrapeErr(l.mux, haMux, haMuxMet)
			return err1 == nil && err2 == nil && h["xdplb_config_version"] == 4 && m["xdplb_config_version"] == 4 &&
				h[conflict] == 0 && m[conflict] == 0
		})
	})

	t.Run("6_CleanShutdown", func(t *testing.T) {
		require.NoError(t, agent.Stop(20*time.Second), "hostagent exits with status 0 after SIGTERM")
		for _, ifname := range []string{"up", "vm_a", "vm_b"} {
			lk, err := l.host.Link(ifname)
			require.NoError(t, err)
			x := lk.Attrs().Xdp
			require.False(t, x != nil && x.Attached, "%s: XDP program left attached", ifname)
		}
		require.NoError(t, mux.Stop(20*time.Second), "mux exits with status 0 after SIGTERM")
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

// delta returns a - b, key by key, leaving out what did not change.
func delta(a, b map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range a {
		if d := v - b[k]; d != 0 {
			out[k] = d
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
	star, err := fleetlab.NewStar(lab)
	require.NoError(t, err)
	l.router = star.Router
	attach := func(name, rif string, subnet int) *netlab.NS {
		n, err := star.Attach(name, rif, subnet)
		require.NoError(t, err)
		return n
	}
	l.mux = attach("mux", "m1", 1)
	l.host = attach("host", "h", 3)
	l.client = attach("client", "c", 5)
	// The client and the VMs keep the kernel's offloads: their frames
	// reach the data paths with partial checksums (engine.PartialChecksums).
	require.NoError(t, l.router.AddRoute(haVIP+"/32", haMux))
	require.NoError(t, l.router.AddRoute("198.18.4.0/24", haHost))
	// The host's kernel forwards the probes to the VMs and their answers.
	require.NoError(t, l.host.SetSysctl("net.ipv4.ip_forward", "1"))

	for _, vm := range haVMs {
		n, err := lab.Namespace(strings.ReplaceAll(vm.Name, "-", ""))
		require.NoError(t, err)
		l.vms = append(l.vms, n)
		require.NoError(t, fleetlab.WireVM(lab, l.host, n, vm, netip.MustParseAddr(haGateway)))
	}

	l.conf = filepath.Join(l.dir, "fleet.yaml")
	l.writeDocument(haDocument())
	l.bin = fleetlabtest.Examples(t)
	return l
}

// writeDocument replaces the document atomically (the watchers see a
// rename).
func (l *haLab) writeDocument(doc *fleetlab.Doc) { fleetlabtest.WriteDocument(l.t, l.conf, doc) }

// serveVMs starts each VM's HTTP server (DIP:8080, the body is the VM's
// name) and UDP echo (DIP:7007, "name: payload").
func (l *haLab) serveVMs() {
	for i, vm := range haVMs {
		fleetlabtest.ServeVM(l.t, l.vms[i], vm.Name, vm.Addr, 8080, 7007)
	}
}

func (l *haLab) httpClient() *http.Client { return fleetlab.HTTPClient(l.client, 15*time.Second) }

// get fetches http://VIP/ and returns the body.
// connsTo opens n keep-alive connections from the client to the web VIP
// that the Mux sends to the VM called vm (connections it sends elsewhere
// are closed and replaced). The test's cleanup closes them.
func (l *haLab) connsTo(t *testing.T, vm string, n int) []*flConn {
	t.Helper()
	var out []*flConn
	for tries := 0; len(out) < n; tries++ {
		require.Less(t, tries, 200, "%d connections to %s", n, vm)
		var c net.Conn
		err := l.client.Do(func() (err error) {
			c, err = net.DialTimeout("tcp4", net.JoinHostPort(haVIP, "80"), 5*time.Second)
			return err
		})
		require.NoError(t, err)
		fc := &flConn{port: uint16(c.LocalAddr().(*net.TCPAddr).Port), c: c, br: bufio.NewReader(c)}
		name, err := fc.get("open", false, 5*time.Second)
		require.NoError(t, err)
		if name != vm {
			fc.close()
			continue
		}
		t.Cleanup(fc.close)
		out = append(out, fc)
	}
	return out
}

func get(hc *http.Client) (string, error) { return fleetlab.Get(hc, "http://"+haVIP+"/") }

// udpEcho sends msg to VIP:7 from a new connected socket (a new flow)
// and returns the answer.
func (l *haLab) udpEcho(msg string) (string, error) {
	return fleetlab.UDPEcho(l.client, netip.AddrPortFrom(netip.MustParseAddr(haVIP), 7), msg, 2*time.Second)
}

func (l *haLab) linkStats(n *netlab.NS, ifname string) netlink.LinkStatistics {
	l.t.Helper()
	return fleetlabtest.LinkStats(l.t, n, ifname)
}

// start runs the example binary bin in n with the document; the test's
// cleanup stops it and logs its output when the test failed.
func (l *haLab) start(name string, n *netlab.NS, bin string, args ...string) *fleetlab.Proc {
	l.t.Helper()
	return fleetlabtest.Start(l.t, n, name, filepath.Join(l.bin, bin), append(args, "-config", l.conf)...)
}

func (l *haLab) scrape(t *testing.T, n *netlab.NS, addr string, port int) map[string]float64 {
	t.Helper()
	m, err := scrapeErr(n, addr, port)
	require.NoError(t, err)
	return m
}

// scrapeErr reads the /metrics endpoint addr:port from inside n.
func scrapeErr(n *netlab.NS, addr string, port int) (map[string]float64, error) {
	return fleetlab.Scrape(n, netip.AddrPortFrom(netip.MustParseAddr(addr), uint16(port)))
}

// waitFor polls cond until it holds; the deadline is a hang guard.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	fleetlabtest.WaitFor(t, what, limit, cond)
}
