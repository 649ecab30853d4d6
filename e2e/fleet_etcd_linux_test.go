package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// TestFleetEtcdFaults runs the fleet of the failover tests (two Muxes
// behind BIRD, two hosts with Host Agents, four VMs, one client) from its
// one document in a real three-member etcd cluster: each member is a
// process of its own (this test binary re-executed, TestEtcdMemberProcess)
// in a namespace of its own, on Unix sockets every namespace reaches, and
// every node is given all three endpoints. The document goes in with the
// xdplbctl binary. Traffic runs from the first step to the last: 16
// keep-alive HTTP connections, each exchanging a request every 20 ms and
// answered every time by the VM that first answered it, and a new
// connection every 20 ms. The keep-alive connections are from client
// ports whose flows version 4 sends where version 1 does: a flow the
// router moves to the other Mux (it redraws a connection's ECMP hash
// after a retransmission timeout, which a busy CI machine can cause),
// where no connection entry holds it, stays on its DIP. Connections that
// version 4's table moves are TestFleetReloadNewDIPKeepsConnections'
// subject, not this test's. With that running, it shows:
//
//  1. a document applied with xdplbctl (version 2) reaches every node:
//     each reports it in etcd (fleet.ReadStatus) and runs it (metrics);
//  2. killing the leader's process (SIGKILL) changes nothing: no node
//     loses its leases, and version 3 applied then reaches every node;
//  3. with the other two members gone too (one stopped with SIGTERM, the
//     last killed), every node keeps forwarding on version 3, and keeps
//     it, through the loss of its etcd leases (each node logs it: etcd has
//     been gone longer than a lease);
//  4. the three members restarted on their data directories, the nodes
//     catch up with version 4, which adds vm13 to the pool: every node
//     reports and runs it, new connections go where version 4 sends them
//     (vm13 among them), and once the leases of before the outage have
//     expired in etcd, every node's status and every DIP's health are
//     there under the new ones.
//
// Across the whole test, no exchange and no new connection fails: every
// DIP stays healthy, so every failure would be a failed connection to a
// healthy DIP.
func TestFleetEtcdFaults(t *testing.T) {
	l := newEtcdFleetLab(t)
	e := l.etcd

	pool4 := append(slices.Clone(flVMs), flSpare) // step 4's pool
	conns, dips := l.openStableConns(16, l.oracle(), newFleetOracle(t, flDocument(4, 0, pool4)))
	ex := startExchanges(conns, dips, 20*time.Millisecond)
	defer ex.finish(t)
	nc := l.startNewConns(20 * time.Millisecond)
	defer nc.finish(t)
	ex.waitRounds(t, 2)
	nc.waitMore(t, 10)

	// 1. A new version, applied with xdplbctl, reaches every node.
	l.apply(2, l.pool)
	l.waitStatus(2)
	l.waitApplied(2)
	ex.waitRounds(t, 2)
	nc.waitMore(t, 10)

	// 2. The leader's process killed: nothing changes.
	lost := l.leaseLosses()
	leader := e.leader()
	l.logf("killing etcd member %s, the leader (SIGKILL)", e.cluster[leader].Name)
	e.kill(leader)
	l.apply(3, l.pool)
	l.waitStatus(3)
	l.waitApplied(3)
	ex.waitRounds(t, 2)
	nc.waitMore(t, 10)
	require.Equal(t, lost, l.leaseLosses(), "a node lost an etcd lease while one member of three was down")

	// 3. Every member stopped: the nodes keep forwarding on version 3.
	// One stops cleanly (SIGTERM: the last one, without a quorum, tells
	// its watchers it has no leader), the last is killed (its clients
	// hear nothing more).
	l.leasesBefore = e.leases()
	var rest []int
	for i := range e.procs {
		if i != leader {
			rest = append(rest, i)
		}
	}
	e.stop(rest[0])
	e.kill(rest[1])
	e.cli.Close() // nothing to ask until the members are back
	l.logf("every etcd member stopped; waiting for every node to lose its etcd leases")
	waitFor(t, "every node to log the loss of its etcd status lease", 60*time.Second, func() bool {
		now := l.leaseLosses()
		for name, n := range lost {
			if now[name] <= n {
				return false
			}
		}
		return true
	})
	ex.waitRounds(t, 3)
	nc.waitMore(t, 10)
	l.requireRunning(3)
	l.logf("etcd down: every node still runs version 3 and forwards; %d exchanges, %d new connections so far",
		ex.total(), nc.ok.Load())

	// 4. The members restarted: the nodes catch up with version 4.
	e.startAll()
	t.Cleanup(l.stopNodes) // before the members (cleanups run last first): the nodes leave etcd as they stop
	l.logf("etcd restarted")
	l.apply(4, pool4)
	l.waitStatus(4)
	l.waitApplied(4)
	o4 := l.oracle()
	served := map[string]int{}
	for i := range 100 {
		p := l.nextPort()
		got, err := l.oneShot(p, fmt.Sprintf("v4-%d", i), 10*time.Second)
		require.NoError(t, err, "new connection from port %d after version 4", p)
		require.Equal(t, o4.pick(p), got, "new connection from port %d: version 4's pick", p)
		served[got]++
	}
	l.logf("new connections under version 4: %v", served)
	require.Positive(t, served[flSpare.Name], "%s, added by version 4, serves new connections", flSpare.Name)

	// The leases taken before the outage expire; what the nodes wrote
	// under new ones stays.
	e.waitLeasesGone(l.leasesBefore)
	l.logf("the leases of before the outage expired")
	l.waitStatus(4)
	l.requireRunning(4)
	l.requireHealthPublished()
	ex.waitRounds(t, 2)
	nc.waitMore(t, 10)
	ex.finish(t)
	nc.finish(t)
	t.Logf("%d keep-alive connections did %d exchanges, each answered by its first VM; %d new connections, none failed",
		len(conns), ex.total(), nc.ok.Load())
	t.Logf("xdplbctl status:\n%s", l.ctl("status"))
}

