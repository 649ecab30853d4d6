//go:build linux

package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// The lab's topology is fleetlab's fleet with two clients, dual-stack
// (every link also has 2001:db8:0:<subnet>::/64, every VM its IPv6
// address 2001:db8:0:3<host>::<n> on the same eth0):
//
//	client1 [up 198.18.11.2] ─ [c1 198.18.11.1] ┐
//	client2 [up 198.18.12.2] ─ [c2 198.18.12.1] ┤
//	mux1    [up 198.18.1.2]  ─ [m1 198.18.1.1]  ├ router (BIRD 2, or static ECMP routes)
//	mux2    [up 198.18.2.2]  ─ [m2 198.18.2.1]  ┤
//	host1   [up 198.18.21.2] ─ [h1 198.18.21.1] ┤   host1: vm1 ─ vm11 (198.18.31.1), vm2 ─ vm12 (198.18.31.2)
//	host2   [up 198.18.22.2] ─ [h2 198.18.22.1] ┤   host2: vm1 ─ vm21 (198.18.32.1), vm2 ─ vm22 (198.18.32.2)
//	host3   [up 198.18.23.2] ─ [h3 198.18.23.1] ┘   host3: no Host Agent, a kernel vxlan device holding the VIP
//
// host3 is a backend without a Host Agent (fleetlab.FleetKernelVXLAN, the
// README's "Backends without a Host Agent"): its servers listen on the
// VIP's own ports and answer from the VIP by the kernel alone.
const (
	vipTCP  = 80
	vipUDP  = 7
	dipTCP  = 8080
	dipUDP  = 7007
	metrics = 9100
)

var (
	vip = fleetlab.FleetVIP.String()
	// vms are the VMs, their hosts and weights (fleetlab.FleetVMs).
	vms = fleetlab.FleetVMs()
	// kernelHost is host3, the backend host without a Host Agent, and
	// kvx3 its backend in the pool, weight 2.
	kernelHost = fleetlab.FleetKernelVXLAN()
	// pool is every backend of the VIP: the VMs, then host3's.
	pool = slices.Concat(vms, []fleetlab.VM{kernelHost.Backend("kvx3", 3, 2)})
	// services are the VIP's two services: HTTP, probed by TCP, and a
	// UDP echo.
	services = []fleetlab.Service{
		{Name: "web", Addr: fleetlab.FleetVIP, Proto: flow.ProtoTCP, Port: vipTCP, VNI: fleetlab.FleetVNI, DIPPort: dipTCP,
			Probe: &health.Spec{Type: health.ProbeTCP, Interval: time.Second, Timeout: 300 * time.Millisecond, Rise: 1, Fall: 3}},
		{Name: "echo", Addr: fleetlab.FleetVIP, Proto: flow.ProtoUDP, Port: vipUDP, VNI: fleetlab.FleetVNI, DIPPort: dipUDP},
		{Name: "web6", Addr: fleetlab.FleetVIP6, Proto: flow.ProtoTCP, Port: vipTCP, VNI: fleetlab.FleetVNI, DIPPort: dipTCP,
			Probe: &health.Spec{Type: health.ProbeTCP, Interval: time.Second, Timeout: 300 * time.Millisecond, Rise: 1, Fall: 3}},
		{Name: "echo6", Addr: fleetlab.FleetVIP6, Proto: flow.ProtoUDP, Port: vipUDP, VNI: fleetlab.FleetVNI, DIPPort: dipUDP},
	}
	// The IPv6 side: the VIP 2001:db8:100::1 (same ports, same remap),
	// served by the same VMs' IPv6 addresses on the same eth0 and MAC
	// (fleetlab.Fleet.AddIPv6).
	vip6 = fleetlab.FleetVIP6.String()
	vms6 = fleetlab.FleetVMs6(vms)
)

// inboundNAT maps the VIP's ports 50001 and 50002 to vm11's and vm12's
// HTTP port, one VM each (an inbound NAT rule, as for SSH to one VM).
var inboundNAT = []control.InboundNAT{{Name: "direct", Address: fleetlab.FleetVIP, Protocol: flow.ProtoTCP,
	VNI: fleetlab.FleetVNI, FirstPort: 50001, LastPort: 50002, BackendPort: dipTCP,
	Targets: []netip.Addr{vms[0].Addr, vms[1].Addr}}}

func muxAddr(i int) string  { return fleetlab.FleetMuxAddr(i).String() }
func hostAddr(j int) string { return fleetlab.FleetHostAddr(j).String() }

