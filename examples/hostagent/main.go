// Command hostagent runs an xdplb Host Agent: it receives the Muxes'
// VXLAN on the uplink's AF_XDP sockets, delivers each packet to its local
// VM with the VIP translated to the DIP, and sends the VMs' replies
// straight back to the clients with the DIP translated to the VIP (Direct
// Server Return).
//
//	hostagent -uplink eth0 -host host-1 -config /etc/xdplb/fleet.yaml -metrics :9101
//
// Process settings are flags; everything else (VIPs, the host's VMs and
// their ports, infrastructure prefixes, the Muxes' prefixes VXLAN is
// accepted from) is in the document, the same one
// the Muxes read, which is watched for changes and re-read on SIGHUP.
// SIGINT/SIGTERM stop the data path, detach the XDP programs and exit.
//
// Start it as root; once the first data path forwards it keeps only
// CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF, CAP_PERFMON and CAP_IPC_LOCK (what
// a rebuild needs), on every thread (-keep-caps keeps them all). Build it
// with CGO_ENABLED=0: a cgo binary cannot drop them and says so. If a
// socket or its interface fails (a VM port or the uplink is deleted), it
// logs it and exits with status 1 for its supervisor to restart it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/hostagent"
	"github.com/xdplb/xdplb/internal/node"
	"github.com/xdplb/xdplb/internal/nodemetrics"
)

func main() {
	var (
		uplink   = flag.String("uplink", "", "uplink interface (required)")
		host     = flag.String("host", "", "this host's name or address in the document's hosts (default: the document's node.name); with -etcd, its name")
		config   = flag.String("config", "", "desired-state document, YAML (required without -etcd)")
		etcd     = flag.String("etcd", "", "etcd endpoints, comma-separated: take the fleet's document from etcd instead of -config, and report this host's status there (needs -host)")
		etcdPfx  = flag.String("etcd-prefix", fleet.DefaultPrefix, "the fleet's etcd key prefix")
		workers  = flag.Int("workers", 0, "workers (0: the fewest queues of the uplink and the VM ports)")
		metrics  = flag.String("metrics", "", "address for the Prometheus /metrics endpoint, e.g. :9101 (empty: none)")
		logLevel = flag.String("log-level", "info", "debug, info, warn or error")
		keepCaps = flag.Bool("keep-caps", false, "keep every capability instead of dropping all but CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF, CAP_PERFMON and CAP_IPC_LOCK once the data path runs")
		xdpMode  steer.AttachMode
		ring     afxdp.Ring
		conns    = flag.Int("conns", hostagent.DefaultNATCapacity, "NAT table capacity (IPv4 connections)")
		spins    = flag.Int("spin", 0, "empty polls before an idle worker sleeps")
		infra    = flag.String("infra", "", "extra infrastructure prefixes, comma-separated (never NATed)")
		tunnels  = flag.String("tunnel-sources", "", "prefixes VXLAN may come from (the Muxes), comma-separated; overrides the document's mux_prefixes (empty: mux_prefixes, which then must be set)")
		check    = flag.Bool("check", false, "validate the document, print this host's plan, and exit")
		probe    = flag.Bool("probe-dips", false, "probe this host's DIPs (backends of VIPs with a probe) through their VM ports; verdicts are logged and exported as xdplb_dip_health")
	)
	flag.TextVar(&xdpMode, "xdp-mode", steer.AttachAuto, "XDP attach mode: auto, driver or generic")
	flag.TextVar(&ring, "ring", afxdp.RingOwn, "AF_XDP ring implementation: own or asavie")
	flag.Parse()
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fail(2, "-log-level: %v", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if *config == "" && *etcd == "" {
		fail(2, "-config or -etcd is required")
	}
	if *etcd != "" && *host == "" {
		fail(2, "-etcd needs -host: this host's name in the document's hosts (its view of the fleet's document is views/<name>)")
	}
	if *etcd != "" && *check {
		fail(2, "-check reads -config; for the fleet's document use xdplbctl")
	}
	extra, err := prefixes(*infra)
	if err != nil {
		fail(2, "-infra: %v", err)
	}
	tunnelSources, err := prefixes(*tunnels)
	if err != nil {
		fail(2, "-tunnel-sources: %v", err)
	}
	if *check {
		doc, err := control.Load(*config)
		if err != nil {
			fail(1, "%v", err)
		}
		name := *host
		if name == "" {
			name = doc.Node.Name
		}
		plan, err := hostagent.NewPlan(doc, name, extra)
		if err != nil {
			fail(1, "%v", err)
		}
		if len(tunnelSources) > 0 {
			plan.TunnelSources = tunnelSources
		}
		if len(plan.TunnelSources) == 0 {
			fail(1, "%s: %v", *config, hostagent.ErrNoTunnelSources)
		}
		printPlan(plan)
		return
	}
	if *uplink == "" {
		fail(2, "-uplink is required")
	}
	cfg := hostagent.Config{Uplink: *uplink, Host: *host, ConfigPath: *config, Workers: *workers,
		Infra: extra, Logger: log, IdleSpins: *spins}
	cfg.OnForwarding = node.DropAfterSetup(log, "hostagent", *keepCaps, node.HostAgentCaps)
	cfg.NAT.Capacity = *conns
	cfg.TunnelSources = tunnelSources
	cfg.XDPMode, cfg.Port.Ring = xdpMode, ring
	var onDIP []func([]hostagent.DIPHealth)
	if *probe {
		onDIP = append(onDIP, func(vs []hostagent.DIPHealth) {
			for _, v := range vs {
				log.Info("hostagent: DIP health", "vni", v.VNI, "dip", v.Addr, "port", v.Port, "up", v.Up, "reason", v.Reason)
			}
		})
	}
	var fl *node.Fleet
	var agent atomic.Pointer[hostagent.Agent]
	if *etcd != "" {
		var err error
		if fl, err = node.NewFleet(*etcd, *etcdPfx, fleet.RoleHostAgent, *host, log); err != nil {
			fail(2, "-etcd: %v", err)
		}
		defer fl.Close()
		cfg.Source = fl.Source
		// With a fleet, the host probes its own DIPs and publishes the
		// verdicts; the Muxes use them instead of probing.
		publish, err := fl.PublishHealth(func() []hostagent.DIPHealth {
			if a := agent.Load(); a != nil {
				return a.DIPHealth()
			}
			return nil
		})
		if err != nil {
			fail(2, "-etcd: %v", err)
		}
		onDIP = append(onDIP, publish)
	}
	if len(onDIP) > 0 {
		cfg.OnDIPHealth = func(vs []hostagent.DIPHealth) {
			for _, f := range onDIP {
				f(vs)
			}
		}
	}
	if err := run(cfg, fl, &agent, *metrics, log); err != nil {
		log.Error("hostagent failed", "err", err)
		os.Exit(1)
	}
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "hostagent: "+format+"\n", args...)
	os.Exit(code)
}

