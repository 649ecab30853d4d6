// Command mux runs an xdplb Mux: it announces the VIPs of the
// desired-state document over BGP, receives their traffic on the uplink's
// AF_XDP sockets, picks a backend per flow and VXLAN-encapsulates the
// packet towards the backend's host.
//
//	mux -interface eth0 -config /etc/xdplb/fleet.yaml -metrics :9100
//	mux -interface eth0 -etcd http://198.18.0.1:2379 -node mux-1
//
// Process settings are flags; everything else (VIPs, backends, probes,
// BGP) is in the document, which is watched for changes and re-read on
// SIGHUP. SIGINT/SIGTERM withdraw the VIPs, keep forwarding for the
// document's bgp.withdraw_grace, then stop.
//
// Start it as root (or with CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF,
// CAP_IPC_LOCK and CAP_NET_BIND_SERVICE); once the sockets are open and
// the steering program attached it keeps only CAP_NET_ADMIN, CAP_NET_RAW,
// CAP_BPF and CAP_NET_BIND_SERVICE (a later document may be the first
// with a bgp section, whose speaker listens on port 179), on every
// thread (-keep-caps keeps them all). Build it
// with CGO_ENABLED=0: a cgo binary cannot drop them and says so.
//
// If a data-path socket or its interface fails (the interface is
// deleted), the Mux withdraws every VIP at once and exits with status 1;
// its supervisor restarts it on the interface as it is then.

// BGP listeners must be plain TCP: on the multipath TCP sockets Go
// listens with by default the kernel refuses TCP-MD5 keys and IP_TTL
// (GTSM), so bgp.peers[].password and ttl_security would silently not
// apply to incoming sessions.
//
//go:debug multipathtcp=0
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/internal/node"
	"github.com/xdplb/xdplb/mux"
)

func main() {
	var (
		iface     = flag.String("interface", "", "uplink interface (required)")
		config    = flag.String("config", "", "desired-state document, YAML (required without -etcd)")
		etcd      = flag.String("etcd", "", "etcd endpoints, comma-separated: take the fleet's document from etcd instead of -config, and report this node's status there")
		etcdPfx   = flag.String("etcd-prefix", fleet.DefaultPrefix, "the fleet's etcd key prefix")
		nodeName  = flag.String("node", "", "this Mux's name in the document's nodes section (a fleet document); empty for a per-node document")
		queues    = flag.Int("queues", 0, "RX queues to serve (0: all)")
		metrics   = flag.String("metrics", "", "address for the Prometheus /metrics endpoint, e.g. :9100 (empty: none)")
		logLevel  = flag.String("log-level", "info", "debug, info, warn or error")
		keepCaps  = flag.Bool("keep-caps", false, "keep every capability instead of dropping all but CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF and CAP_NET_BIND_SERVICE once the data path runs")
		xdpMode   steer.AttachMode
		ring      afxdp.Ring
		conns     = flag.Int("conns", 1<<20, "connection table capacity (flows)")
		vipShare  = flag.Float64("vip-share", balance.DefaultVIPShare, "share of the connection table one VIP's new, unproven flows may hold (1: no limit)")
		spins     = flag.Int("spin", 0, "empty polls before an idle worker sleeps")
		check     = flag.Bool("check", false, "validate the document, print it with defaults filled in, and exit")
		plan      = flag.Bool("plan", false, "validate the document, print what this Mux would run from it (mux.NewPlan), and exit")
		seal      = flag.Bool("seal", false, "validate the document, print the file with a checksum line (control.Seal), and exit")
		probeFrom = flag.String("probe-source", "", "source address of health probes (default: the kernel's choice)")
	)
	flag.TextVar(&xdpMode, "xdp-mode", steer.AttachAuto, "XDP attach mode: auto, driver or generic")
	flag.TextVar(&ring, "ring", afxdp.RingOwn, "AF_XDP ring implementation: own or asavie")
	flag.Parse()
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "mux: -log-level:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	if *config == "" && *etcd == "" {
		fmt.Fprintln(os.Stderr, "mux: -config or -etcd is required")
		os.Exit(2)
	}
	if *etcd != "" && (*seal || *plan || *check) {
		fmt.Fprintln(os.Stderr, "mux: -seal, -plan and -check read -config; for the fleet's document use xdplbctl")
		os.Exit(2)
	}
	if *seal {
		data, err := os.ReadFile(*config)
		if err == nil {
			data = control.Seal(data)
			_, err = control.Parse(data)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Stdout.Write(data)
		return
	}
	if *plan {
		doc, err := control.Load(*config)
		if err == nil {
			var p *mux.Plan
			if p, err = mux.NewPlan(doc, *nodeName); err == nil {
				fmt.Print(p)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if *check {
		doc, err := control.Load(*config)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		out, _ := doc.Marshal()
		os.Stdout.Write(out)
		return
	}
	cfg := mux.Config{Node: *nodeName, Interface: *iface, ConfigPath: *config, Queues: *queues, Logger: log, IdleSpins: *spins}
	cfg.OnForwarding = node.DropAfterSetup(log, "mux", *keepCaps, node.MuxCaps)
	cfg.Conns.Capacity = *conns
	cfg.VIPShare = *vipShare
	cfg.XDPMode, cfg.Port.Ring = xdpMode, ring
	if *probeFrom != "" {
		a, err := netip.ParseAddr(*probeFrom)
		if err != nil {
			fmt.Fprintf(os.Stderr, "mux: -probe-source: %v\n", err)
			os.Exit(2)
		}
		cfg.ProbeSource = a
	}
	var fl *node.Fleet
	if *etcd != "" {
		name := *nodeName
		if name == "" {
			name, _ = os.Hostname()
		}
		var err error
		if fl, err = node.NewFleet(*etcd, *etcdPfx, fleet.RoleMux, name, log); err != nil {
			fmt.Fprintf(os.Stderr, "mux: -etcd: %v\n", err)
			os.Exit(2)
		}
		defer fl.Close()
		cfg.Source = fl.Source
		// With a fleet, the Host Agents probe their own DIPs and publish
		// the verdicts; this Mux follows them instead of probing.
		cfg.ExternalHealth = true
	}
	if err := run(cfg, fl, *metrics, log); err != nil {
		log.Error("mux failed", "err", err)
		os.Exit(1)
	}
}

func run(cfg mux.Config, fl *node.Fleet, metricsAddr string, log *slog.Logger) error {
	m, err := mux.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if fl != nil {
		if err := fl.WatchHealth(m.Controller().SetDIPHealth); err != nil {
			return err
		}
		// The Host Agents' outbound port ranges: replies to their VMs'
		// source-NATed connections go to the ranges' hosts.
		if err := fl.WatchPortAllocations(m.Controller()); err != nil {
			return err
		}
		defer fl.Start(ctx, m.Forwarding)()
	}
	node.ReloadOnHUP(log, "mux", m.Reload)
	defer node.ServeMetrics(log, "mux", metricsAddr, m.Collector())()
	err = m.Run(ctx)
	s := m.Stats()
	log.Info("mux: stopped", "rx", s.RX, "tx", s.TX, "drops", s.DropsByName())
	return err
}
