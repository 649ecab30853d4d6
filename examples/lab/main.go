//go:build linux

// Command lab runs the whole xdplb system on one machine, in network
// namespaces, with real traffic through a VIP:
//
//	sudo go run ./examples/lab -duration 10s -conns 32
//
// It builds two clients, a router (BIRD 2 speaking BGP with the Muxes when
// it is installed, else static ECMP routes), two Muxes and two hosts with
// two VMs each, every VM running a small HTTP server and a UDP echo, and a
// third host without a Host Agent (a kernel vxlan device holding the VIP,
// its servers on the VIP's ports); it starts a Mux on each Mux namespace
// and a Host Agent on each of the first two hosts (this
// same binary, re-executed in the namespace with -role), sends HTTP
// requests (one connection each) and UDP datagrams to the VIP for
// -duration, prints what happened — connections per DIP against the
// weights, requests per second, errors, the data paths' drops, the
// router's routes — and tears everything down, also on Ctrl-C. -keep
// leaves the topology up until Ctrl-C.
//
// Replies take the Direct Server Return path: VM → Host Agent (DIP→VIP) →
// router → client, or host3's server (from the VIP) → router → client,
// never through a Mux.
//
// Everything is dual-stack: the VMs serve an IPv4 and an IPv6 VIP from
// one MAC and eth0 each, and half the HTTP connections and a UDP echo
// stream per client go to the IPv6 VIP, announced over BGP with an IPv6
// next hop; the report has a table per family.
//
// Addresses are 198.18.0.0/15 and 2001:db8::/32 only, inside the lab's namespaces. Needs
// root (namespaces, XDP, AF_XDP).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/hostagent"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/netlab"
	"github.com/xdplb/xdplb/internal/node"
	"github.com/xdplb/xdplb/internal/nodemetrics"
	"github.com/xdplb/xdplb/mux"
)

const labPrefix = "xlab"

