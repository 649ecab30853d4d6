//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/netlab"
)

// The lab's topology:
//
//	client1 [up 198.18.11.2] ─ [c1 198.18.11.1] ┐
//	client2 [up 198.18.12.2] ─ [c2 198.18.12.1] ┤
//	mux1    [up 198.18.1.2]  ─ [m1 198.18.1.1]  ├ router (BIRD 2, or static ECMP routes)
//	mux2    [up 198.18.2.2]  ─ [m2 198.18.2.1]  ┤
//	host1   [up 198.18.21.2] ─ [h1 198.18.21.1] ┤   host1: vm1 ─ vm11 (198.18.31.1), vm2 ─ vm12 (198.18.31.2)
//	host2   [up 198.18.22.2] ─ [h2 198.18.22.1] ┘   host2: vm1 ─ vm21 (198.18.32.1), vm2 ─ vm22 (198.18.32.2)
const (
	vip       = "198.18.100.1"
	vipTCP    = 80
	vipUDP    = 7
	dipTCP    = 8080
	dipUDP    = 7007
	vni       = 100
	gateway   = "198.18.30.254" // the VMs' next hop (a static neighbour on the host-side veth)
	metrics   = 9100
	routerASN = 65000
	muxASN    = 65010
)

// vmSpec is one VM: its name (also what it answers), host, port on the
// host, DIP, MAC and weight in the VIP's pool.
type vmSpec struct {
	name   string
	host   int // 1 or 2
	port   string
	addr   string
	mac    string
	weight int
}

var vms = []vmSpec{
	{"vm11", 1, "vm1", "198.18.31.1", "02:00:00:00:31:01", 1},
	{"vm12", 1, "vm2", "198.18.31.2", "02:00:00:00:31:02", 2},
	{"vm21", 2, "vm1", "198.18.32.1", "02:00:00:00:32:01", 1},
	{"vm22", 2, "vm2", "198.18.32.2", "02:00:00:00:32:02", 4},
}

func muxAddr(i int) string    { return fmt.Sprintf("198.18.%d.2", i) }
func muxRouter(i int) string  { return fmt.Sprintf("198.18.%d.1", i) }
func hostAddr(j int) string   { return fmt.Sprintf("198.18.%d.2", 20+j) }
func clientAddr(k int) string { return fmt.Sprintf("198.18.%d.2", 10+k) }

// fleetDocument is the document: the Host Agents read it as it is; each
// Mux reads it with its own node name and BGP section (bgp is nil when the
// router uses static routes).
func fleetDocument(version int, mux int, bgp bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "version: %d\nhash_seed: 0x5eed1234\n", version)
	if mux > 0 {
		fmt.Fprintf(&b, "node: {name: mux%d}\n", mux)
		if bgp {
			fmt.Fprintf(&b, `bgp:
  asn: %d
  router_id: %s
  hold_time: 9s
  withdraw_grace: 1s
  peers:
    - {address: %s, asn: %d}
`, muxASN, muxAddr(mux), muxRouter(mux), routerASN)
		}
	}
	b.WriteString("infra_prefixes: [198.18.1.0/24, 198.18.2.0/24]\nvips:\n")
	for _, svc := range []struct {
		name, proto string
		port, dport int
		probe       bool
	}{{"web", "tcp", vipTCP, dipTCP, true}, {"echo", "udp", vipUDP, dipUDP, false}} {
		fmt.Fprintf(&b, "  - name: %s\n    address: %s\n    protocol: %s\n    port: %d\n    vni: %d\n",
			svc.name, vip, svc.proto, svc.port, vni)
		if svc.probe {
			fmt.Fprintf(&b, "    probe: {type: tcp, interval: 1s, timeout: 300ms, rise: 1, fall: 3}\n")
		}
		b.WriteString("    backends:\n")
		for _, vm := range vms {
			fmt.Fprintf(&b, "      - {name: %s, address: %s, port: %d, mac: %q, host: %s, weight: %d}\n",
				vm.name, vm.addr, svc.dport, vm.mac, hostAddr(vm.host), vm.weight)
		}
	}
	b.WriteString("hosts:\n")
	for j := 1; j <= 2; j++ {
		fmt.Fprintf(&b, "  - name: host%d\n    address: %s\n    vms:\n", j, hostAddr(j))
		for _, vm := range vms {
			if vm.host == j {
				fmt.Fprintf(&b, "      - {vni: %d, address: %s, mac: %q, interface: %s}\n", vni, vm.addr, vm.mac, vm.port)
			}
		}
	}
	return b.String()
}

