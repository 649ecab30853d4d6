package e2e

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// The fleet tests (e2e_fleet_linux_test.go has the topology) check what
// the Host Agent's issue asks of the whole system beyond
// TestHostAgentEndToEnd (concurrent HTTP with payloads, DSR, UDP, reloads
// removing a DIP): the spread over weighted DIPs, a DIP that stops
// answering, a Mux that stops, and a reload that adds a DIP. Every client
// connection is opened from a port chosen by the test, so the backend it
// must reach is known in advance: the library's own choice (flow.Rules,
// flow.Hasher, Rule.Pick with the fleet's seed), which every Mux makes.
// Nothing waits a fixed time: the tests poll state, with deadlines that
// only guard against hangs — except the one documented bound they check
// (the probe's DownBound).

// TestFleetSpreadMatchesWeights sends N = 2000 HTTP requests, one
// connection each from client ports 20000–21999, 16 at a time, through
// the VIP of a pool weighted 1:2:1:4 and checks:
//
//  1. every connection is answered by the backend the library picks for
//     its flow (exact, per connection: both Muxes agree with the library);
//  2. the Maglev table's slot shares follow the weights within what the
//     Maglev tests guarantee (TestMaglevWeighted): backend i of weight w
//     owns M·w/W ± (1 + n·w/W) slots (M slots, W total weight, n weighted
//     backends);
//  3. the connections per backend match the slot shares: with a uniform
//     flow hash, backend i's count is Binomial(N, p_i), p_i its slot share
//     as read from the library's table (not assumed from the weights); the
//     test requires |count_i − N·p_i| ≤ 5·√(N·p_i·(1−p_i)) for every
//     backend. A correct hash fails this with probability below 6·10⁻⁷ per
//     backend (two-sided normal tail at 5σ), 2.3·10⁻⁶ for the four. The
//     ports and the seed are fixed, so the outcome is the same on every
//     run: the bound says how unlikely a failure of a good hash would be;
//  4. both Muxes carried flows (the router's ECMP), and the Muxes saw only the
//     client's packets (Direct Server Return): each Mux transmitted what
//     it received, and together they received no more than the client
//     sent.
func TestFleetSpreadMatchesWeights(t *testing.T) {
	l := newFleetLab(t)
	o := l.oracle()
	shares, size := o.shares()

	var totalW float64
	for _, vm := range l.pool {
		totalW += float64(vm.Weight)
	}
	for _, vm := range l.pool {
		w := float64(vm.Weight)
		want := float64(size) * w / totalW
		tol := 1 + float64(len(l.pool))*w/totalW
		got := shares[vm.Name] * float64(size)
		require.InDelta(t, want, got, tol, "%s (weight %d): Maglev slots %v, want M·w/W = %.1f ± %.2f (M = %d)",
			vm.Name, vm.Weight, got, want, tol, size)
	}

	const n, parallel = 2000, 16
	ports := make([]uint16, n)
	for i := range ports {
		ports[i] = flSpreadPorts + uint16(i)
	}
	cl0 := fleetlabtest.LinkStats(t, l.client, "up")
	rx0, tx0 := l.muxPackets()
	served := make([]string, n)
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < parallel; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				served[i], errs[i] = l.oneShot(ports[i], fmt.Sprintf("s%d", i), 10*time.Second)
			}
		}()
	}
	wg.Wait()

	counts := map[string]int{}
	for i, p := range ports {
		require.NoError(t, errs[i], "connection from port %d", p)
		require.Equal(t, o.pick(p), served[i], "connection from port %d: served by the library's pick", p)
		counts[served[i]]++
	}
	for _, vm := range l.pool {
		p := shares[vm.Name]
		mean := float64(n) * p
		sd := math.Sqrt(float64(n) * p * (1 - p))
		dev := float64(counts[vm.Name]) - mean
		t.Logf("spread: %s weight %d slot share %.4f (weight share %.4f): %d of %d connections, expected %.1f ± %.1f (σ), deviation %+.2fσ",
			vm.Name, vm.Weight, p, float64(vm.Weight)/totalW, counts[vm.Name], n, mean, sd, dev/sd)
		require.LessOrEqual(t, math.Abs(dev), 5*sd,
			"%s: %d of %d connections; with slot share %.4f the count is Binomial(N, p): mean %.1f, σ %.1f; the bound is 5σ (a good hash fails it with probability < 6e-7)",
			vm.Name, counts[vm.Name], n, p, mean, sd)
	}

	// DSR: the Muxes forwarded what they received (wait for the last ACKs
	// to be forwarded), and received no more than the client sent: read
	// the Muxes first, then the client's counter.
	var rx, tx [2]float64
	waitFor(t, "each Mux to have transmitted what it received", 10*time.Second, func() bool {
		rx, tx = l.muxPackets()
		return rx[0]-rx0[0] == tx[0]-tx0[0] && rx[1]-rx0[1] == tx[1]-tx0[1]
	})
	cl1 := fleetlabtest.LinkStats(t, l.client, "up")
	clTX, clRX := cl1.TxPackets-cl0.TxPackets, cl1.RxPackets-cl0.RxPackets
	d0, d1 := rx[0]-rx0[0], rx[1]-rx0[1]
	t.Logf("client sent %d packets and received %d; mux1 received %v, mux2 %v (each transmitted as many)", clTX, clRX, d0, d1)
	require.Positive(t, d0, "mux1 carried flows")
	require.Positive(t, d1, "mux2 carried flows")
	require.LessOrEqual(t, d0+d1, float64(clTX), "the Muxes received only what the client sent: no reply passed through them")
	require.GreaterOrEqual(t, clRX, uint64(3*n), "the replies reached the client")
}