// logf logs with the time since the test began, to follow the steps.
func (l *etcdFleetLab) logf(format string, args ...any) {
	l.t.Helper()
	l.t.Logf("[%6.2fs] %s", time.Since(l.began).Seconds(), fmt.Sprintf(format, args...))
}

// etcdFleetLab is the fleetLab of the failover tests with its document in
// etcd, and the cluster.
type etcdFleetLab struct {
	*fleetLab
	etcd   *etcdCluster
	ctlBin string
	began  time.Time
	// leasesBefore are the etcd leases granted before step 3's outage.
	leasesBefore []clientv3.LeaseID
}

// newEtcdFleetLab builds the fleet's topology, starts a three-member etcd
// cluster, applies version 1 of the fleet's one document with xdplbctl,
// starts BIRD, the Muxes (-etcd, -node) and the Host Agents (-etcd,
// -host), and returns once every node reports version 1 in etcd and runs
// it, both Muxes see every backend up (as the Host Agents publish it),
// the router routes the VIP over both Muxes, and every VM has answered
// through the VIP. Everything is removed at cleanup, also when the test
// fails.
func newEtcdFleetLab(t *testing.T) *etcdFleetLab { t.Helper(); return newEtcdFleetLabOf(t, nil) }

// newEtcdFleetLabOf is newEtcdFleetLab with edit applied to every
// document applied.
func newEtcdFleetLabOf(t *testing.T, edit func(*fleetlab.Doc)) *etcdFleetLab {
	t.Helper()
	lab := netlab.New(t, "etf")
	fleetlabtest.RequireBIRD(t, "the fleet's etcd tests")
	began := time.Now()
	l := &etcdFleetLab{fleetLab: &fleetLab{t: t, dir: t.TempDir(), edit: edit}, began: began}
	l.port.Store(10000 - 1)
	f, err := fleetlab.BuildFleet(lab, 1, append(slices.Clone(flVMs), flSpare))
	require.NoError(t, err)
	l.fleet, l.client, l.router = f, f.Clients[0], f.Router
	for name, n := range f.VMs {
		fleetlabtest.ServeVM(t, n, name, vmAddr(name), flDIPPort, 0)
	}
	l.etcd = startEtcdCluster(t, lab, l.dir, 3)
	l.ctlBin = filepath.Join(fleetlabtest.Build(t, "github.com/xdplb/xdplb/examples/xdplbctl"), "xdplbctl")
	l.apply(1, flVMs)

	l.bird = fleetlabtest.StartBIRD(t, l.router, fleetlab.FleetBIRD())
	bin := fleetlabtest.Examples(t)
	eps := strings.Join(l.etcd.cluster.Endpoints(), ",")
	for i := range l.muxes {
		l.muxes[i] = fleetlabtest.Start(t, f.Muxes[i], fmt.Sprintf("mux%d", i+1), filepath.Join(bin, "mux"),
			"-interface", "up", "-etcd", eps, "-node", fmt.Sprintf("mux%d", i+1), "-conns", "65536",
			"-metrics", net.JoinHostPort(fleetlab.FleetMuxAddr(i+1).String(), strconv.Itoa(flMetrics)))
	}
	for j := range l.agents {
		l.startEtcdAgent(j)
	}
	l.waitStatus(1)
	l.waitApplied(1)
	waitFor(t, "the router's ECMP route to the VIP over both Muxes", 30*time.Second, func() bool {
		return len(l.nextHops()) == 2
	})
	l.warm()
	l.logf("fleet ready from etcd (topology, etcd, builds, BGP, probes, a first answer from every VM)")
	return l
}

