package bgp

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// The BIRD tests put BIRD 2 (Debian package bird2) in a "router" namespace
// and one Announcer per "mux" namespace, each in a helper process (see
// helper_test.go), joined to the router by its own veth pair (a
// fleetlab.Star):
//
//	mux1 [up 198.18.1.2/24 2001:db8:1::2/64] ── [m1 198.18.1.1/24 2001:db8:1::1/64]
//	                                                          router (BIRD, AS 65000)
//	mux2 [up 198.18.2.2/24 2001:db8:2::2/64] ── [m2 198.18.2.1/24 2001:db8:2::1/64]
//
// Both Muxes are AS 65010 and peer with BIRD over IPv4 only; IPv6 VIPs
// travel over those sessions (MP-BGP) with the Mux's IPv6 address on the
// link as next hop (Config.NextHop6). BIRD exports its best routes to the
// router namespace's kernel table with "merge paths on", so a VIP announced
// by both Muxes becomes one ECMP route with two next hops. The tests read
// that kernel table through netlink and BIRD's view through birdc.

type birdLab struct {
	lab    *netlab.Lab
	router *netlab.NS
	bird   *fleetlab.BIRD
	muxNS  [2]*netlab.NS
}

type muxSpec struct {
	name     string
	addr4    netip.Addr // on the link to the router
	addr6    netip.Addr
	router4  netip.Addr
	protocol string // BIRD protocol name
}

var muxSpecs = [2]muxSpec{
	{"mux1", netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("2001:db8:1::2"), netip.MustParseAddr("198.18.1.1"), "mux1"},
	{"mux2", netip.MustParseAddr("198.18.2.2"), netip.MustParseAddr("2001:db8:2::2"), netip.MustParseAddr("198.18.2.1"), "mux2"},
}

func newBirdLab(t *testing.T) *birdLab {
	t.Helper()
	lab := netlab.New(t, "bgp")
	fleetlabtest.RequireBIRD(t, "the router tests")
	star, err := fleetlab.NewStar(lab)
	require.NoError(t, err)
	bl := &birdLab{lab: lab, router: star.Router}
	// IPv4 and IPv6 unicast on every (IPv4) session: the Muxes announce
	// IPv6 VIPs with an IPv6 next hop over IPv4 transport.
	cfg := fleetlab.BIRDConfig{RouterID: netip.MustParseAddr("198.18.0.1"), ASN: routerASN, IPv6: true}
	for i, m := range muxSpecs {
		rif := fmt.Sprintf("m%d", i+1)
		ns, err := star.Attach(m.name, rif, i+1)
		require.NoError(t, err)
		bl.muxNS[i] = ns
		require.NoError(t, star.Router.AddAddr(rif, fmt.Sprintf("2001:db8:%d::1/64", i+1)))
		require.NoError(t, ns.AddAddr("up", m.addr6.String()+"/64"))
		cfg.Peers = append(cfg.Peers, fleetlab.BIRDPeer{Name: m.protocol, Addr: m.addr4, ASN: muxASN})
	}
	bl.bird = fleetlabtest.StartBIRD(t, bl.router, cfg)
	return bl
}

// birdc runs a BIRD client command.
func (bl *birdLab) birdc(args string) (string, error) { return bl.bird.Birdc(args) }

// protocolState returns the BGP state BIRD shows for a protocol
// ("Established", "Active", "Connect", ...).
func (bl *birdLab) protocolState(t *testing.T, name string) string {
	t.Helper()
	state, err := bl.bird.ProtocolState(name)
	require.NoError(t, err)
	return state
}

// nextHops returns the gateways of the router namespace's kernel route to
// p, sorted; nil when there is no route.
func (bl *birdLab) nextHops(t *testing.T, p netip.Prefix) []netip.Addr {
	t.Helper()
	return fleetlabtest.NextHops(t, bl.router, p)
}

// waitNextHops polls the kernel table (every millisecond) until the route
// to p has exactly want as next hops, and returns when it saw that. The
// deadline only guards against a hang.
func (bl *birdLab) waitNextHops(t *testing.T, p netip.Prefix, want ...netip.Addr) time.Time {
	t.Helper()
	return fleetlabtest.WaitNextHops(t, bl.router, bl.bird, 60*time.Second, p, want...)
}

// muxProc is a helper process running one Announcer in a Mux namespace.
type muxProc struct {
	t     *testing.T
	spec  muxSpec
	proc  *fleetlab.Proc // its output is its stderr: the log
	stdin io.WriteCloser
	lines chan string
}