// TestFleetDIPStopsAnswering makes one DIP (vm12, weight 2 of 8) stop
// answering while a client keeps opening new connections (16 at a time,
// each from a new port, each allowed 4 s), and checks:
//
//  1. both Muxes mark it down within the probe's documented bound,
//     health.Spec.DownBound (3.35 s for interval 500 ms, timeout 400 ms,
//     fall 3), plus 2 s of slack for the metrics polling and a loaded CI
//     machine. This is a functional deadline, not a speed measurement;
//  2. no connection to a healthy DIP fails: every failed connection was
//     predicted by the library to go to the failed DIP (with the full
//     pool), and started before both Muxes had marked it down;
//  3. every connection is served by the library's pick with the full pool
//     or with the failed DIP out; those that ended before the failure by
//     the full pool's, and those that started after both Muxes marked it
//     down (and ended before it answered again) by the pick without it:
//     they avoid it;
//  4. when the DIP answers again, both Muxes mark it up (the time is
//     logged against UpBound), new connections are served by the full
//     pool's pick again, the DIP among them, and none fails.
func TestFleetDIPStopsAnswering(t *testing.T) {
	l := newFleetLab(t)
	const victim = "vm12"
	full, without := l.oracle(), l.oracle(victim)
	bound, slack := flProbe.DownBound(), 2*time.Second

	type attempt struct {
		port          uint16
		full, without string // the library's picks
		got           string
		err           error
		start, end    time.Time
	}
	var (
		mu       sync.Mutex
		attempts []attempt
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				p := l.nextPort()
				a := attempt{port: p, full: full.pick(p), without: without.pick(p), start: time.Now()}
				a.got, a.err = l.oneShot(p, fmt.Sprintf("d%d", p), 4*time.Second)
				a.end = time.Now()
				mu.Lock()
				attempts = append(attempts, a)
				mu.Unlock()
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	// finished waits until n connections started at or after since have
	// ended.
	finished := func(what string, n int, since time.Time) {
		t.Helper()
		waitFor(t, what, 60*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			c := 0
			for _, a := range attempts {
				if !a.start.Before(since) {
					c++
				}
			}
			return c >= n
		})
	}
	// muxesSee polls both Muxes until each shows the victim's
	// xdplb_backend_up as want, and returns when each did.
	muxesSee := func(want float64, limit time.Duration) [2]time.Time {
		t.Helper()
		var at [2]time.Time
		waitFor(t, fmt.Sprintf("both Muxes to show %s with xdplb_backend_up=%v", victim, want), limit, func() bool {
			for i := range l.muxes {
				if !at[i].IsZero() {
					continue
				}
				if m, err := l.muxMetrics(i); err == nil && m[backendUp(victim)] == want {
					at[i] = time.Now()
				}
			}
			return !at[0].IsZero() && !at[1].IsZero()
		})
		return at
	}
	latest := func(at [2]time.Time) time.Time {
		if at[0].After(at[1]) {
			return at[0]
		}
		return at[1]
	}

	start := time.Now()
	finished("healthy traffic before the failure", 200, start)

	t0 := time.Now()
	restore := l.blackhole(victim)
	downAt := muxesSee(0, bound+slack+30*time.Second) // the extra is a hang guard: the bound is asserted below
	tDown := latest(downAt)
	t.Logf("measured: %s stops answering → marked down by mux1 after %v, by mux2 after %v (DownBound %v, + slack %v = %v)",
		victim, downAt[0].Sub(t0).Round(time.Millisecond), downAt[1].Sub(t0).Round(time.Millisecond), bound, slack, bound+slack)
	require.LessOrEqual(t, tDown.Sub(t0), bound+slack,
		"both Muxes mark a DIP that stops answering down within the probe's DownBound %v (interval %v, timeout %v, fall %d) + %v slack",
		bound, flProbe.Interval, flProbe.Timeout, flProbe.Fall, slack)
	finished("traffic while the DIP is down", 300, tDown)

	tRestore := time.Now()
	restore()
	upAt := muxesSee(1, 30*time.Second)
	tUp := latest(upAt)
	t.Logf("measured: %s answers again → marked up by mux1 after %v, by mux2 after %v (UpBound %v; not asserted)",
		victim, upAt[0].Sub(tRestore).Round(time.Millisecond), upAt[1].Sub(tRestore).Round(time.Millisecond), flProbe.UpBound())
	finished("traffic after the DIP is back", 300, tUp)
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	// Phases: healthy (ended before the failure), window (started before
	// both Muxes marked it down), down (ended before it answers again),
	// returning (started before both Muxes marked it up), back.
	var healthy, window, down, returning, back int
	var failed, replaced, servedOld, backOnVictim int
	for _, a := range attempts {
		if a.err != nil {
			failed++
			require.Equal(t, victim, a.full,
				"connection from port %d (started %v after the failure) failed, but the library sends it to %s, a healthy DIP: %v",
				a.port, a.start.Sub(t0), a.full, a.err)
			require.True(t, a.start.Before(tDown),
				"connection from port %d started %v after both Muxes had marked %s down, yet failed: %v", a.port, a.start.Sub(tDown), victim, a.err)
			window++
			continue
		}
		switch {
		case a.end.Before(t0):
			require.Equal(t, a.full, a.got, "connection from port %d, before the failure", a.port)
			healthy++
		case a.start.Before(tDown):
			require.Contains(t, []string{a.full, a.without}, a.got,
				"connection from port %d: served by %s, the library picks %s (full pool) or %s (without %s)", a.port, a.got, a.full, a.without, victim)
			if a.full == victim {
				if a.got == victim {
					require.True(t, a.start.Before(t0), "connection from port %d, started after the failure, served by %s", a.port, victim)
					servedOld++
				} else {
					replaced++
				}
			}
			window++
		case a.end.Before(tRestore):
			require.Equal(t, a.without, a.got, "connection from port %d, started after both Muxes marked %s down", a.port, victim)
			down++
		case a.start.Before(tUp):
			require.Contains(t, []string{a.full, a.without}, a.got,
				"connection from port %d: served by %s, the library picks %s (full pool) or %s (without %s)", a.port, a.got, a.full, a.without, victim)
			returning++
		default:
			require.Equal(t, a.full, a.got, "connection from port %d, started after both Muxes marked %s up again", a.port, victim)
			back++
			if a.got == victim {
				backOnVictim++
			}
		}
	}
	t.Logf("%d connections: %d before the failure, all to the library's pick; %d until both Muxes marked %s down: "+
		"%d failed (all of them the library sends to %s), %d of its flows re-placed on a healthy DIP, %d served by it before it stopped; "+
		"%d while it was down, none to it; %d while it came back; %d after, %d of them to %s",
		len(attempts), healthy, window, victim, failed, victim, replaced, servedOld, down, returning, back, backOnVictim, victim)
	require.Positive(t, backOnVictim, "%s serves new connections again", victim)
}