// startEtcdAgent starts the Host Agent of host j (from 0), with its
// document from etcd.
func (l *etcdFleetLab) startEtcdAgent(j int) {
	l.agents[j] = fleetlabtest.Start(l.t, l.fleet.Hosts[j], fmt.Sprintf("host%d", j+1), filepath.Join(fleetlabtest.Examples(l.t), "hostagent"),
		"-uplink", "up", "-host", fmt.Sprintf("host%d", j+1), "-etcd", strings.Join(l.etcd.cluster.Endpoints(), ","), "-conns", "65536",
		"-metrics", net.JoinHostPort(fleetlab.FleetHostAddr(j+1).String(), strconv.Itoa(flMetrics)))
}

// openStableConns opens k keep-alive connections, from new ports whose
// flows o1 and o4 send to the same backend, checks each is answered by
// it, and returns them and the VM each is on. The test's cleanup closes
// them.
func (l *etcdFleetLab) openStableConns(k int, o1, o4 *fleetOracle) ([]*flConn, []string) {
	t := l.t
	t.Helper()
	var conns []*flConn
	var dips []string
	perVM := map[string]int{}
	for len(conns) < k {
		p := l.nextPort()
		want := o1.pick(p)
		if o4.pick(p) != want {
			continue
		}
		c, err := l.dial(p, 10*time.Second)
		require.NoError(t, err, "connect from port %d", p)
		t.Cleanup(c.close)
		got, err := c.get(fmt.Sprintf("o%d", len(conns)), false, 10*time.Second)
		require.NoError(t, err, "first request from port %d", p)
		require.Equal(t, want, got, "connection from port %d: the library's pick", p)
		conns, dips = append(conns, c), append(dips, got)
		perVM[got]++
	}
	t.Logf("%d keep-alive connections per VM: %v", k, perVM)
	return conns, dips
}

// apply makes version v, with pool as the VIP's backends and the hosts'
// VMs, the fleet's document with xdplbctl apply.
func (l *etcdFleetLab) apply(v uint64, pool []fleetlab.VM) {
	t := l.t
	t.Helper()
	d := fleetlab.FleetShared(v, true, flServices, pool, nil)
	if l.edit != nil {
		l.edit(d)
	}
	text, err := d.Marshal()
	require.NoError(t, err)
	path := filepath.Join(l.dir, fmt.Sprintf("fleet-v%d.yaml", v))
	require.NoError(t, os.WriteFile(path, text, 0o644))
	out := l.ctl("apply", "-f", path)
	require.Contains(t, out, fmt.Sprintf("applied version %d ", v))
	l.version, l.pool = v, slices.Clone(pool)
}