func (bl *birdLab) startMux(t *testing.T, i int) *muxProc {
	t.Helper()
	m := muxSpecs[i]
	return startHelper(t, bl.muxNS[i], m, Config{
		ASN:           muxASN,
		RouterID:      m.addr4,
		ListenPort:    179,
		HoldTime:      9 * time.Second,
		ConnectRetry:  time.Second,
		WithdrawGrace: time.Hour, // the test ends it with "cancel"
		NextHop6:      m.addr6,
		Peers:         []Peer{{Address: m.router4, ASN: routerASN}},
	})
}

// startHelper starts a helper process running an Announcer with cfg in
// namespace ns; m names it (m.name) in failures and logs.
func startHelper(t *testing.T, ns *netlab.NS, m muxSpec, cfg Config) *muxProc {
	t.Helper()
	js, err := json.Marshal(cfg)
	require.NoError(t, err)
	exe, err := os.Executable()
	require.NoError(t, err)

	// Pipes of the kernel's, handed to the helper as they are: it sees the
	// end of its input when the test closes stdin, and the test the end of
	// the helper's output when it exits.
	stdinR, stdinW, err := os.Pipe()
	require.NoError(t, err)
	stdoutR, stdoutW, err := os.Pipe()
	require.NoError(t, err)
	p := &muxProc{t: t, spec: m, stdin: stdinW, lines: make(chan string, 16)}
	p.proc, err = fleetlab.StartProc(ns, fleetlab.ProcConfig{
		Name: m.name,
		Path: exe,
		Args: []string{"-test.run=^$"},
		// Plain TCP listeners, as a Mux using TCP-MD5 or GTSM needs
		// (ErrMultipathTCP).
		Env:    []string{helperEnv + "=1", helperConfigEnv + "=" + string(js), "GODEBUG=multipathtcp=0"},
		Stdin:  stdinR,
		Stdout: stdoutW,
	})
	stdinR.Close()
	stdoutW.Close()
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		require.NoError(t, err)
	}
	go func() {
		defer stdoutR.Close()
		sc := bufio.NewScanner(stdoutR)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = p.stdin.Close() // the helper shuts down and exits
		p.proc.Wait(30 * time.Second)
		t.Logf("%s log:\n%s", m.name, p.proc.Output())
	})
	return p
}

// do sends one command and returns the detail of its "ok" answer.
func (p *muxProc) do(command string) string {
	p.t.Helper()
	_, err := fmt.Fprintln(p.stdin, command)
	require.NoError(p.t, err)
	line := p.next("ok", "err")
	require.True(p.t, strings.HasPrefix(line, "ok"), "%s: %q: %s", p.spec.name, command, line)
	return strings.TrimSpace(strings.TrimPrefix(line, "ok"))
}

// doAt is do for commands whose answer is the wall-clock time at which the
// helper made the call.
func (p *muxProc) doAt(command string) time.Time {
	p.t.Helper()
	ns, err := strconv.ParseInt(p.do(command), 10, 64)
	require.NoError(p.t, err)
	return time.Unix(0, ns)
}

// next returns the next output line that starts with one of prefixes.
func (p *muxProc) next(prefixes ...string) string {
	p.t.Helper()
	timeout := time.After(90 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("%s: helper exited; log:\n%s", p.spec.name, p.proc.Output())
			}
			for _, pre := range prefixes {
				if strings.HasPrefix(line, pre) {
					return line
				}
			}
		case <-timeout:
			p.t.Fatalf("%s: no %v answer; log:\n%s", p.spec.name, prefixes, p.proc.Output())
		}
	}
}