// TestFleetMuxStopKeepsConnections opens 32 long-lived keep-alive HTTP
// connections through the VIP, spread by the router's ECMP over both
// Muxes, exchanges requests on all of them continuously, and stops mux2
// the normal way (SIGTERM: withdraw its routes, forward for the withdraw
// grace, stop). It checks:
//
//  1. both Muxes carry some of the connections, as their receive
//     counters show: one request at a time, each connection's packets
//     (the request and the ACK of the answer) reach exactly one Mux;
//  2. the router's route shrinks to mux1 and mux2 exits cleanly;
//  3. every connection survives — no request fails or goes unanswered,
//     before, during or after the stop — and every answer comes from the
//     same VM as the first one, which is the library's pick: the flows
//     mux2 carried continue through mux1, which has no state for them and
//     picks the same DIP; and survives undisturbed: from SIGTERM to the
//     exit no packet of theirs is lost in either direction — neither the
//     client nor a VM retransmits a segment its peer had not received
//     (requireNoDisruption);
//  4. after the stop, mux1 receives the requests of the connections that
//     mux2 carried, and its connection table gains entries for them.
//
// Which Mux a connection takes is read from the counters, not predicted:
// in namespaces the router's kernel hashes a forwarded packet with the
// L4 hash the client's socket gave it (skb->hash survives the veth), a
// random value per connection that the client redraws after a
// retransmission timeout, so the choice is neither the 5-tuple's nor
// fixed for the connection's life.
func TestFleetMuxStopKeepsConnections(t *testing.T) {
	l := newFleetLab(t)
	o := l.oracle()
	const k = 32
	conns, dips := l.openConns(t, k, o)
	via := make([]int, k)
	var perMux [2]int
	for i, c := range conns {
		via[i] = l.carrier(t, c, dips[i], fmt.Sprintf("r%d", i))
		perMux[via[i]]++
	}
	t.Logf("connections per Mux (from the Muxes' receive counters): mux1 %d, mux2 %d", perMux[0], perMux[1])
	require.Positive(t, perMux[0], "mux1 carries some connections")
	require.Positive(t, perMux[1], "mux2 carries some connections")

	ex := startExchanges(conns, dips, 100*time.Millisecond)
	defer ex.finish(t)
	ex.waitRounds(t, 2)
	inserts := func() float64 {
		m, err := l.muxMetrics(0)
		require.NoError(t, err)
		return m[`xdplb_conntable_events_total{event="insert"}`]
	}
	ins0 := inserts()
	retrans0 := l.retrans()
	ex.resetSlow()
	require.NoError(t, l.muxes[1].Terminate())
	waitFor(t, "the router's route to the VIP through mux1 only", 30*time.Second, func() bool {
		return slices.Equal(l.nextHops(), []netip.Addr{fleetlab.FleetMuxAddr(1)})
	})
	require.NoError(t, l.muxes[1].Stop(30*time.Second), "mux2 exits with status 0 after SIGTERM")
	rx2, n2 := l.muxRX1(0), ex.total()
	ex.waitRounds(t, 3)
	ex.finish(t)
	rx3, ins1 := l.muxRX1(0), inserts()
	t.Logf("after mux2 stopped: %d connections (%d of them moved from mux2) did %d more exchanges; mux1 received %v packets "+
		"and placed %v flows it had no entry for",
		k, perMux[1], ex.total()-n2, rx3-rx2, ins1-ins0)
	require.Positive(t, ins1-ins0, "mux1 placed the moved flows (new connection-table entries), by the same Maglev pick")
	// "Survived" means no packet was lost and nothing stalled, not that
	// TCP recovered: a Mux that stopped forwarding before its routes were
	// gone would pass the checks above on retransmissions alone.
	l.requireNoDisruption(retrans0, ex, "while mux2 withdrew and stopped")

	// The connections mux2 carried, once more, one at a time: mux1
	// receives each request.
	for i, c := range conns {
		if via[i] != 1 {
			continue
		}
		before := l.muxRX1(0)
		got, err := c.get(fmt.Sprintf("m%d", i), false, 10*time.Second)
		require.NoError(t, err, "connection from port %d (moved from mux2)", c.port)
		require.Equal(t, dips[i], got, "connection from port %d (moved from mux2) kept its DIP", c.port)
		require.Greater(t, l.muxRX1(0), before, "mux1 carried the request of port %d", c.port)
	}
}

