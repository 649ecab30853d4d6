package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

// TestOutboundHostAgentRestart shows that a dead Host Agent's outbound
// port ranges go to no other DIP while its connections may still return,
// and that it takes them back when it restarts. The fleet runs from etcd;
// the Host Agents claim ranges of 8 ports for their VMs from a pool of
// 8 such ranges (fleet.PortAllocator: one each to start with).
//
//  1. vm11 (host1) holds a connection to the internet server.
//  2. host1's Host Agent is killed; its lease expires, its claims with it.
//  3. vm21 (host2) opens more connections to one remote endpoint than the
//     pool has ports outside host1's ranges: its Host Agent claims every
//     free range, the connections beyond them fail, and none of them, nor
//     any claim, uses host1's ranges (they are guarded: the lease's TTL
//     plus the NAT's longest connection timeout).
//  4. host1's Host Agent restarts, takes its ranges back at once, and the
//     held connection works again on the same port.
func TestOutboundHostAgentRestart(t *testing.T) {
	const unit = 8
	pool := control.PortRange{First: 20480, Last: 20480 + 8*unit - 1}
	ob := control.Outbound{Address: flVIP, VNI: fleetlab.FleetVNI, Unit: unit, Pool: []control.PortRange{pool}}
	for _, vm := range flVMs {
		ob.DIPs = append(ob.DIPs, vm.Addr)
	}
	l := newEtcdFleetLabOf(t, func(d *fleetlab.Doc) { d.Outbound = []control.Outbound{ob} })
	inet, err := l.fleet.AttachInternet()
	require.NoError(t, err)
	srv, err := fleetlab.ServeInternet(inet, fleetlab.InternetAddr, obServerPorts[:1], 0)
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	to := netip.AddrPortFrom(fleetlab.InternetAddr, obServerPorts[0])

	claims := func() []fleet.PortRecord {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f, err := fleet.ReadStatus(ctx, l.etcd.cli, "")
		require.NoError(t, err)
		return f.Claims
	}
	var host1 []fleet.PortRecord // host1's ranges
	waitFor(t, "every VM's first range claimed", 30*time.Second, func() bool {
		cs := claims()
		host1 = host1[:0]
		dips := map[netip.Addr]bool{}
		for _, c := range cs {
			dips[c.DIP] = true
			if c.Host == "host1" {
				host1 = append(host1, c)
			}
		}
		return len(dips) == len(flVMs)
	})
	inHost1 := func(port uint16) bool {
		for _, c := range host1 {
			if port >= c.First && port <= c.Last {
				return true
			}
		}
		return false
	}
	l.logf("host1's ranges: %v", host1)

	// 1. A held connection from vm11.
	vm11, vm21 := flVMs[0], flVMs[2]
	held, err := fleetlab.DialInternet(l.fleet.VMs[vm11.Name], to, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { held.Close() })
	seen, err := held.Ask("before", 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, flVIP, seen.Addr())
	require.True(t, inHost1(seen.Port()), "vm11's connection on host1's ranges: %v", seen)
	heldPort := seen.Port()

	// 2. host1's Host Agent dies.
	l.agents[0].Kill()
	l.logf("host1's Host Agent killed")
	waitFor(t, "host1's claims gone with its lease", time.Minute, func() bool {
		for _, c := range claims() {
			if c.Host == "host1" {
				return false
			}
		}
		return true
	})

	// 3. vm21 wants more ports than the pool has outside host1's ranges.
	want := (8-len(host1))*unit + unit
	var mu sync.Mutex
	var opened []*fleetlab.InternetConn
	failed := 0
	var stolen []netip.AddrPort // connections seen on host1's ranges
	var wg sync.WaitGroup
	for k := range want {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := fleetlab.DialInternet(l.fleet.VMs[vm21.Name], to, 10*time.Second)
			var seen netip.AddrPort
			if err == nil {
				seen, err = c.Ask(fmt.Sprintf("vm21-%d", k), 10*time.Second)
			}
			mu.Lock()
			defer mu.Unlock()
			if c != nil {
				opened = append(opened, c)
			}
			if err != nil {
				failed++
				return
			}
			if inHost1(seen.Port()) {
				stolen = append(stolen, seen)
			}
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range opened {
			c.Close()
		}
	})
	l.logf("vm21: %d connections wanted, %d failed", want, failed)
	require.Empty(t, stolen, "vm21's connections on dead host1's ranges")
	require.Positive(t, failed, "the pool outside host1's ranges cannot hold all of vm21's connections")
	for _, c := range claims() {
		for _, h := range host1 {
			require.False(t, c.VIP == h.VIP && c.First == h.First, "host1's range %d-%d claimed by %v on %s while guarded", h.First, h.Last, c.DIP, c.Host)
		}
	}

	// 4. host1's Host Agent comes back and takes its ranges back.
	l.startEtcdAgent(0)
	waitFor(t, "host1's ranges claimed again by host1", time.Minute, func() bool {
		cs := claims()
		for _, h := range host1 {
			found := false
			for _, c := range cs {
				found = found || (c.First == h.First && c.Host == "host1" && c.DIP == h.DIP)
			}
			if !found {
				return false
			}
		}
		return true
	})
	l.waitApplied(l.version)
	seen, err = held.Ask("after", 10*time.Second)
	require.NoError(t, err, "the held connection after host1's Host Agent restarted")
	require.Equal(t, netip.AddrPortFrom(flVIP, heldPort), seen, "the held connection keeps its VIP port")
}
