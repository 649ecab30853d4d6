//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

// startEtcd starts the lab's etcd — one member embedded in this process,
// on a Unix socket in the lab's directory, which every namespace reaches
// — and writes version 1 of the fleet's one document to it, as xdplbctl
// apply would.
func (t *topo) startEtcd(ctx context.Context) error {
	t.etcd = etcdlab.NewCluster(t.dir, 1)
	e, err := t.etcd.Start(0, 30*time.Second)
	if err != nil {
		return err
	}
	t.etcdServer = e
	d := fleetlab.FleetShared(1, t.bird != nil, services, pool, vms6)
	d.Hosts = append(d.Hosts, kernelHost.Host()) // host3: kvx3's host, left out of the hosts section
	d.InboundNAT = inboundNAT
	d.Outbound = []control.Outbound{outboundSection(true)}
	text, err := d.Marshal()
	if err != nil {
		return err
	}
	path := filepath.Join(t.dir, "fleet.yaml")
	if err := os.WriteFile(path, text, 0o644); err != nil {
		return err
	}
	doc, err := control.Load(path)
	if err != nil {
		return err
	}
	c, err := etcdlab.Client(t.etcd.Endpoints())
	if err != nil {
		return err
	}
	defer c.Close()
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rev, err := fleet.Apply(actx, c, "", text, doc, "lab")
	if err != nil {
		return err
	}
	fmt.Printf("etcd (embedded, %s): version 1 of the fleet's document applied at revision %d (%s)\n", t.etcdEndpoint(), rev, path)
	return nil
}

func (t *topo) etcdEndpoint() string { return t.etcd.Endpoints()[0] }

func (t *topo) stopEtcd() {
	if t.etcdServer != nil {
		t.etcdServer.Close()
	}
}

// fleetStatus prints what xdplbctl status prints.
func (t *topo) fleetStatus(ctx context.Context) {
	c, err := etcdlab.Client(t.etcd.Endpoints())
	if err != nil {
		fmt.Println("fleet status:", err)
		return
	}
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	f, err := fleet.ReadStatus(rctx, c, "")
	if err != nil {
		fmt.Println("fleet status:", err)
		return
	}
	r := fleet.Report(f, time.Now())
	fmt.Printf("\nthe fleet as etcd shows it (xdplbctl status): %s\n", r.Live)
	for _, n := range r.Nodes {
		fmt.Printf("  %-9s %-6s version %d, sync delay %v, data path %s\n", n.Role, n.Name, n.Version, n.SyncDelay.Round(time.Millisecond), n.DataPath)
	}
	fmt.Println("  DIP health as the Host Agents publish it (the Muxes follow it instead of probing):")
	for _, v := range r.VIPs {
		for _, b := range v.Backends {
			fmt.Printf("    %-6s %-5s %-22s on %-6s %s\n", v.Name, b.Name, b.DIP, b.Host, b.Health)
		}
	}
	for _, o := range r.Outbound {
		fmt.Printf("  outbound port pool of %s (VNI %d): %d units of %d ports, %d held, %d free, %d guarded\n",
			o.Address, o.VNI, o.Units, o.Unit, o.Held, o.Free, o.Guarded)
		for _, h := range o.Holders {
			fmt.Printf("    %-13s on %-6s %4d ports: %s\n", h.DIP, h.Host, h.Ports, strings.Join(h.Ranges, ", "))
		}
	}
}