// TestFleetReloadNewDIPKeepsConnections opens 64 long-lived keep-alive
// HTTP connections through the VIP and applies document version 2, which
// adds vm13 (weight 2, on host1: a new VM port, so host1's agent rebuilds
// its data path while host2's updates live). It checks:
//
//  1. the test means something: the library sends some of these flows to
//     another DIP under version 2 (they would move without the Muxes'
//     connection tables);
//  2. every connection keeps answering from the VM that first answered it
//     (the library's pick under version 1), over several rounds of
//     requests after the reload, and no request fails;
//  3. nothing disturbed them: from the write of version 2 to three rounds
//     after it was applied everywhere, no packet of theirs was lost in
//     either direction — neither the client nor a VM retransmitted a
//     segment its peer had not received (requireNoDisruption);
//  4. new connections follow version 2: each is served by the library's
//     version-2 pick, vm13 among them.
//
// Requests keep running on every connection (one every 2 ms each) while
// the documents change. Until the agent kept its steering programs
// attached across a rebuild (with SetDropNoSocket), this broke every
// connection to host1's VMs: for the ~200 ms without a program on the VM
// ports, what a VM sent reached the host's kernel, which forwarded it
// untranslated (source = the DIP); the client answered with a RST that
// reset the VM's end.
func TestFleetReloadNewDIPKeepsConnections(t *testing.T) {
	l := newFleetLab(t)
	o1 := l.oracle()
	const k = 64
	conns, dips := l.openConns(t, k, o1)

	pool2 := append(slices.Clone(flVMs), flSpare)
	o2 := newFleetOracle(t, flDocument(2, 0, pool2))
	moved := map[string]int{}
	for i, c := range conns {
		if p := o2.pick(c.port); p != dips[i] {
			moved[dips[i]+"→"+p]++
		}
	}
	t.Logf("flows the version-2 table sends elsewhere: %v", moved)
	require.NotEmpty(t, moved, "some existing flows must map to another DIP under version 2, or the test proves nothing")

	ex := startExchanges(conns, dips, 2*time.Millisecond)
	defer ex.finish(t)
	ex.waitRounds(t, 2)
	h1, err := l.agentMetrics(0)
	require.NoError(t, err)
	builds := h1["xdplb_datapath_builds_total"]
	retrans0 := l.retrans()
	ex.resetSlow()
	l.writeDocuments(2, pool2)
	l.waitApplied(2)
	h1, err = l.agentMetrics(0)
	require.NoError(t, err)
	require.Equal(t, builds+1, h1["xdplb_datapath_builds_total"], "host1 rebuilt its data path for the new VM port")
	ex.waitRounds(t, 3)
	ex.finish(t)
	t.Logf("%d connections did %d exchanges, every one answered by its first VM", k, ex.total())
	// Asserted since the rebuild builds the new data path beside the
	// running one (issue 10, items 5 and 9). Before, host1's workers
	// stopped, then the new data path was built — the new VM port's
	// steering program loaded and verified, its socket and UMEM made —
	// and only then the new workers ran: what arrived meanwhile waited in
	// the handed-over sockets' rings, and in about one run in six the
	// wait outlasted the client's retransmission timeout (200 ms at
	// least): one retransmission per host1 connection, nothing lost.
	// That latency is logged, not asserted (see requireUndisturbed): the
	// machine alone stalls a node's connections as long.
	l.requireNoDisruption(retrans0, ex, "while the fleet applied version 2 (host1 rebuilt its data path)")

	served := map[string]int{}
	for i := 0; i < 200; i++ {
		p := l.nextPort()
		got, err := l.oneShot(p, fmt.Sprintf("n%d", i), 10*time.Second)
		require.NoError(t, err, "new connection from port %d", p)
		require.Equal(t, o2.pick(p), got, "new connection from port %d: the version-2 pick", p)
		served[got]++
	}
	t.Logf("new connections after the reload: %v", served)
	require.Positive(t, served[flSpare.Name], "%s serves new connections", flSpare.Name)
}