func main() {
	var (
		duration = flag.Duration("duration", 10*time.Second, "how long to send traffic")
		conns    = flag.Int("conns", 32, "concurrent HTTP connections (over both clients)")
		keep     = flag.Bool("keep", false, "keep the topology after the traffic, until Ctrl-C")
		ctlMode  = flag.String("control", "etcd", "where the nodes take the document from: etcd (an embedded etcd, one document for the fleet) or file (a file per Mux and one for the hosts)")
		etcdEPs  = flag.String("etcd", "", "internal (-role): etcd endpoints")
		nodeName = flag.String("node", "", "internal (-role mux): the Mux's name")
		role     = flag.String("role", "", "internal: run as mux or hostagent inside a namespace")
		ifname   = flag.String("interface", "up", "internal (-role): the uplink")
		config   = flag.String("config", "", "internal (-role): the document")
		host     = flag.String("host", "", "internal (-role hostagent): the host's name")
		metricsA = flag.String("metrics", "", "internal (-role): the /metrics address")
	)
	flag.Parse()
	if *role != "" {
		if err := runRole(*role, *ifname, *config, *host, *nodeName, *etcdEPs, *metricsA); err != nil {
			fmt.Fprintf(os.Stderr, "lab %s: %v\n", *role, err)
			os.Exit(1)
		}
		return
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "lab: run as root (network namespaces, XDP and AF_XDP need it)")
		os.Exit(2)
	}
	if *ctlMode != "etcd" && *ctlMode != "file" {
		fmt.Fprintln(os.Stderr, "lab: -control must be etcd or file")
		os.Exit(2)
	}
	if *conns < 1 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "lab: -conns must be at least 1 and -duration positive")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *duration, *conns, *keep, *ctlMode == "etcd"); err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, duration time.Duration, conns int, keep, useEtcd bool) (err error) {
	_ = netlab.CleanupStale(labPrefix) // what a killed earlier run left
	lab, err := netlab.NewStandalone(labPrefix)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "xdplb-lab-")
	if err != nil {
		return err
	}
	t := &topo{dir: dir, lab: lab, useEtcd: useEtcd}
	defer func() {
		fmt.Println("tearing down: stopping the processes, removing the namespaces")
		t.stopAll(15 * time.Second)
		t.stopEtcd() // after the nodes: they leave etcd as they stop
		if cerr := lab.Close(); cerr != nil && err == nil {
			err = cerr
		}
		if err != nil {
			for _, p := range t.procs {
				fmt.Printf("--- %s log (%s), last lines:\n%s\n", p.name, p.log, tail(p.log, 15))
			}
		}
		os.RemoveAll(dir)
	}()

	fmt.Println("building the topology: 2 clients, router, 2 Muxes, 2 hosts, 4 VMs, host3 with a kernel vxlan device, an internet namespace")
	if err := t.build(); err != nil {
		return err
	}
	if err := t.routeVIP(ctx); err != nil {
		return err
	}
	if err := t.serveVMs(); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// Where each node takes its document from: the fleet's one document
	// in etcd, or files.
	muxSource := func(i int) ([]string, error) {
		if useEtcd {
			return []string{"-etcd", t.etcdEndpoint(), "-node", fmt.Sprintf("mux%d", i)}, nil
		}
		doc, err := t.writeDocument(i)
		return []string{"-config", doc}, err
	}
	hostSource := func() ([]string, error) {
		if useEtcd {
			return []string{"-etcd", t.etcdEndpoint()}, nil
		}
		doc, err := t.writeDocument(0)
		return []string{"-config", doc}, err
	}
	if useEtcd {
		if err := t.startEtcd(ctx); err != nil {
			return err
		}
	}
	for i, n := range t.Muxes {
		src, err := muxSource(i + 1)
		if err != nil {
			return err
		}
		if err := t.start(fmt.Sprintf("mux%d", i+1), n, self, append([]string{"-role", "mux", "-interface", "up",
			"-metrics", net.JoinHostPort(muxAddr(i+1), strconv.Itoa(metrics))}, src...)...); err != nil {
			return err
		}
	}
	for j, n := range t.Hosts {
		src, err := hostSource()
		if err != nil {
			return err
		}
		if err := t.start(fmt.Sprintf("host%d", j+1), n, self, append([]string{"-role", "hostagent", "-interface", "up",
			"-host", fmt.Sprintf("host%d", j+1), "-metrics", net.JoinHostPort(hostAddr(j+1), strconv.Itoa(metrics))}, src...)...); err != nil {
			return err
		}
	}
	fmt.Println("started a Mux in mux1 and mux2, a Host Agent in host1 and host2 (this binary, -role); logs in", dir)

	if err := waitReady(ctx, t); err != nil {
		return err
	}
	fmt.Printf("sending HTTP (%d connections at a time) and UDP to %s and %s for %v\n", conns, vip, vip6, duration)
	before := scrapeAll(t)
	res := traffic(ctx, t, duration, conns)
	if ctx.Err() != nil {
		fmt.Println("interrupted: the numbers below cover the traffic sent until then")
	}
	after := scrapeAll(t)
	report(t, res, before, after, conns)
	inboundNATReport(t)
	outboundReport(ctx, t)
	if useEtcd {
		t.fleetStatus(ctx)
	}

	if keep && ctx.Err() == nil {
		fmt.Println("\nthe topology stays up until Ctrl-C; for instance:")
		fmt.Printf("  ip netns exec %s curl -s http://%s/\n", t.Clients[0].Name(), vip)
		fmt.Printf("  ip netns exec %s curl -s 'http://[%s]/'\n", t.Clients[0].Name(), vip6)
		fmt.Printf("  ip netns exec %s ip route show %s\n", t.Router.Name(), vip)
		fmt.Printf("  ip netns exec %s curl -s http://%s/metrics | grep xdplb_nat\n", t.Hosts[0].Name(), net.JoinHostPort(hostAddr(1), strconv.Itoa(metrics)))
		if useEtcd {
			fmt.Printf("  go run ./examples/xdplbctl -etcd %s status\n", t.etcdEndpoint())
		}
		<-ctx.Done()
	}
	return nil
}

