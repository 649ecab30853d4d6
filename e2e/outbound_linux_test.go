package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

// Outbound connections through the VIP (issue 13): the fleet lab's four
// VMs use the web VIP as their source towards an "internet" namespace
// behind the router. Each VM has a static range of obRange ports; the
// Host Agents translate VM:port → VIP:port and send the packets straight
// to the router; the replies, addressed to the VIP, reach a Mux, whose
// range table sends them to the VM's host, which translates them back.
const (
	obFirst   = 10240 // the first VM's range starts here
	obRange   = 512   // ports per VM
	obConns   = 1000  // concurrent TCP connections per VM: more than obRange
	obUDP     = 50    // UDP exchanges per VM
	obDialers = 16    // connections opened at once per VM
	obPings   = 3     // ICMP echo requests per VM (all with one identifier)
)

// obServerPorts are the internet server's TCP ports: with several remote
// endpoints a VM's range serves more connections than it has ports.
var obServerPorts = []uint16{7001, 7002, 7003, 7004, 7005, 7006, 7007, 7008}

const (
	obUDPPort    = 7100
	obClosedPort = 7999 // nothing listens: the internet answers port unreachable
)

// outboundSection is the lab's outbound section: every VM of flVMs may
// use the VIP as its source, with obRange ports each from obFirst.
func outboundSection() control.Outbound {
	return fleetlab.StaticOutbound(flVIP, fleetlab.FleetVNI, flVMs, obFirst, obRange, 64)
}