// round sends one request on every connection, all at once, and checks
// each is answered by the connection's VM.
func (l *fleetLab) round(t *testing.T, conns []*flConn, dips []string, tag string) {
	t.Helper()
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := c.get(fmt.Sprintf("%s-%d", tag, i), false, 10*time.Second)
			if err == nil && got != dips[i] {
				err = fmt.Errorf("answered by %s, was %s", got, dips[i])
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "connection from port %d (on %s), round %s", conns[i].port, dips[i], tag)
	}
}

// openConns opens k keep-alive connections from new ports and checks the
// first answer of each is the library's pick; it returns them and the VM
// each is on. The test's cleanup closes them.
func (l *fleetLab) openConns(t *testing.T, k int, o *fleetOracle) ([]*flConn, []string) {
	t.Helper()
	conns := make([]*flConn, k)
	dips := make([]string, k)
	for i := range conns {
		p := l.nextPort()
		c, err := l.dial(p, 10*time.Second)
		require.NoError(t, err, "connect from port %d", p)
		t.Cleanup(c.close)
		got, err := c.get(fmt.Sprintf("o%d", i), false, 10*time.Second)
		require.NoError(t, err, "first request from port %d", p)
		require.Equal(t, o.pick(p), got, "connection from port %d: the library's pick", p)
		conns[i], dips[i] = c, got
	}
	perVM := map[string]int{}
	for _, d := range dips {
		perVM[d]++
	}
	keys := make([]string, 0, len(perVM))
	for d := range perVM {
		keys = append(keys, d)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, d := range keys {
		fmt.Fprintf(&b, " %s:%d", d, perVM[d])
	}
	t.Logf("%d long-lived connections per VM:%s", k, b.String())
	return conns, dips
}

// carrier sends one request on c (answered by dip) and returns the Mux
// that carried it: the one whose receive counter counts the request and
// the ACK of the answer. The other Mux must count nothing meanwhile (no
// other traffic runs).
func (l *fleetLab) carrier(t *testing.T, c *flConn, dip, token string) int {
	t.Helper()
	rx0 := l.muxRX()
	got, err := c.get(token, false, 10*time.Second)
	require.NoError(t, err, "connection from port %d", c.port)
	require.Equal(t, dip, got, "connection from port %d", c.port)
	var rx1 [2]float64
	waitFor(t, fmt.Sprintf("the request and the ACK of port %d counted by a Mux", c.port), 10*time.Second, func() bool {
		rx1 = l.muxRX()
		return rx1[0]-rx0[0]+rx1[1]-rx0[1] >= 2
	})
	d := [2]float64{rx1[0] - rx0[0], rx1[1] - rx0[1]}
	require.True(t, d[0] == 0 || d[1] == 0, "port %d: both Muxes received packets of one exchange: %v", c.port, d)
	if d[0] > 0 {
		return 0
	}
	return 1
}

// muxRX1 returns Mux i's data-path receive counter.
func (l *fleetLab) muxRX1(i int) float64 {
	l.t.Helper()
	m, err := l.muxMetrics(i)
	require.NoError(l.t, err)
	return m[`xdplb_packets_total{direction="rx"}`]
}

// exchanges runs requests on every connection continuously, one goroutine
// per connection, pausing pace between two; each answer must come from
// the connection's VM.
type exchanges struct {
	counts []atomic.Int64
	slow   atomic.Int64 // the slowest exchange since the start or resetSlow, in nanoseconds
	slowMu sync.Mutex
	slowOf string // which exchange that was, and when it began
	// quiet is the slowest exchange before the last resetSlow: the
	// machine's own noise, with nothing happening to the data path.
	quiet  time.Duration
	failed atomic.Bool
	mu     sync.Mutex
	errs   []error
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

// retrans returns the TCP retransmissions of both ends of the
// connections through the VIP: the client's and every VM's.
func (l *fleetLab) retrans() tcpRetrans {
	ns := []*netlab.NS{l.client}
	for _, n := range l.fleet.VMs {
		ns = append(ns, n)
	}
	return readRetrans(l.t, ns...)
}

// requireNoDisruption: see requireUndisturbed; the retransmissions are
// counted since before (retrans).
func (l *fleetLab) requireNoDisruption(before tcpRetrans, ex *exchanges, what string) {
	l.t.Helper()
	requireUndisturbed(l.t, l.retrans().since(before), ex, what)
}

func startExchanges(conns []*flConn, dips []string, pace time.Duration) *exchanges {
	e := &exchanges{counts: make([]atomic.Int64, len(conns)), stop: make(chan struct{})}
	for i, c := range conns {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			for n := 0; ; n++ {
				select {
				case <-e.stop:
					return
				case <-time.After(pace):
				}
				began := time.Now()
				got, err := c.get(fmt.Sprintf("x%d-%d", i, n), false, 10*time.Second)
				if d := int64(time.Since(began)); d > e.slow.Load() {
					e.slowMu.Lock()
					if d > e.slow.Load() {
						e.slow.Store(d)
						e.slowOf = fmt.Sprintf("port %d (on %s), begun %s", c.port, dips[i], began.UTC().Format("15:04:05.000"))
					}
					e.slowMu.Unlock()
				}
				if err == nil && got != dips[i] {
					err = fmt.Errorf("answered by %s, was %s", got, dips[i])
				}
				if err != nil {
					e.mu.Lock()
					e.errs = append(e.errs, fmt.Errorf("connection from port %d (on %s), exchange %d: %w", c.port, dips[i], n, err))
					e.mu.Unlock()
					e.failed.Store(true)
					return
				}
				e.counts[i].Add(1)
			}
		}()
	}
	return e
}

// waitRounds waits until every connection has done n more exchanges, or
// one has failed.
func (e *exchanges) waitRounds(t *testing.T, n int64) {
	t.Helper()
	base := make([]int64, len(e.counts))
	for i := range e.counts {
		base[i] = e.counts[i].Load()
	}
	waitFor(t, fmt.Sprintf("%d more exchanges on every connection", n), 60*time.Second, func() bool {
		if e.failed.Load() {
			return true
		}
		for i := range e.counts {
			if e.counts[i].Load() < base[i]+n {
				return false
			}
		}
		return true
	})
	e.check(t)
}

// resetSlow forgets the slowest exchange (keeping it as the quiet
// baseline): a step measures its own.
func (e *exchanges) resetSlow() {
	e.slowMu.Lock()
	e.quiet = time.Duration(e.slow.Load())
	e.slow.Store(0)
	e.slowOf = ""
	e.slowMu.Unlock()
}

func (e *exchanges) total() int64 {
	var s int64
	for i := range e.counts {
		s += e.counts[i].Load()
	}
	return s
}

// check fails the test on the errors not reported yet.
func (e *exchanges) check(t *testing.T) {
	t.Helper()
	e.mu.Lock()
	errs := e.errs
	e.errs = nil
	e.mu.Unlock()
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
}

// finish stops the exchanges, waits for them and fails the test on any
// error.
func (e *exchanges) finish(t *testing.T) {
	t.Helper()
	e.once.Do(func() { close(e.stop) })
	e.wg.Wait()
	e.check(t)
}