// runRole runs a Mux or a Host Agent in the current namespace until
// SIGINT/SIGTERM, serving /metrics.
func runRole(role, ifname, config, host, nodeName, etcdEPs, metricsAddr string) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reg := prometheus.NewRegistry()
	var runFn func(context.Context) error
	// With etcd, the document comes from there, every node reports its
	// status, the Host Agents probe their own DIPs and publish the
	// verdicts, and the Muxes follow those instead of probing.
	var fl *node.Fleet
	var src control.Source
	if etcdEPs != "" {
		name, r := nodeName, fleet.RoleMux
		if role == "hostagent" {
			name, r = host, fleet.RoleHostAgent
		}
		var err error
		if fl, err = node.NewFleet(etcdEPs, fleet.DefaultPrefix, r, name, log); err != nil {
			return err
		}
		defer fl.Close()
		src = fl.Source
	}
	switch role {
	case "mux":
		m, err := mux.New(mux.Config{Interface: ifname, ConfigPath: config, Source: src, Node: nodeName, Logger: log,
			ExternalHealth: fl != nil})
		if err != nil {
			return err
		}
		if fl != nil {
			if err := fl.WatchHealth(m.Controller().SetDIPHealth); err != nil {
				return err
			}
			if err := fl.WatchPortAllocations(m.Controller()); err != nil {
				return err
			}
		}
		reg.MustRegister(m.Collector())
		runFn = m.Run
	case "hostagent":
		cfg := hostagent.Config{Uplink: ifname, Host: host, ConfigPath: config, Source: src, Logger: log}
		var agent atomic.Pointer[hostagent.Agent]
		if fl != nil {
			publish, err := fl.PublishHealth(func() []hostagent.DIPHealth {
				if a := agent.Load(); a != nil {
					return a.DIPHealth()
				}
				return nil
			})
			if err != nil {
				return err
			}
			cfg.OnDIPHealth = publish
		}
		a, err := hostagent.New(cfg)
		if err != nil {
			return err
		}
		agent.Store(a)
		reg.MustRegister(a.Collector())
		if fl != nil {
			// Outbound port ranges are claimed in etcd for this host's
			// VMs and handed to the source NAT.
			if err := fl.AllocatePorts(a, a.SNAT().MaxTimeout()); err != nil {
				return err
			}
			reg.MustRegister(nodemetrics.OutboundRanges(fl.AllocationCounters))
		}
		runFn = a.Run
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	if fl != nil {
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { fl.Run(rctx); close(done) }()
		defer func() { cancel(); <-done }()
	}
	srv := &http.Server{Addr: metricsAddr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint", "err", err)
		}
	}()
	defer srv.Close()
	return runFn(ctx)
}

// serveVMs starts every VM's HTTP server (DIP:8080, answering the VM's
// name) and UDP echo (DIP:7007, answering "name: payload"), and host3's
// (the VIP's ports 80 and 7 on the VIP, HTTP also on host3's address for
// the probes).
func (t *topo) serveVMs() error {
	for _, vm := range append(slices.Clone(vms), vms6...) {
		if _, err := fleetlab.ServeVM(t.VMs[vm.Name], vm.Name, vm.Addr, dipTCP, dipUDP); err != nil {
			return err
		}
	}
	kvx := pool[len(pool)-1]
	if _, err := fleetlab.ServeKernelVXLAN(t.kernel, kernelHost, kvx.Name, vipTCP, vipUDP); err != nil {
		return err
	}
	return t.serveInternet()
}