// TestOutboundSNAT shows source NAT through the VIP end to end: 4 VMs
// hold obConns concurrent TCP connections each (4,000 in all) and make
// UDP exchanges to the internet namespace; the server sees only the VIP,
// each VM's connections on its own range, none failed; a VM holds more
// connections than its range has ports (ports are reused per remote
// endpoint); a port unreachable error about a VM's datagram reaches its
// socket; each VM's pings (one echo identifier for all four VMs)
// reach the internet from the VIP and are answered; the replies cross the
// Muxes (counted by their range table).
func TestOutboundSNAT(t *testing.T) {
	ob := outboundSection()
	l := newFleetLabOf(t, func(d *fleetlab.Doc) { d.Outbound = []control.Outbound{ob} })
	inet, err := l.fleet.AttachInternet()
	require.NoError(t, err)
	srv, err := fleetlab.ServeInternet(inet, fleetlab.InternetAddr, obServerPorts, obUDPPort)
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	returnsBefore := l.muxReturns()

	results := make([]obResult, len(flVMs))
	var wg sync.WaitGroup
	for i, vm := range flVMs {
		rng, ok := fleetlab.StaticRange(ob, vm.Addr)
		require.True(t, ok)
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = openOutbound(l, vm, rng)
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, r := range results {
			for _, c := range r.conns {
				c.Close()
			}
		}
	})
	for i, r := range results {
		require.NoError(t, r.err, "%s", flVMs[i].Name)
		require.Len(t, r.conns, obConns, "%s: connections open", flVMs[i].Name)
		require.LessOrEqual(t, len(r.ports), obRange, "%s", flVMs[i].Name)
		t.Logf("%s: %d connections on %d VIP ports of its %d", flVMs[i].Name, len(r.conns), len(r.ports), obRange)
	}
	open, _ := srv.Open()
	require.EqualValues(t, len(flVMs)*obConns, open, "every connection open at once on the server")

	// Every held connection still works: a second exchange on each.
	for i, vm := range flVMs {
		rng, _ := fleetlab.StaticRange(ob, vm.Addr)
		for k, c := range results[i].conns {
			seen, err := c.Ask(fmt.Sprintf("%s-again-%d", vm.Name, k), 10*time.Second)
			require.NoError(t, err, "%s connection %d, second exchange", vm.Name, k)
			requireOnRange(t, seen, rng, vm.Name)
		}
	}

	// UDP: each exchange is a new flow; the answer comes back through a Mux.
	for _, vm := range flVMs {
		rng, _ := fleetlab.StaticRange(ob, vm.Addr)
		for k := range obUDP {
			seen, err := fleetlab.AskInternetUDP(l.fleet.VMs[vm.Name], netip.AddrPortFrom(fleetlab.InternetAddr, obUDPPort),
				fmt.Sprintf("%s-udp-%d", vm.Name, k), 5*time.Second)
			require.NoError(t, err, "%s UDP exchange %d", vm.Name, k)
			requireOnRange(t, seen, rng, vm.Name)
		}
	}

	// An ICMP error about an outbound datagram (port unreachable from the
	// internet, addressed to the VIP) crosses a Mux to the VM's host and
	// reaches the VM's socket, translated. (The internet's kernel sends
	// such errors at a limited rate: a few tries each.)
	for _, vm := range flVMs {
		var err error
		for range 3 {
			if err = fleetlab.UDPRefused(l.fleet.VMs[vm.Name], netip.AddrPortFrom(fleetlab.InternetAddr, obClosedPort), 2*time.Second); err == nil {
				break
			}
		}
		require.NoError(t, err, "%s: the port unreachable error about its datagram", vm.Name)
	}

	// Ping: the echo identifier serves as the port, the reply returns
	// through a Mux; the internet sees the VIP.
	echoes, err := fleetlab.WatchEchoRequests(inet)
	require.NoError(t, err)
	t.Cleanup(func() { echoes.Close() })
	for _, vm := range flVMs {
		require.NoError(t, fleetlab.Ping(l.fleet.VMs[vm.Name], fleetlab.InternetAddr, 4242, obPings, 5*time.Second), "%s ping", vm.Name)
	}
	// The watch reads its copies on its own: let it catch up.
	waitFor(t, "the internet's watch to see every echo request", 10*time.Second, func() bool {
		n := 0
		for _, k := range echoes.Sources() {
			n += k
		}
		return n >= len(flVMs)*obPings
	})
	t.Logf("echo requests the internet saw, by source: %v", echoes.Sources())
	require.Equal(t, map[netip.Addr]int{flVIP: len(flVMs) * obPings}, echoes.Sources(), "the internet saw pings from the VIP only")

	srcs := srv.Sources()
	require.Equal(t, map[netip.Addr]int{flVIP: len(flVMs) * (obConns + obUDP)}, srcs,
		"the internet saw only the VIP, once per connection and datagram")
	returns := l.muxReturns() - returnsBefore
	// Each TCP connection got at least its SYN-ACK and two answers back,
	// each UDP exchange one answer, all through a Mux's range table.
	require.GreaterOrEqual(t, returns, float64(len(flVMs)*(3*obConns+obUDP+obPings)), "replies counted by the Muxes' range tables")
	t.Logf("%d replies crossed the Muxes' range tables", int(returns))
}

// obResult is what one VM's connections gave.
type obResult struct {
	conns []*fleetlab.InternetConn
	ports map[uint16]int // the VIP ports the server saw, with how many connections each
	err   error
}

// openOutbound opens obConns connections from vm to the internet server,
// spread over its ports, one exchange each, and checks that each shows
// the VIP on a port of rng.
func openOutbound(l *fleetLab, vm fleetlab.VM, rng control.PortRange) (r obResult) {
	n := l.fleet.VMs[vm.Name]
	r.ports = map[uint16]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range obDialers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				to := netip.AddrPortFrom(fleetlab.InternetAddr, obServerPorts[k%len(obServerPorts)])
				c, err := fleetlab.DialInternet(n, to, 10*time.Second)
				var seen netip.AddrPort
				if err == nil {
					seen, err = c.Ask(fmt.Sprintf("%s-%d", vm.Name, k), 10*time.Second)
				}
				if err == nil && (seen.Addr() != flVIP || seen.Port() < rng.First || seen.Port() > rng.Last) {
					err = fmt.Errorf("the server saw %v, want %v on %v", seen, flVIP, rng)
				}
				mu.Lock()
				if c != nil {
					r.conns = append(r.conns, c)
				}
				if err != nil && r.err == nil {
					r.err = fmt.Errorf("connection %d to %v: %w", k, to, err)
				}
				if err == nil {
					r.ports[seen.Port()]++
				}
				mu.Unlock()
			}
		}()
	}
	for k := range obConns {
		next <- k
	}
	close(next)
	wg.Wait()
	return r
}

