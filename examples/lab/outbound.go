//go:build linux

package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

// Outbound connections through the VIP: the VMs of vms may use the VIP
// as their source towards the internet namespace behind the router
// (fleetlab.Star.AttachInternet), whose server answers each client with
// the source it saw.
const (
	outboundConns = 200   // concurrent TCP connections per VM
	outboundUDP   = 20    // UDP exchanges per VM
	outboundUnit  = 64    // ports per allocation
	staticFirst   = 20480 // -control file: the first VM's static range
	staticSize    = 256   // -control file: ports per VM
	inetUDP       = 7100
)

// inetTCP are the internet server's TCP ports.
var inetTCP = []uint16{7001, 7002, 7003, 7004}

// outboundSection is the document's outbound section: with etcd the
// Host Agents claim ranges for their VMs there (fleet.PortAllocator);
// with files each VM has a static range of staticSize ports.
func outboundSection(useEtcd bool) control.Outbound {
	if useEtcd {
		ob := control.Outbound{Address: fleetlab.FleetVIP, VNI: fleetlab.FleetVNI, Unit: outboundUnit}
		for _, vm := range vms {
			ob.DIPs = append(ob.DIPs, vm.Addr)
		}
		return ob
	}
	return fleetlab.StaticOutbound(fleetlab.FleetVIP, fleetlab.FleetVNI, vms, staticFirst, staticSize, outboundUnit)
}

// serveInternet starts the internet namespace's server.
func (t *topo) serveInternet() error {
	var err error
	t.inetServer, err = fleetlab.ServeInternet(t.inet, fleetlab.InternetAddr, inetTCP, inetUDP)
	return err
}

// outboundReport opens, from every VM at once, outboundConns concurrent
// TCP connections to the internet server (one exchange each, all held
// open until every VM has opened its own) and outboundUDP UDP exchanges,
// and prints what the server saw: the source must be the VIP, on ports
// of the VM's own ranges, and nothing may fail.
func outboundReport(ctx context.Context, t *topo) {
	fmt.Printf("\noutbound (source NAT through the VIP %s to the internet %s):\n", vip, fleetlab.InternetAddr)
	// With etcd the first packet must find the VM's range claimed:
	// wait until both Muxes follow a range of every VM's.
	if err := fleetlab.Poll(ctx, "every VM's outbound ranges on both Muxes", 30*time.Second, func() bool {
		for i, n := range t.Muxes {
			m, err := scrape(n, muxAddr(i+1))
			if err != nil || m["xdplb_outbound_allocations"] < float64(len(vms)) {
				return false
			}
		}
		return true
	}); err != nil {
		fmt.Println("  ", err)
		return
	}
	returnsBefore := muxReturns(t)
	type vmOut struct {
		conns       []*fleetlab.InternetConn
		ports       map[uint16]bool
		sources     map[netip.Addr]int
		failed, udp int
		firstErr    error
	}
	outs := make([]vmOut, len(vms))
	var wg sync.WaitGroup
	for i, vm := range vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := vmOut{ports: map[uint16]bool{}, sources: map[netip.Addr]int{}}
			n := t.VMs[vm.Name]
			fail := func(err error) {
				o.failed++
				if o.firstErr == nil {
					o.firstErr = err
				}
			}
			for k := range outboundConns {
				c, err := fleetlab.DialInternet(n, netip.AddrPortFrom(fleetlab.InternetAddr, inetTCP[k%len(inetTCP)]), 5*time.Second)
				if err != nil {
					fail(err)
					continue
				}
				o.conns = append(o.conns, c)
				seen, err := c.Ask(fmt.Sprintf("%s-%d", vm.Name, k), 5*time.Second)
				if err != nil {
					fail(err)
					continue
				}
				o.sources[seen.Addr()]++
				o.ports[seen.Port()] = true
			}
			for k := range outboundUDP {
				seen, err := fleetlab.AskInternetUDP(n, netip.AddrPortFrom(fleetlab.InternetAddr, inetUDP), fmt.Sprintf("%s-udp-%d", vm.Name, k), 3*time.Second)
				if err != nil {
					fail(err)
					continue
				}
				o.udp++
				o.sources[seen.Addr()]++
				o.ports[seen.Port()] = true
			}
			outs[i] = o
		}()
	}
	wg.Wait()
	open, _ := t.inetServer.Open()
	for i, vm := range vms {
		o := outs[i]
		ports := slices.Sorted(func(yield func(uint16) bool) {
			for p := range o.ports {
				if !yield(p) {
					return
				}
			}
		})
		span := "none"
		if len(ports) > 0 {
			span = fmt.Sprintf("%d-%d", ports[0], ports[len(ports)-1])
		}
		fmt.Printf("  %s %-12s TCP %d/%d, UDP %d/%d, %d failed; the internet saw %v on %d ports (%s)\n", vm.Name, vm.Addr,
			len(o.conns), outboundConns, o.udp, outboundUDP, o.failed, o.sources, len(ports), span)
		if o.firstErr != nil {
			fmt.Printf("    first failure: %v\n", o.firstErr)
		}
		for _, c := range o.conns {
			c.Close()
		}
	}
	fmt.Printf("  the internet server held %d connections at once; sources it saw: %v\n", open, t.inetServer.Sources())
	fmt.Printf("  replies through the Muxes' range tables: %d\n", int(muxReturns(t)-returnsBefore))
}

// muxReturns is the replies to outbound connections both Muxes have sent
// to their owners' hosts.
func muxReturns(t *topo) float64 {
	var sum float64
	for i, n := range t.Muxes {
		if m, err := scrape(n, muxAddr(i+1)); err == nil {
			sum += fleetlab.SumMetric(m, "xdplb_vip_return_packets_total")
		}
	}
	return sum
}