// waitReady waits until the router routes the VIP over both Muxes, every
// Mux sees every backend up, every Host Agent forwards, and a first
// request from each client is answered (which also resolves the next
// hops).
func waitReady(ctx context.Context, t *topo) error {
	fmt.Print("waiting for the VIP route, the health probes and the data paths... ")
	start := time.Now()
	for _, vipRoute := range []netip.Prefix{netip.PrefixFrom(fleetlab.FleetVIP, 32), netip.PrefixFrom(fleetlab.FleetVIP6, 128)} {
		if err := fleetlab.Poll(ctx, "the router's ECMP route to "+vipRoute.String()+" over both Muxes", 60*time.Second, func() bool {
			hops, err := fleetlab.NextHops(t.Router, vipRoute)
			return err == nil && len(hops) == 2
		}); err != nil {
			return err
		}
	}
	for i, n := range t.Muxes {
		if err := fleetlab.Poll(ctx, fmt.Sprintf("mux%d: every backend up", i+1), 30*time.Second, func() bool {
			m, err := scrape(n, muxAddr(i+1))
			if err != nil {
				return false
			}
			for _, vm := range vms {
				if m[fmt.Sprintf(`xdplb_backend_up{backend=%q,vip="web"}`, vm.Name)] != 1 ||
					m[fmt.Sprintf(`xdplb_backend_up{backend=%q,vip="web6"}`, vm.Name)] != 1 {
					return false
				}
			}
			for _, vm := range pool[len(vms):] {
				if m[fmt.Sprintf(`xdplb_backend_up{backend=%q,vip="web"}`, vm.Name)] != 1 {
					return false
				}
			}
			return true
		}); err != nil {
			return err
		}
	}
	for j, n := range t.Hosts {
		if err := fleetlab.Poll(ctx, fmt.Sprintf("host%d: data path", j+1), 30*time.Second, func() bool {
			m, err := scrape(n, hostAddr(j+1))
			return err == nil && m["xdplb_datapath_up"] == 1
		}); err != nil {
			return err
		}
	}
	for k, c := range t.Clients {
		hc := fleetlab.HTTPClient(c, 3*time.Second)
		if err := fleetlab.Poll(ctx, fmt.Sprintf("client%d: a first answer from the VIPs", k+1), 30*time.Second, func() bool {
			_, err := get(hc, vipURL)
			_, err6 := get(hc, vip6URL)
			return err == nil && err6 == nil
		}); err != nil {
			return err
		}
	}
	fmt.Printf("ready after %v\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// results is what the traffic generators saw.
type results struct {
	elapsed              time.Duration
	mu                   sync.Mutex
	perDIP               map[string]int
	httpErrs             int
	firstErr             error
	udpSent, udpAnswered atomic.Int64
	udpWrong             atomic.Int64
	// v6 is the same over IPv6 (nil in itself).
	v6 *results
}

// traffic sends, from every client, HTTP GETs on new connections (conns
// at a time over all clients) and UDP echo requests from new sockets (a
// new flow each), until duration has passed or ctx is done.
func traffic(ctx context.Context, t *topo, duration time.Duration, conns int) *results {
	res := &results{perDIP: map[string]int{}, v6: &results{perDIP: map[string]int{}}}
	ctx, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < conns; g++ {
		c := t.Clients[g%len(t.Clients)]
		hc := fleetlab.HTTPClient(c, 5*time.Second)
		// Every other round of clients sends to the IPv6 VIP.
		res, url := res, vipURL
		if (g/len(t.Clients))%2 == 1 {
			res, url = res.v6, vip6URL
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				body, err := get(hc, url)
				res.mu.Lock()
				if err != nil {
					if ctx.Err() == nil {
						res.httpErrs++
						if res.firstErr == nil {
							res.firstErr = err
						}
					}
				} else {
					res.perDIP[body]++
				}
				res.mu.Unlock()
			}
		}()
	}
	for _, c := range t.Clients {
		for _, fam := range []struct {
			res  *results
			echo netip.AddrPort
		}{{res, netip.AddrPortFrom(fleetlab.FleetVIP, vipUDP)}, {res.v6, netip.AddrPortFrom(fleetlab.FleetVIP6, vipUDP)}} {
			res, echo := fam.res, fam.echo
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					msg := fmt.Sprintf("echo %d", i)
					res.udpSent.Add(1)
					answer, err := fleetlab.UDPEcho(c, echo, msg, time.Second)
					if err != nil {
						continue
					}
					if _, rest, ok := strings.Cut(answer, ": "); ok && rest == msg {
						res.udpAnswered.Add(1)
					} else {
						res.udpWrong.Add(1)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	res.v6.elapsed = res.elapsed
	return res
}

// The VIPs' HTTP URLs.
var (
	vipURL  = "http://" + vip + "/"
	vip6URL = "http://[" + vip6 + "]/"
)

// get fetches url and returns the body: the name of the VM that served it.
func get(hc *http.Client, url string) (string, error) { return fleetlab.Get(hc, url) }

// scrapeAll reads every Mux's and Host Agent's /metrics, by node name.
func scrapeAll(t *topo) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for i, n := range t.Muxes {
		out[fmt.Sprintf("mux%d", i+1)], _ = scrape(n, muxAddr(i+1))
	}
	for j, n := range t.Hosts {
		out[fmt.Sprintf("host%d", j+1)], _ = scrape(n, hostAddr(j+1))
	}
	return out
}

// scrape reads the /metrics of the node at addr (in namespace n).
func scrape(n *netlab.NS, addr string) (map[string]float64, error) {
	return fleetlab.Scrape(n, netip.AddrPortFrom(netip.MustParseAddr(addr), metrics))
}

func report(t *topo, res *results, before, after map[string]map[string]float64, conns int) {
	reportFamily("HTTP", vip, pool, res, (conns+1)/2)
	reportFamily("HTTP over IPv6", vip6, vms6, res.v6, conns/2)

	delta := func(node, key string) float64 { return after[node][key] - before[node][key] }
	fmt.Println("\ndata paths during the traffic (from /metrics):")
	for _, node := range []string{"mux1", "mux2", "host1", "host2"} {
		if before[node] == nil || after[node] == nil {
			fmt.Printf("  %-5s /metrics could not be read\n", node)
			continue
		}
		drops := map[string]float64{}
		partial := 0.0 // frames whose checksum a local sender left to offload
		for k := range after[node] {
			if strings.HasPrefix(k, "xdplb_drops_total") {
				if d := delta(node, k); d != 0 {
					drops[strings.TrimSuffix(strings.TrimPrefix(k, `xdplb_drops_total{reason="`), `"}`)] = d
				}
			}
			if strings.HasPrefix(k, "xdplb_partial_checksums_total") {
				partial += delta(node, k)
			}
		}
		line := fmt.Sprintf("  %-5s rx %8.0f  tx %8.0f", node, delta(node, `xdplb_packets_total{direction="rx"}`),
			delta(node, `xdplb_packets_total{direction="tx"}`))
		if strings.HasPrefix(node, "mux") {
			// Established flows' packets the workers encapsulated from
			// their caches of decisions (hit), or not (miss).
			line += fmt.Sprintf("  fast path hit %.0f, miss %.0f",
				delta(node, `xdplb_mux_fastpath_packets_total{result="hit"}`), delta(node, `xdplb_mux_fastpath_packets_total{result="miss"}`))
		}
		if strings.HasPrefix(node, "host") {
			line += fmt.Sprintf("  NAT inbound %.0f, return %.0f (stateless %.0f), table %.0f",
				delta(node, `xdplb_nat_packets_total{outcome="inbound"}`), delta(node, `xdplb_nat_packets_total{outcome="return"}`),
				delta(node, `xdplb_nat_packets_total{outcome="return_stateless"}`), after[node]["xdplb_nat_table_entries"])
		}
		fmt.Printf("%s  partial checksums completed %.0f  drops %v\n", line, partial, drops)
	}
	fmt.Println("  " + kernelReport(t))
	fmt.Println("  (the Muxes carry only the client → VIP direction; replies leave the hosts straight for the router;")
	fmt.Println("   clients and VMs keep the kernel's checksum offload, so their frames arrive with partial checksums)")

	fmt.Println("\nrouter's route table:")
	out, _ := exec.Command("ip", "-n", t.Router.Name(), "route", "show").CombinedOutput()
	fmt.Print(indent(string(out)))
	out, _ = exec.Command("ip", "-n", t.Router.Name(), "-6", "route", "show", "root", "2001:db8:100::/48").CombinedOutput()
	fmt.Print(indent(string(out)))
	if t.bird != nil {
		out, _ := t.bird.Birdc("show route")
		fmt.Print(indent(out))
	}
}

// reportFamily prints what the HTTP and UDP generators of one address
// family saw: label names the family, pool its DIPs.
func reportFamily(label, vip string, pool []fleetlab.VM, res *results, conns int) {
	total := 0
	weights := 0
	for _, vm := range pool {
		total += res.perDIP[vm.Name]
		weights += int(vm.Weight)
	}
	secs := res.elapsed.Seconds()
	fmt.Printf("\n%s: %d requests to %s in %.1fs = %.0f requests/s (%d connections at a time, one connection per request), %d errors\n",
		label, total, vip, secs, float64(total)/secs, conns, res.httpErrs)
	if res.firstErr != nil {
		fmt.Printf("  first error: %v\n", res.firstErr)
	}
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "DIP\thost\tweight\texpected share\tconnections\tshare\t")
	for _, vm := range pool {
		share := 0.0
		if total > 0 {
			share = float64(res.perDIP[vm.Name]) / float64(total)
		}
		fmt.Fprintf(tw, "%s %s\thost%d\t%d\t%.1f%%\t%d\t%.1f%%\t\n", vm.Name, vm.Addr, vm.Host, vm.Weight,
			100*float64(vm.Weight)/float64(weights), res.perDIP[vm.Name], 100*share)
	}
	tw.Flush()
	sent, answered := res.udpSent.Load(), res.udpAnswered.Load()
	fmt.Printf("UDP echo: %d datagrams sent (a new flow each), %d answered from the VIP, %d lost, %d wrong\n",
		sent, answered, sent-answered-res.udpWrong.Load(), res.udpWrong.Load())
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// kernelReport describes host3, which has no /metrics: what its vxlan
// device received and its kernel's checksum errors, since the lab started.
func kernelReport(t *topo) string {
	st, err := fleetlab.LinkStats(t.kernel, kernelHost.Device())
	if err != nil {
		return "host3 " + err.Error()
	}
	c, err := fleetlab.SNMP(t.kernel)
	if err != nil {
		return "host3 " + err.Error()
	}
	return fmt.Sprintf("host3 kernel VXLAN, no Host Agent, since the start: %s rx %d, TcpInCsumErrors %d, UdpInCsumErrors %d",
		kernelHost.Device(), st.RxPackets, c["Tcp.InCsumErrors"], c["Udp.InCsumErrors"])
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// inboundNATReport asks each port of the inbound NAT rule which VM
// answers: each must be its one target, every time.
func inboundNATReport(t *topo) {
	hc := fleetlab.HTTPClient(t.Clients[0], 3*time.Second)
	fmt.Println("\ninbound NAT (one VIP port to one VM):")
	for _, r := range inboundNAT {
		for i, target := range r.Targets {
			port := int(r.FirstPort) + i
			answers := map[string]int{}
			for range 10 {
				body, err := get(hc, fmt.Sprintf("http://%s/", net.JoinHostPort(vip, strconv.Itoa(port))))
				if err != nil {
					body = "error: " + err.Error()
				}
				answers[strings.TrimSpace(body)]++
			}
			fmt.Printf("  %s:%d -> %v:%d: answers %v\n", vip, port, target, r.BackendPort, answers)
		}
	}
}