func requireOnRange(t *testing.T, seen netip.AddrPort, rng control.PortRange, vm string) {
	t.Helper()
	require.Equal(t, flVIP, seen.Addr(), "%s: the server saw %v", vm, seen)
	require.True(t, seen.Port() >= rng.First && seen.Port() <= rng.Last, "%s: port %d outside its range %v", vm, seen.Port(), rng)
}

// muxReturns is the replies to outbound connections both Muxes have sent
// to their owners' hosts.
func (l *fleetLab) muxReturns() float64 {
	l.t.Helper()
	var sum float64
	for i := range l.muxes {
		m, err := l.muxMetrics(i)
		require.NoError(l.t, err)
		sum += fleetlab.SumMetric(m, "xdplb_vip_return_packets_total")
	}
	return sum
}

// TestOutboundExhaustion gives vm11 one range of 8 ports and opens
// connections to one remote endpoint (each needs its own port): the
// ninth cannot get a port. That failure is counted on vm11's host
// (snat_exhausted), the eight open connections keep working, and once
// one of them is closed its port comes back for a new connection.
func TestOutboundExhaustion(t *testing.T) {
	const small = 8
	vm := flVMs[0] // vm11, on host1
	ob := fleetlab.StaticOutbound(flVIP, fleetlab.FleetVNI, []fleetlab.VM{vm}, obFirst, small, small)
	l := newFleetLabOf(t, func(d *fleetlab.Doc) { d.Outbound = []control.Outbound{ob} })
	inet, err := l.fleet.AttachInternet()
	require.NoError(t, err)
	srv, err := fleetlab.ServeInternet(inet, fleetlab.InternetAddr, obServerPorts[:1], 0)
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	n := l.fleet.VMs[vm.Name]
	to := netip.AddrPortFrom(fleetlab.InternetAddr, obServerPorts[0])
	rng, _ := fleetlab.StaticRange(ob, vm.Addr)

	var conns []*fleetlab.InternetConn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	ports := map[uint16]bool{}
	for k := range small {
		c, err := fleetlab.DialInternet(n, to, 10*time.Second)
		require.NoError(t, err, "connection %d of %d", k+1, small)
		conns = append(conns, c)
		seen, err := c.Ask(fmt.Sprintf("c%d", k), 10*time.Second)
		require.NoError(t, err)
		requireOnRange(t, seen, rng, vm.Name)
		ports[seen.Port()] = true
	}
	require.Len(t, ports, small, "one port per connection to the same endpoint")

	exhausted := func() float64 {
		m, err := l.agentMetrics(0)
		require.NoError(t, err)
		return m[`xdplb_drops_total{reason="snat_exhausted"}`]
	}
	before := exhausted()
	_, err = fleetlab.DialInternet(n, to, 3*time.Second)
	require.Error(t, err, "a ninth connection to the same endpoint: the range has no port left")
	require.Greater(t, exhausted(), before, "the exhaustion is counted on the VM's host")
	waitFor(t, "host1's Host Agent to log the exhaustion", 30*time.Second, func() bool {
		return strings.Contains(l.agents[0].Output(), "no free port in their VM's ranges") &&
			strings.Contains(l.agents[0].Output(), vm.Addr.String()+" 8/8 ports")
	})

	for k, c := range conns {
		_, err := c.Ask(fmt.Sprintf("still-%d", k), 10*time.Second)
		require.NoError(t, err, "connection %d still works after the exhaustion", k)
	}

	// Freeing a connection returns its port (once its closing state has
	// timed out).
	require.NoError(t, conns[0].Close())
	conns = conns[1:]
	waitFor(t, "a new connection on the freed port", time.Minute, func() bool {
		c, err := fleetlab.DialInternet(n, to, 2*time.Second)
		if err != nil {
			return false
		}
		conns = append(conns, c)
		seen, err := c.Ask("after", 5*time.Second)
		return err == nil && seen.Addr() == flVIP && seen.Port() >= rng.First && seen.Port() <= rng.Last
	})
}