func run(cfg hostagent.Config, fl *node.Fleet, agent *atomic.Pointer[hostagent.Agent], metricsAddr string, log *slog.Logger) error {
	a, err := hostagent.New(cfg)
	if err != nil {
		return err
	}
	agent.Store(a)
	collectors := []prometheus.Collector{a.Collector()}
	if fl != nil {
		// Outbound port ranges: claimed in etcd for this host's DIPs (by
		// the fleet's Run) and handed to the source NAT; a port is never
		// given to another DIP while a connection of the NAT's longest
		// timeout may still use it.
		if err := fl.AllocatePorts(a, a.SNAT().MaxTimeout()); err != nil {
			return err
		}
		collectors = append(collectors, nodemetrics.OutboundRanges(fl.AllocationCounters))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if fl != nil {
		defer fl.Start(ctx, a.Forwarding)()
	}
	node.ReloadOnHUP(log, "hostagent", a.Reload)
	defer node.ServeMetrics(log, "hostagent", metricsAddr, collectors...)()
	err = a.Run(ctx)
	s, n := a.Stats(), a.NATStats()
	log.Info("hostagent: stopped", "rx", s.RX, "tx", s.TX, "inbound", n.Inbound,
		"return", n.Return+n.Stateless, "drops", s.DropsByName())
	return err
}

func prefixes(s string) ([]netip.Prefix, error) {
	var ps []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func printPlan(p *hostagent.Plan) {
	fmt.Printf("version %d: host %s (%v), VXLAN port %d\n", p.Version, p.Host.Name, p.Host.Address, p.Host.VXLANPort)
	fmt.Printf("uplink steering: %v\n", p.Uplink.VXLAN)
	fmt.Printf("infrastructure (never NATed): %v\n", p.Infra)
	fmt.Printf("VXLAN accepted from (mux_prefixes or -tunnel-sources): %v\n", p.TunnelSources)
	for _, vp := range p.Ports {
		fmt.Printf("VM port %s (port %d, VNI %d): steers replies from %v\n", vp.Interface, vp.Index, vp.VNI, vp.Steer.Src)
	}
	for _, e := range p.Endpoints {
		fmt.Printf("  DIPs %v MAC %v VNI %d on port %d\n", e.Addrs, e.MAC, e.VNI, e.OutPort)
	}
	for _, o := range p.Outbound {
		fmt.Printf("outbound: %v (VNI %d) through %v; local, never translated: %v\n", o.DIPs, o.VNI, o.VIP, o.Local)
	}
	for _, a := range p.OutboundStatic {
		fmt.Printf("  static range %v:%d-%d for %v\n", a.VIP, a.First, a.Last, a.Owner.DIP)
	}
	for _, dp := range p.Probes {
		fmt.Printf("probe (with -probe-dips) %v through %s: %s every %v (VIP %s)\n", dp.Key(), dp.Interface, dp.Spec.Type, dp.Spec.Interval, dp.VIP)
	}
}