// topo is the running lab.
type topo struct {
	dir string
	lab *netlab.Lab
	*fleetlab.Fleet
	bird  *fleetlab.BIRD // nil when the router uses static routes
	procs []*proc

	kernel *netlab.NS // host3's namespace

	inet       *netlab.NS // the internet behind the router
	inetServer *fleetlab.InternetServer
	useEtcd    bool // the nodes take the document from etcd

	etcd       etcdlab.Cluster // -control etcd: the lab's etcd
	etcdServer *embed.Etcd
}

// build makes the namespaces, links, addresses, routes and neighbours.
func (t *topo) build() error {
	f, err := fleetlab.BuildFleet(t.lab, 2, vms)
	if err != nil {
		return err
	}
	t.Fleet = f
	if err := f.AddIPv6(vms6); err != nil {
		return err
	}
	if t.kernel, err = f.AttachKernelVXLAN(kernelHost, "h3", fleetlab.FleetKernelVXLANSubnet); err != nil {
		return err
	}
	t.inet, err = f.AttachInternet()
	return err
}

// writeDocument writes version 1 of the document for mux (0: the Host
// Agents' copy) and returns its path.
func (t *topo) writeDocument(mux int) (string, error) {
	name := "fleet.yaml"
	if mux > 0 {
		name = fmt.Sprintf("mux%d.yaml", mux)
	}
	path := filepath.Join(t.dir, name)
	d := fleetlab.FleetDoc6(1, mux, t.bird != nil, services, pool, vms6)
	d.Hosts = append(d.Hosts, kernelHost.Host()) // host3: kvx3's host, left out of the hosts section
	d.InboundNAT = inboundNAT
	d.Outbound = []control.Outbound{outboundSection(false)}
	return path, fleetlab.WriteDocument(path, d)
}

// routeVIP makes the router reach the VIP: BIRD learns it from the Muxes
// over BGP, or a static ECMP route over both Muxes stands in for it.
func (t *topo) routeVIP(ctx context.Context) error {
	if err := fleetlab.HaveBIRD(); err != nil {
		fmt.Println("BIRD 2 not found (Debian package bird2): the router uses static ECMP routes to the VIPs")
		if err := t.Router.AddMultipathRoute(vip6+"/128", fleetlab.FleetMuxAddr6(1).String(), fleetlab.FleetMuxAddr6(2).String()); err != nil {
			return err
		}
		return t.Router.AddMultipathRoute(vip+"/32", muxAddr(1), muxAddr(2))
	}
	p, err := t.newProc("bird")
	if err != nil {
		return err
	}
	if t.bird, err = fleetlab.StartBIRD(t.Router, t.dir, fleetlab.FleetBIRD6(), p.config()); err != nil {
		p.logFile.Close()
		return err
	}
	p.started(t.bird.Proc)
	return t.bird.WaitReady(ctx, 10*time.Second)
}

// proc is a process the lab started in a namespace, with its log file.
type proc struct {
	*fleetlab.Proc
	name    string
	log     string
	logFile *os.File
}

// newProc opens the log of a process about to start.
func (t *topo) newProc(name string) (*proc, error) {
	p := &proc{name: name, log: filepath.Join(t.dir, name+".log")}
	var err error
	if p.logFile, err = os.Create(p.log); err != nil {
		return nil, err
	}
	t.procs = append(t.procs, p)
	return p, nil
}

// config is the process's settings: output to its log, and a process
// group of its own, so that Ctrl-C reaches the lab only, which stops the
// processes in order (Muxes withdraw their routes first).
func (p *proc) config() fleetlab.ProcConfig {
	return fleetlab.ProcConfig{Name: p.name, Output: p.logFile, OwnProcessGroup: true}
}

// started records the running process and closes the log when it exits.
func (p *proc) started(fp *fleetlab.Proc) {
	p.Proc = fp
	go func() { <-fp.Done(); p.logFile.Close() }()
}

func (t *topo) start(name string, n *netlab.NS, bin string, args ...string) error {
	p, err := t.newProc(name)
	if err != nil {
		return err
	}
	cfg := p.config()
	cfg.Path, cfg.Args = bin, args
	fp, err := fleetlab.StartProc(n, cfg)
	if err != nil {
		p.logFile.Close()
		return err
	}
	p.started(fp)
	return nil
}

// stopAll stops every process, newest first (a process still running
// after grace is killed).
func (t *topo) stopAll(grace time.Duration) {
	for i := len(t.procs) - 1; i >= 0; i-- {
		if p := t.procs[i]; p.Proc != nil {
			p.Stop(grace)
		}
	}
}
