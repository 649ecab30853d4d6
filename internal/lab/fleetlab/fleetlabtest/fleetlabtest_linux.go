package fleetlabtest

import (
	"context"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// StopGrace is how long a process may take to exit after SIGTERM at a
// test's cleanup before it is killed.
const StopGrace = 15 * time.Second

// RequireBIRD skips the test unless BIRD 2 (bird and birdc) is installed;
// what says what the test runs, for the skip message.
func RequireBIRD(tb testing.TB, what string) {
	tb.Helper()
	if err := fleetlab.HaveBIRD(); err != nil {
		tb.Skipf("%v to run %s", err, what)
	}
}

// Start runs the program at path in n with its output captured; the
// test's cleanup stops it (Proc.Stop with StopGrace) and logs its output
// when the test failed or runs verbosely.
func Start(tb testing.TB, n *netlab.NS, name, path string, args ...string) *fleetlab.Proc {
	tb.Helper()
	return StartWith(tb, n, fleetlab.ProcConfig{Name: name, Path: path, Args: args})
}

// StartWith is Start for a full ProcConfig.
func StartWith(tb testing.TB, n *netlab.NS, cfg fleetlab.ProcConfig) *fleetlab.Proc {
	tb.Helper()
	p, err := fleetlab.StartProc(n, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { stopAndLog(tb, p) })
	return p
}

func stopAndLog(tb testing.TB, p *fleetlab.Proc) {
	p.Stop(StopGrace)
	if tb.Failed() || testing.Verbose() {
		tb.Logf("%s log:\n%s", p.Name(), p.Output())
	}
}

// StartBIRD starts BIRD in n with cfg (fleetlab.StartBIRD, files in a
// temporary directory of the test) and waits until birdc can reach it.
// The test's cleanup stops it and logs its output as Start does.
func StartBIRD(tb testing.TB, n *netlab.NS, cfg fleetlab.BIRDConfig) *fleetlab.BIRD {
	tb.Helper()
	b, err := fleetlab.StartBIRD(n, tb.TempDir(), cfg, fleetlab.ProcConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { stopAndLog(tb, b.Proc) })
	if err := b.WaitReady(context.Background(), 30*time.Second); err != nil {
		tb.Fatal(err)
	}
	return b
}

// Build builds the main packages pkgs (fleetlab.GoBuild) into a temporary
// directory of the test and returns it.
func Build(tb testing.TB, pkgs ...string) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := fleetlab.GoBuild(dir, pkgs...); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// examples holds the binaries Examples built, for all the tests of the
// binary; Main removes them.
var examples struct {
	once sync.Once
	dir  string
	err  error
}

// Examples builds examples/mux, examples/hostagent and examples/xdplbctl
// on first use (one go build: they share most of their packages) and
// returns the directory holding them (as mux, hostagent and xdplbctl).
func Examples(tb testing.TB) string {
	tb.Helper()
	examples.once.Do(func() {
		examples.dir, examples.err = os.MkdirTemp("", "xdplb-e2e-")
		if examples.err == nil {
			examples.err = fleetlab.GoBuild(examples.dir, fleetlab.MuxPackage, fleetlab.HostAgentPackage, fleetlab.XdplbctlPackage)
		}
	})
	if examples.err != nil {
		tb.Fatal(examples.err)
	}
	return examples.dir
}

// Main runs the tests and removes the binaries Examples built; call it
// from TestMain: os.Exit(fleetlabtest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if examples.dir != "" {
		os.RemoveAll(examples.dir)
	}
	return code
}

// WaitFor polls cond until it holds (fleetlab.Poll); after limit, a hang
// guard and no timing check, it fails the test.
func WaitFor(tb testing.TB, what string, limit time.Duration, cond func() bool) {
	tb.Helper()
	if err := fleetlab.Poll(context.Background(), what, limit, cond); err != nil {
		tb.Fatal(err)
	}
}

// WaitNextHops polls the kernel table of router (every millisecond) until
// its route to p has exactly want as next hops, and returns when it saw
// that: the time a test reports. After limit (a hang guard) it fails the
// test, with BIRD's protocols and routes when bird is not nil.
func WaitNextHops(tb testing.TB, router *netlab.NS, bird *fleetlab.BIRD, limit time.Duration, p netip.Prefix, want ...netip.Addr) time.Time {
	tb.Helper()
	slices.SortFunc(want, netip.Addr.Compare)
	deadline := time.Now().Add(limit)
	for {
		got := NextHops(tb, router, p)
		if slices.Equal(got, want) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			var proto, routes string
			if bird != nil {
				proto, _ = bird.Birdc("show protocols")
				routes, _ = bird.Birdc("show route all")
			}
			tb.Fatalf("router route %v: next hops %v, want %v\nBIRD protocols:\n%s\nBIRD routes:\n%s", p, got, want, proto, routes)
		}
		time.Sleep(time.Millisecond)
	}
}

// NextHops returns the next hops of router's route to p
// (fleetlab.NextHops).
func NextHops(tb testing.TB, router *netlab.NS, p netip.Prefix) []netip.Addr {
	tb.Helper()
	hops, err := fleetlab.NextHops(router, p)
	if err != nil {
		tb.Fatal(err)
	}
	return hops
}

// Scrape reads a /metrics endpoint from inside n (fleetlab.Scrape).
func Scrape(tb testing.TB, n *netlab.NS, addr netip.AddrPort) map[string]float64 {
	tb.Helper()
	m, err := fleetlab.Scrape(n, addr)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

// LinkStats returns the kernel's counters of interface ifname in n.
func LinkStats(tb testing.TB, n *netlab.NS, ifname string) netlink.LinkStatistics {
	tb.Helper()
	s, err := fleetlab.LinkStats(n, ifname)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// ServeVM starts a VM's servers (fleetlab.ServeVM) until the test ends.
func ServeVM(tb testing.TB, n *netlab.NS, name string, addr netip.Addr, httpPort, echoPort uint16) {
	tb.Helper()
	s, err := fleetlab.ServeVM(n, name, addr, httpPort, echoPort)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
}

// WriteDocument writes d to path, replacing the file atomically (the
// nodes' watchers see a rename).
func WriteDocument(tb testing.TB, path string, d *fleetlab.Doc) {
	tb.Helper()
	if err := fleetlab.WriteDocument(path, d); err != nil {
		tb.Fatal(err)
	}
}
