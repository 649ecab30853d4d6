package bgp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/netlab"
)

// The BIRD tests put BIRD 2 (Debian package bird2) in a "router" namespace
// and one Announcer per "mux" namespace, each in a helper process (see
// helper_test.go), joined to the router by its own veth pair:
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

// birdConfig is the router's configuration. %s: the two Mux protocols.
const birdConfig = `
log stderr all;
router id 198.18.0.1;

protocol device {
	scan time 10;
}

# ECMP towards the Muxes: routes of equal BGP preference are merged into
# one multipath kernel route.
protocol kernel kernel4 {
	ipv4 { import none; export all; };
	merge paths on;
}
protocol kernel kernel6 {
	ipv6 { import none; export all; };
	merge paths on;
}

template bgp mux {
	local as 65000;
	hold time 9;
	connect delay time 1;
	connect retry time 1;
	error wait time 1, 5;
	# IPv4 and IPv6 unicast on every (IPv4) session: the Muxes announce
	# IPv6 VIPs with an IPv6 next hop over IPv4 transport.
	ipv4 { import all; export none; };
	ipv6 { import all; export none; };
}
%s`

type birdLab struct {
	lab    *netlab.Lab
	router *netlab.NS
	sock   string
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

func requireBIRD(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"bird", "birdc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not found: install BIRD 2 (Debian/Ubuntu package bird2) to run the router tests", bin)
		}
	}
}

func newBirdLab(t *testing.T) *birdLab {
	t.Helper()
	lab := netlab.New(t, "bgp")
	requireBIRD(t)
	router, err := lab.Namespace("router")
	require.NoError(t, err)
	bl := &birdLab{lab: lab, router: router}
	var protocols strings.Builder
	for i, m := range muxSpecs {
		ns, err := lab.Namespace(m.name)
		require.NoError(t, err)
		bl.muxNS[i] = ns
		rif := fmt.Sprintf("m%d", i+1)
		_, _, err = lab.Veth(router, rif, ns, "up")
		require.NoError(t, err)
		n := i + 1
		require.NoError(t, router.AddAddr(rif, fmt.Sprintf("198.18.%d.1/24", n)))
		require.NoError(t, router.AddAddr(rif, fmt.Sprintf("2001:db8:%d::1/64", n)))
		require.NoError(t, ns.AddAddr("up", m.addr4.String()+"/24"))
		require.NoError(t, ns.AddAddr("up", m.addr6.String()+"/64"))
		fmt.Fprintf(&protocols, "protocol bgp %s from mux {\n\tneighbor %s as %d;\n}\n", m.protocol, m.addr4, muxASN)
	}

	dir := t.TempDir()
	conf := filepath.Join(dir, "bird.conf")
	bl.sock = filepath.Join(dir, "bird.ctl")
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf(birdConfig, protocols.String())), 0o644))
	out, err := exec.Command("bird", "-p", "-c", conf).CombinedOutput()
	require.NoError(t, err, "bird -p (parse only): %s", out)

	var logs syncBuffer
	cmd := router.Command(context.Background(), "bird", "-f", "-c", conf, "-s", bl.sock)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		stopOrKill(cmd, 10*time.Second)
		t.Logf("BIRD log:\n%s", logs.String())
	})
	eventually(t, "BIRD control socket", func() bool {
		_, err := bl.birdc("show status")
		return err == nil
	})
	return bl
}

// birdc runs a BIRD client command.
func (bl *birdLab) birdc(args string) (string, error) {
	out, err := exec.Command("birdc", append([]string{"-s", bl.sock}, strings.Fields(args)...)...).CombinedOutput()
	return string(out), err
}

// protocolState returns the BGP state BIRD shows for a protocol
// ("Established", "Active", "Connect", ...).
func (bl *birdLab) protocolState(t *testing.T, name string) string {
	t.Helper()
	out, err := bl.birdc("show protocols " + name)
	require.NoError(t, err, out)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[0] == name {
			return f[len(f)-1]
		}
	}
	return ""
}

// nextHops returns the gateways of the router namespace's kernel route to
// p, sorted; nil when there is no route.
func (bl *birdLab) nextHops(t *testing.T, p netip.Prefix) []netip.Addr {
	t.Helper()
	family := netlink.FAMILY_V4
	if p.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	routes, err := bl.router.Netlink().RouteListFiltered(family, &netlink.Route{Table: syscall.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	require.NoError(t, err)
	var gws []netip.Addr
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		a, _ := netip.AddrFromSlice(r.Dst.IP)
		if netip.PrefixFrom(a.Unmap(), ones) != p {
			continue
		}
		add := func(ip net.IP) {
			if g, ok := netip.AddrFromSlice(ip); ok {
				gws = append(gws, g.Unmap())
			}
		}
		if r.Gw != nil {
			add(r.Gw)
		}
		for _, nh := range r.MultiPath {
			add(nh.Gw)
		}
	}
	slices.SortFunc(gws, netip.Addr.Compare)
	return gws
}

// waitNextHops polls the kernel table (every millisecond) until the route
// to p has exactly want as next hops, and returns when it saw that. The
// deadline only guards against a hang.
func (bl *birdLab) waitNextHops(t *testing.T, p netip.Prefix, want ...netip.Addr) time.Time {
	t.Helper()
	slices.SortFunc(want, netip.Addr.Compare)
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := bl.nextHops(t, p)
		if slices.Equal(got, want) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			out, _ := bl.birdc("show route all")
			t.Fatalf("route %v: next hops %v, want %v\nBIRD routes:\n%s", p, got, want, out)
		}
		time.Sleep(time.Millisecond)
	}
}

// muxProc is a helper process running one Announcer in a Mux namespace.
type muxProc struct {
	t      *testing.T
	spec   muxSpec
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr syncBuffer
}

func (bl *birdLab) startMux(t *testing.T, i int) *muxProc {
	t.Helper()
	m := muxSpecs[i]
	cfg := Config{
		ASN:           muxASN,
		RouterID:      m.addr4,
		ListenPort:    179,
		HoldTime:      9 * time.Second,
		ConnectRetry:  time.Second,
		WithdrawGrace: time.Hour, // the test ends it with "cancel"
		NextHop6:      m.addr6,
		Peers:         []Peer{{Address: m.router4, ASN: routerASN}},
	}
	js, err := json.Marshal(cfg)
	require.NoError(t, err)
	exe, err := os.Executable()
	require.NoError(t, err)

	p := &muxProc{t: t, spec: m, lines: make(chan string, 16)}
	p.cmd = bl.muxNS[i].Command(context.Background(), exe, "-test.run=^$")
	p.cmd.Env = append(os.Environ(), helperEnv+"=1", helperConfigEnv+"="+string(js))
	p.cmd.Stderr = &p.stderr
	p.stdin, err = p.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = p.stdin.Close() // the helper shuts down and exits
		stopOrKill(p.cmd, 30*time.Second)
		t.Logf("%s log:\n%s", m.name, p.stderr.String())
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
				p.t.Fatalf("%s: helper exited; log:\n%s", p.spec.name, p.stderr.String())
			}
			for _, pre := range prefixes {
				if strings.HasPrefix(line, pre) {
					return line
				}
			}
		case <-timeout:
			p.t.Fatalf("%s: no %v answer; log:\n%s", p.spec.name, prefixes, p.stderr.String())
		}
	}
}

func stopOrKill(cmd *exec.Cmd, grace time.Duration) {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
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