// ctl runs xdplbctl with args against the cluster and returns its output;
// it fails the test unless xdplbctl succeeds.
func (l *etcdFleetLab) ctl(args ...string) string {
	t := l.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args = append([]string{"-etcd", strings.Join(l.etcd.cluster.Endpoints(), ","), "-timeout", "30s"}, args...)
	out, err := exec.CommandContext(ctx, l.ctlBin, args...).CombinedOutput()
	require.NoError(t, err, "xdplbctl %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// fleetNodes are the nodes' status keys: role/name.
var fleetNodes = []string{"hostagent/host1", "hostagent/host2", "mux/mux1", "mux/mux2"}

// waitStatus waits until etcd holds version v and every node reports it
// there, applied without error, its data path running.
func (l *etcdFleetLab) waitStatus(v uint64) {
	t := l.t
	t.Helper()
	var last string
	err := fleetlab.Poll(context.Background(), fmt.Sprintf("every node to report version %d in etcd", v), time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f, err := fleet.ReadStatus(ctx, l.etcd.cli, "")
		if err != nil {
			last = err.Error()
			return false
		}
		var got []string
		for _, n := range f.Nodes {
			got = append(got, fmt.Sprintf("%s/%s v%d %q %q", n.Role, n.Name, n.Version, n.DataPath, n.LastError))
		}
		last = strings.Join(got, "; ")
		if f.Document.Doc == nil || f.Document.Doc.Version != v || len(f.Nodes) != len(fleetNodes) {
			return false
		}
		for i, n := range f.Nodes {
			if n.Role+"/"+n.Name != fleetNodes[i] || n.Version != v || n.LastError != "" || n.DataPath != "running" {
				return false
			}
		}
		return true
	})
	require.NoError(t, err, "the nodes as etcd shows them: %s", last)
}

// requireRunning checks, without waiting, that every node runs version v
// from its metrics: every backend of the pool up on both Muxes, both Host
// Agents' data paths up.
func (l *etcdFleetLab) requireRunning(v uint64) {
	t := l.t
	t.Helper()
	for i, p := range l.muxes {
		require.False(t, p.Exited(), "mux%d exited", i+1)
		m, err := l.muxMetrics(i)
		require.NoError(t, err)
		require.Equal(t, float64(v), m["xdplb_config_version"], "mux%d's version", i+1)
		for _, vm := range l.pool {
			require.Equal(t, 1.0, m[backendUp(vm.Name)], "mux%d: %s up", i+1, vm.Name)
		}
	}
	for j, p := range l.agents {
		require.False(t, p.Exited(), "host%d's agent exited", j+1)
		m, err := l.agentMetrics(j)
		require.NoError(t, err)
		require.Equal(t, float64(v), m["xdplb_config_version"], "host%d's version", j+1)
		require.Equal(t, 1.0, m["xdplb_datapath_up"], "host%d's data path up", j+1)
	}
}

// requireHealthPublished checks that etcd holds every backend of the
// pool as up, as its host publishes it.
func (l *etcdFleetLab) requireHealthPublished() {
	t := l.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := fleet.ReadStatus(ctx, l.etcd.cli, "")
	require.NoError(t, err)
	r := fleet.Report(f, time.Now())
	require.Len(t, r.VIPs, 1)
	var up []string
	for _, b := range r.VIPs[0].Backends {
		require.Equal(t, "up", b.Health, "%s on %s, as published", b.Name, b.Host)
		up = append(up, b.Name)
	}
	require.Len(t, up, len(l.pool), "backends in the status: %v", up)
}

// stopNodes stops the Muxes and the Host Agents, all at once.
func (l *etcdFleetLab) stopNodes() {
	var wg sync.WaitGroup
	for _, p := range append(l.muxes[:], l.agents[:]...) {
		wg.Go(func() { p.Stop(fleetlabtest.StopGrace) })
	}
	wg.Wait()
}

// leaseLosses counts, per node, the times its log says it lost its etcd
// status lease.
func (l *etcdFleetLab) leaseLosses() map[string]int {
	m := map[string]int{}
	for _, p := range append(l.muxes[:], l.agents[:]...) {
		m[p.Name()] = strings.Count(p.Output(), "fleet: status lease lost")
	}
	return m
}

// etcdCluster is a cluster of etcd members, each a process of its own in
// a namespace of its own.
type etcdCluster struct {
	t       *testing.T
	cluster etcdlab.Cluster
	ns      []*netlab.NS
	procs   []*fleetlab.Proc
	exe     string
	cli     *clientv3.Client
}

// startEtcdCluster starts an n-member cluster under dir and returns once
// it answers.
func startEtcdCluster(t *testing.T, lab *netlab.Lab, dir string, n int) *etcdCluster {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	e := &etcdCluster{t: t, cluster: etcdlab.NewCluster(dir, n), exe: exe, procs: make([]*fleetlab.Proc, n)}
	for i := range n {
		ns, err := lab.Namespace(fmt.Sprintf("etcd%d", i+1))
		require.NoError(t, err)
		e.ns = append(e.ns, ns)
	}
	e.startAll()
	return e
}

// startAll starts every member (on the data it has, if any) and waits
// until the cluster answers; it connects e.cli.
func (e *etcdCluster) startAll() {
	t := e.t
	t.Helper()
	for i := range e.procs {
		e.procs[i] = fleetlabtest.StartWith(t, e.ns[i], fleetlab.ProcConfig{Name: e.cluster[i].Name, Path: e.exe,
			Args: []string{"-test.run=^TestEtcdMemberProcess$", "-test.count=1"},
			Env:  []string{e.cluster.MemberEnv(i)}})
	}
	cli, err := etcdlab.Client(e.cluster.Endpoints())
	require.NoError(t, err)
	e.cli = cli
	t.Cleanup(func() { cli.Close() })
	err = fleetlab.Poll(context.Background(), "the etcd cluster to answer", time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return etcdlab.Wait(ctx, cli) == nil || slices.ContainsFunc(e.procs, (*fleetlab.Proc).Exited)
	})
	require.NoError(t, err)
	for _, p := range e.procs {
		require.False(t, p.Exited(), "etcd member %s exited: %v\n%s", p.Name(), p.Err(), p.Output())
	}
}