// TestBIRD runs the Announcer against BIRD 2 as the router: a VIP learned
// from one Mux, ECMP over two, Sync withdrawing, an IPv6 VIP over IPv4
// sessions, Drain, and Shutdown withdrawing before the session closes. It
// logs (never asserts) how long each change took to reach the router's
// kernel table.
func TestBIRD(t *testing.T) {
	bl := newBirdLab(t)
	vip4 := netip.MustParsePrefix("198.18.100.1/32")
	vip6 := netip.MustParsePrefix("2001:db8:100::1/128")
	hop4 := func(i int) netip.Addr { return muxSpecs[i].addr4 }
	hop6 := func(i int) netip.Addr { return muxSpecs[i].addr6 }
	report := func(what string, from, to time.Time) {
		t.Logf("reaction time: %-52s %8.2f ms", what, float64(to.Sub(from).Microseconds())/1000)
	}

	mux1 := bl.startMux(t, 0)
	mux1.do("start")
	mux1.do("wait")
	require.Equal(t, "Established", bl.protocolState(t, "mux1"))

	t.Run("LearnFromOneMux", func(t *testing.T) {
		at := mux1.doAt("sync " + vip4.String())
		seen := bl.waitNextHops(t, vip4, hop4(0))
		report("announce (mux1 Sync) → kernel route", at, seen)
		out, err := bl.birdc("show route for " + vip4.Addr().String() + " all")
		require.NoError(t, err)
		require.Contains(t, out, "mux1")
		require.Contains(t, out, "BGP.as_path: 65010")
		t.Logf("birdc show route for %v all:\n%s", vip4.Addr(), out)
	})

	mux2 := bl.startMux(t, 1)
	mux2.do("start")
	mux2.do("wait")

	t.Run("ECMPOverTwoMuxes", func(t *testing.T) {
		mux1.do("sync " + vip4.String() + " " + vip6.String())
		at := mux2.doAt("sync " + vip4.String() + " " + vip6.String())
		seen := bl.waitNextHops(t, vip4, hop4(0), hop4(1))
		report("second next hop (mux2 Sync) → ECMP kernel route", at, seen)
		// IPv6 VIP over the IPv4 sessions, next hops the Muxes' IPv6
		// addresses on the links.
		bl.waitNextHops(t, vip6, hop6(0), hop6(1))
		out, _ := exec.Command("ip", "-n", bl.router.Name(), "route", "show", vip4.String()).CombinedOutput()
		t.Logf("ip route show %v:\n%s", vip4, out)
		out, _ = exec.Command("ip", "-n", bl.router.Name(), "-6", "route", "show", vip6.String()).CombinedOutput()
		t.Logf("ip -6 route show %v:\n%s", vip6, out)
	})

	t.Run("SyncWithdraws", func(t *testing.T) {
		at := mux2.doAt("sync " + vip6.String())
		seen := bl.waitNextHops(t, vip4, hop4(0))
		report("withdraw one of two (mux2 Sync) → ECMP shrinks", at, seen)
		at = mux1.doAt("sync " + vip6.String())
		seen = bl.waitNextHops(t, vip4)
		report("withdraw the last (mux1 Sync) → route gone", at, seen)
		at = mux1.doAt("sync " + vip4.String() + " " + vip6.String())
		seen = bl.waitNextHops(t, vip4, hop4(0))
		report("re-announce (mux1 Sync) → kernel route", at, seen)
		mux2.do("sync " + vip4.String() + " " + vip6.String())
		bl.waitNextHops(t, vip4, hop4(0), hop4(1))
	})

	t.Run("Drain", func(t *testing.T) {
		at := mux1.doAt("drain")
		seen := bl.waitNextHops(t, vip4, hop4(1))
		report("drain (mux1) → ECMP shrinks", at, seen)
		bl.waitNextHops(t, vip6, hop6(1))
		require.Equal(t, "Established", bl.protocolState(t, "mux1"), "drain keeps the session")
		at = mux1.doAt("resume")
		seen = bl.waitNextHops(t, vip4, hop4(0), hop4(1))
		report("resume (mux1) → ECMP grows", at, seen)
		bl.waitNextHops(t, vip6, hop6(0), hop6(1))
	})

	t.Run("ShutdownWithdrawsFirst", func(t *testing.T) {
		at := mux2.doAt("shutdown")
		seen := bl.waitNextHops(t, vip4, hop4(0))
		report("Shutdown (mux2) withdraw → ECMP shrinks", at, seen)
		bl.waitNextHops(t, vip6, hop6(0))
		// The routes left while the session is still up: BIRD saw a
		// withdrawal, not a session loss. The grace period only ends when
		// the test cancels it.
		require.Equal(t, "Established", bl.protocolState(t, "mux2"), "session must outlive the withdrawal")
		at = mux2.doAt("cancel")
		require.Equal(t, "shutdown-done bgp: shutdown: grace period cut short: context canceled", mux2.next("shutdown-done"))
		var down time.Time
		eventually(t, "BIRD sees mux2's session close", func() bool {
			down = time.Now()
			return bl.protocolState(t, "mux2") != "Established"
		})
		report("grace cut → BIRD session no longer Established", at, down)
		require.Equal(t, []netip.Addr{hop4(0)}, bl.nextHops(t, vip4), "mux1 still carries the VIP")
	})
}