// birdConfig is the router's BIRD configuration: both Muxes as eBGP
// peers, best routes exported to the kernel with equal-cost paths merged.
func birdConfig() string {
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
`, routerASN)
	for i := 1; i <= 2; i++ {
		fmt.Fprintf(&b, "protocol bgp mux%d from mux { neighbor %s as %d; }\n", i, muxAddr(i), muxASN)
	}
	return b.String()
}

// topo is the running lab.
type topo struct {
	dir     string
	lab     *netlab.Lab
	router  *netlab.NS
	clients []*netlab.NS
	muxes   []*netlab.NS
	hosts   []*netlab.NS
	vmNS    []*netlab.NS // in vms order
	bird    bool
	birdSck string
	procs   []*proc
}

func (t *topo) ns(name string) (*netlab.NS, error) { return t.lab.Namespace(name) }

// build makes the namespaces, links, addresses, routes and neighbours.
func (t *topo) build() error {
	var err error
	if t.router, err = t.ns("router"); err != nil {
		return err
	}
	for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.fib_multipath_hash_policy", "1"}} {
		if err := t.router.SetSysctl(kv[0], kv[1]); err != nil {
			return err
		}
	}
	link := func(n *netlab.NS, rif string, subnet int) error {
		if _, _, err := t.lab.Veth(t.router, rif, n, "up"); err != nil {
			return err
		}
		for _, e := range []error{
			t.router.AddAddr(rif, fmt.Sprintf("198.18.%d.1/24", subnet)),
			n.AddAddr("up", fmt.Sprintf("198.18.%d.2/24", subnet)),
			n.AddRoute("198.18.0.0/15", fmt.Sprintf("198.18.%d.1", subnet)),
			t.router.SetSysctl("net.ipv4.conf."+rif+".rp_filter", "0"),
		} {
			if e != nil {
				return e
			}
		}
		return nil
	}
	for k := 1; k <= 2; k++ {
		n, err := t.ns(fmt.Sprintf("client%d", k))
		if err != nil {
			return err
		}
		t.clients = append(t.clients, n)
		if err := link(n, fmt.Sprintf("c%d", k), 10+k); err != nil {
			return err
		}
		// Client frames cross AF_XDP data paths: complete checksums.
		if err := n.DisableChecksumOffload("up"); err != nil {
			return err
		}
	}
	for i := 1; i <= 2; i++ {
		n, err := t.ns(fmt.Sprintf("mux%d", i))
		if err != nil {
			return err
		}
		t.muxes = append(t.muxes, n)
		if err := link(n, fmt.Sprintf("m%d", i), i); err != nil {
			return err
		}
	}
	for j := 1; j <= 2; j++ {
		n, err := t.ns(fmt.Sprintf("host%d", j))
		if err != nil {
			return err
		}
		t.hosts = append(t.hosts, n)
		if err := link(n, fmt.Sprintf("h%d", j), 20+j); err != nil {
			return err
		}
		if err := n.SetSysctl("net.ipv4.ip_forward", "1"); err != nil {
			return err
		}
		// The Muxes' probes reach the DIPs through the hosts' kernels.
		if err := t.router.AddRoute(fmt.Sprintf("198.18.%d.0/24", 30+j), hostAddr(j)); err != nil {
			return err
		}
	}
	for _, vm := range vms {
		n, err := t.ns(vm.name)
		if err != nil {
			return err
		}
		t.vmNS = append(t.vmNS, n)
		if err := t.vm(t.hosts[vm.host-1], n, vm); err != nil {
			return fmt.Errorf("%s: %w", vm.name, err)
		}
	}
	return nil
}

// vm wires one VM: a veth from its host (the VM port named in the
// document) to eth0 in the VM, with the document's MAC and DIP; the VM
// sends everything to the host-side veth (static neighbour), the host
// routes the DIP to the port (static neighbour too).
func (t *topo) vm(host, n *netlab.NS, vm vmSpec) error {
	hostEnd, vmEnd, err := t.lab.Veth(host, vm.port, n, "eth0")
	if err != nil {
		return err
	}
	mac, err := net.ParseMAC(vm.mac)
	if err != nil {
		return err
	}
	dip, gw := netip.MustParseAddr(vm.addr), netip.MustParseAddr(gateway)
	nl := n.Netlink()
	lk, err := n.Link("eth0")
	if err != nil {
		return err
	}
	_, all, _ := net.ParseCIDR("198.18.0.0/15")
	_, host32, _ := net.ParseCIDR(vm.addr + "/32")
	hl := host.Netlink()
	for _, step := range []func() error{
		func() error { return nl.LinkSetDown(lk) },
		func() error { return nl.LinkSetHardwareAddr(lk, mac) },
		func() error { return nl.LinkSetUp(lk) },
		func() error { return n.AddAddr("eth0", vm.addr+"/32") },
		func() error {
			return nl.NeighAdd(&netlink.Neigh{LinkIndex: vmEnd.Index, Family: netlink.FAMILY_V4,
				State: netlink.NUD_PERMANENT, IP: gw.AsSlice(), HardwareAddr: hostEnd.MAC})
		},
		func() error {
			return nl.RouteAdd(&netlink.Route{LinkIndex: vmEnd.Index, Dst: all, Gw: gw.AsSlice(), Flags: int(netlink.FLAG_ONLINK)})
		},
		// The VM's replies cross the host's AF_XDP data path.
		func() error { return n.DisableChecksumOffload("eth0") },
		func() error {
			return hl.RouteAdd(&netlink.Route{LinkIndex: hostEnd.Index, Dst: host32, Scope: netlink.SCOPE_LINK})
		},
		func() error {
			return hl.NeighAdd(&netlink.Neigh{LinkIndex: hostEnd.Index, Family: netlink.FAMILY_V4,
				State: netlink.NUD_PERMANENT, IP: dip.AsSlice(), HardwareAddr: mac})
		},
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// routeVIP makes the router reach the VIP: BIRD learns it from the Muxes
// over BGP, or a static ECMP route over both Muxes stands in for it.
func (t *topo) routeVIP(ctx context.Context) error {
	if _, err := exec.LookPath("bird"); err != nil {
		fmt.Println("BIRD 2 not found (Debian package bird2): the router uses a static ECMP route to the VIP")
		return t.router.AddMultipathRoute(vip+"/32", muxAddr(1), muxAddr(2))
	}
	t.bird = true
	conf := filepath.Join(t.dir, "bird.conf")
	t.birdSck = filepath.Join(t.dir, "bird.ctl")
	if err := os.WriteFile(conf, []byte(birdConfig()), 0o644); err != nil {
		return err
	}
	p, err := t.start(ctx, "bird", t.router, "bird", "-f", "-c", conf, "-s", t.birdSck)
	if err != nil {
		return err
	}
	_ = p
	return waitFor(ctx, "BIRD's control socket", 10*time.Second, func() bool {
		_, err := t.birdc("show status")
		return err == nil
	})
}

func (t *topo) birdc(args string) (string, error) {
	out, err := exec.Command("birdc", append([]string{"-s", t.birdSck}, strings.Fields(args)...)...).CombinedOutput()
	return string(out), err
}

// proc is a process the lab started in a namespace.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func (t *topo) start(ctx context.Context, name string, n *netlab.NS, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(t.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, log: logPath, done: make(chan struct{})}
	p.cmd = n.Command(context.Background(), bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	// A process group of its own: Ctrl-C reaches the lab only, which
	// stops the processes in order (Muxes withdraw their routes first).
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.err = p.cmd.Wait(); f.Close(); close(p.done) }()
	t.procs = append(t.procs, p)
	return p, nil
}

// stopAll sends SIGTERM to every process, newest first, and waits (a
// process still running after grace is killed).
func (t *topo) stopAll(grace time.Duration) {
	for i := len(t.procs) - 1; i >= 0; i-- {
		p := t.procs[i]
		select {
		case <-p.done:
			continue
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

func waitFor(ctx context.Context, what string, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up waiting for %s after %v", what, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