// leader returns the index of the member that leads the cluster.
func (e *etcdCluster) leader() int {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, ep := range e.cluster.Endpoints() {
		s, err := e.cli.Status(ctx, ep)
		require.NoError(t, err, "status of %s", ep)
		if s.Leader == s.Header.MemberId {
			return i
		}
	}
	t.Fatal("no etcd member says it leads")
	return -1
}

// kill kills member i's process (SIGKILL) and waits for it to be gone.
func (e *etcdCluster) kill(i int) {
	p := e.procs[i]
	require.NoError(e.t, syscall.Kill(p.PID(), syscall.SIGKILL))
	<-p.Done()
}

// stop stops member i (SIGTERM) and waits for it to exit.
func (e *etcdCluster) stop(i int) {
	p := e.procs[i]
	require.NoError(e.t, p.Stop(30*time.Second), "etcd member %s stops cleanly", p.Name())
}

// leases returns the leases etcd holds.
func (e *etcdCluster) leases() []clientv3.LeaseID {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := e.cli.Leases(ctx)
	require.NoError(t, err)
	var ids []clientv3.LeaseID
	for _, l := range r.Leases {
		ids = append(ids, l.ID)
	}
	return ids
}

// waitLeasesGone waits until etcd holds none of the leases old.
func (e *etcdCluster) waitLeasesGone(old []clientv3.LeaseID) {
	e.t.Helper()
	waitFor(e.t, "the leases of before the outage to expire", time.Minute, func() bool {
		return !slices.ContainsFunc(e.leases(), func(id clientv3.LeaseID) bool { return slices.Contains(old, id) })
	})
}

// TestEtcdMemberProcess is no test: it is the process of one etcd member
// of TestFleetEtcdFaults, which runs this test binary with
// etcdlab.MemberEnv set. It serves until SIGTERM, or until the test that
// started it is gone.
func TestEtcdMemberProcess(t *testing.T) {
	if os.Getenv(etcdlab.MemberEnv) == "" {
		t.Skip("not a test: an etcd member process TestFleetEtcdFaults starts")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	require.NoError(t, etcdlab.RunMember(ctx, time.Minute, nil))
}

// newConns opens a new connection through the VIP every pace, each
// answered by whichever VM the running version picks, until finish.
type newConns struct {
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
	ok   atomic.Int64
	mu   sync.Mutex
	errs []error
}

func (l *etcdFleetLab) startNewConns(pace time.Duration) *newConns {
	c := &newConns{stop: make(chan struct{})}
	c.wg.Go(func() {
		for n := 0; ; n++ {
			select {
			case <-c.stop:
				return
			case <-time.After(pace):
			}
			p := l.nextPort()
			began := time.Now()
			if _, err := l.oneShot(p, fmt.Sprintf("n%d", n), 10*time.Second); err != nil {
				c.mu.Lock()
				c.errs = append(c.errs, fmt.Errorf("new connection from port %d begun %s: %w", p,
					began.UTC().Format("15:04:05.000"), err))
				c.mu.Unlock()
				continue
			}
			c.ok.Add(1)
		}
	})
	return c
}

// waitMore waits until n more new connections were answered, and fails
// the test on the failures so far.
func (c *newConns) waitMore(t *testing.T, n int64) {
	t.Helper()
	base := c.ok.Load()
	waitFor(t, fmt.Sprintf("%d more new connections answered", n), time.Minute, func() bool {
		return c.ok.Load() >= base+n || c.failed()
	})
	c.check(t)
}

func (c *newConns) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.errs) > 0
}

func (c *newConns) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	errs := c.errs
	c.errs = nil
	c.mu.Unlock()
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
}

// finish stops the new connections and fails the test on any failure.
func (c *newConns) finish(t *testing.T) {
	t.Helper()
	c.once.Do(func() { close(c.stop) })
	c.wg.Wait()
	c.check(t)
}
