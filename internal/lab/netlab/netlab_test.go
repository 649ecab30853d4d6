//go:build linux

package netlab

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// testPrefix returns a prefix no other run uses, so Leftovers(prefix) sees
// only what this test made.
func testPrefix(t *testing.T) string {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("t%06x", b[:])[:7]
}

func testCtx(t *testing.T) context.Context {
	// A deadline so a broken topology fails the test instead of hanging it;
	// it is not a performance assertion.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSkipReason(t *testing.T) {
	const all = 1<<capNetAdmin | 1<<capSysAdmin
	tests := []struct {
		name string
		env  privEnv
		skip bool
	}{
		{"root with caps", privEnv{euid: 0, capEff: all, capKnown: true, netns: true}, false},
		{"root, caps unknown", privEnv{euid: 0, netns: true}, false},
		{"user, caps unknown", privEnv{euid: 1000, netns: true}, true},
		{"user without caps", privEnv{euid: 1000, capKnown: true, netns: true}, true},
		{"user with both caps", privEnv{euid: 1000, capEff: all, capKnown: true, netns: true}, false},
		{"only CAP_NET_ADMIN", privEnv{euid: 1000, capEff: 1 << capNetAdmin, capKnown: true, netns: true}, true},
		{"root in a container without CAP_SYS_ADMIN", privEnv{euid: 0, capEff: 1 << capNetAdmin, capKnown: true, netns: true}, true},
		{"no netns support", privEnv{euid: 0, capEff: all, capKnown: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := skipReason(tt.env)
			assert.Equal(t, tt.skip, r != "", "reason %q", r)
		})
	}
}

func TestParseCapEff(t *testing.T) {
	status := "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\nCapBnd:\t0\n"
	c, ok := parseCapEff([]byte(status))
	require.True(t, ok)
	assert.Equal(t, uint64(0x1fffeffffff), c)
	_, ok = parseCapEff([]byte("Name:\tx\n"))
	assert.False(t, ok)
}

func TestRequireRootTakesSkipPathWithoutPrivileges(t *testing.T) {
	// The decision RequireRoot makes for an unprivileged user: skip, and the
	// message says why and what to do.
	r := skipReason(privEnv{euid: 1000, capKnown: true, netns: true})
	require.NotEmpty(t, r)
	assert.Contains(t, SkipMessage, "run as root")
	assert.Contains(t, r, "CAP_NET_ADMIN")
}

func TestCheckPrefix(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{"198.18.0.1/24", true},
		{"198.19.255.255/32", true},
		{"198.18.0.0/15", true},
		{"198.18.0.1/14", false}, // subnet covers real addresses
		{"198.20.0.1/24", false},
		{"10.0.0.1/8", false},
		{"0.0.0.0/0", false},
		{"2001:db8::1/64", true},
		{"2001:db8::/32", true},
		{"2001:db8::1/31", false},
		{"2001:db9::1/64", false},
		{"::/0", false},
		{"198.18.0.1", true}, // a bare address is a host prefix
		{"::ffff:198.18.0.1", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := parseTestPrefix(tt.in)
			if tt.ok {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrOutsideTestRange)
			}
		})
	}
	assert.NoError(t, CheckAddr(netip.MustParseAddr("::ffff:198.18.0.1")), "a mapped v4 address is its v4 address")
	assert.ErrorIs(t, CheckAddr(netip.Addr{}), ErrOutsideTestRange)
}

func TestSysctlPath(t *testing.T) {
	p, err := sysctlPath("net.ipv4.ip_forward")
	require.NoError(t, err)
	assert.Equal(t, "/proc/sys/net/ipv4/ip_forward", p)
	p, err = sysctlPath("net/ipv4/conf/eth0.5/rp_filter")
	require.NoError(t, err)
	assert.Equal(t, "/proc/sys/net/ipv4/conf/eth0.5/rp_filter", p)
	for _, bad := range []string{"kernel.panic", "vm.swappiness", "net/../kernel/panic"} {
		_, err := sysctlPath(bad)
		assert.Error(t, err, bad)
	}
}

func TestRunID(t *testing.T) {
	for _, pid := range []int{1, 35, 36, 4194304} {
		pid2, ok := ownerPID(runID(pid))
		require.True(t, ok)
		assert.Equal(t, pid, pid2)
	}
	_, ok := ownerPID("x")
	assert.False(t, ok)
}

func TestNamesAreValidated(t *testing.T) {
	_, err := NewStandalone("Bad-Prefix")
	assert.Error(t, err)
	_, err = NewStandalone("waytoolongprefix")
	assert.Error(t, err)
	l, err := NewStandalone("ok")
	require.NoError(t, err)
	_, err = l.Namespace("has space")
	assert.Error(t, err)
	require.NoError(t, l.Close())
}

// pair builds two namespaces joined by a veth pair with one IPv4 and one
// IPv6 address on each end.
func pair(t *testing.T, l *Lab) (a, b *NS, la, lb *Link) {
	t.Helper()
	a, err := l.Namespace("a")
	require.NoError(t, err)
	b, err = l.Namespace("b")
	require.NoError(t, err)
	la, lb, err = l.Veth(a, "eth0", b, "eth0")
	require.NoError(t, err)
	require.NoError(t, a.AddAddr("eth0", "198.18.0.1/24"))
	require.NoError(t, b.AddAddr("eth0", "198.18.0.2/24"))
	require.NoError(t, a.AddAddr("eth0", "2001:db8::1/64"))
	require.NoError(t, b.AddAddr("eth0", "2001:db8::2/64"))
	return a, b, la, lb
}

func TestVethPair(t *testing.T) {
	l := New(t, testPrefix(t))
	ctx := testCtx(t)
	a, b, la, lb := pair(t, l)

	// The link values describe the real interfaces.
	for _, lk := range []*Link{la, lb} {
		got, err := lk.NS.Link(lk.Name)
		require.NoError(t, err)
		assert.Equal(t, lk.Index, got.Attrs().Index)
		assert.Equal(t, lk.MAC, got.Attrs().HardwareAddr)
		assert.Equal(t, "veth", got.Type())
		assert.NotZero(t, got.Attrs().Flags&net.FlagUp, "link is up")
	}
	assert.Equal(t, "a", a.String())
	assert.True(t, strings.HasSuffix(a.Name(), "-a"))
	assert.Equal(t, NetnsDir+"/"+a.Name(), a.Path())

	for _, tc := range []struct{ name, server, client string }{
		{"udp4", "198.18.0.2:7", "198.18.0.1"},
		{"udp6", "[2001:db8::2]:7", "2001:db8::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := b.ListenPacket(ctx, "udp", tc.server)
			require.NoError(t, err)
			defer pc.Close()
			go func() { // echo one datagram
				buf := make([]byte, 64)
				n, from, err := pc.ReadFrom(buf)
				if err == nil {
					_, _ = pc.WriteTo(buf[:n], from)
				}
			}()
			c, err := a.Dial(ctx, "udp", tc.server)
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
			_, err = c.Write([]byte("ping"))
			require.NoError(t, err)
			buf := make([]byte, 64)
			n, err := c.Read(buf)
			require.NoError(t, err)
			assert.Equal(t, "ping", string(buf[:n]))
			assert.Equal(t, tc.client, c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().String())
		})
	}

	t.Run("tcp", func(t *testing.T) {
		tcpEcho(t, ctx, a, b, "198.18.0.2:80", "198.18.0.1")
	})

	t.Run("namespaces are separate", func(t *testing.T) {
		// The caller's namespace has none of the lab's addresses (checked
		// locally: a test never sends a packet outside the lab).
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		require.NoError(t, err)
		for _, a := range addrs {
			assert.Error(t, CheckAddr(netip.MustParseAddr(a.IP.String())), "host has lab address %v", a.IP)
		}
	})
}

// tcpEcho serves one echo connection in srv on addr, connects from cli and
// checks the data and that the server saw the client's own address.
func tcpEcho(t *testing.T, ctx context.Context, cli, srv *NS, addr, wantPeer string) {
	t.Helper()
	ln, err := srv.Listen(ctx, "tcp", addr)
	require.NoError(t, err)
	defer ln.Close()
	peer := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			peer <- err.Error()
			return
		}
		defer c.Close()
		peer <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().String()
		_, _ = io.Copy(c, c)
	}()
	c, err := cli.Dial(ctx, "tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = fmt.Fprintln(c, "hello across namespaces")
	require.NoError(t, err)
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "hello across namespaces\n", line)
	assert.Equal(t, wantPeer, <-peer)
}

func TestRoutedTopology(t *testing.T) {
	l := New(t, testPrefix(t))
	ctx := testCtx(t)
	client, err := l.Namespace("client")
	require.NoError(t, err)
	router, err := l.Namespace("router")
	require.NoError(t, err)
	server, err := l.Namespace("server")
	require.NoError(t, err)
	_, _, err = l.Veth(client, "eth0", router, "toclient")
	require.NoError(t, err)
	_, _, err = l.Veth(router, "toserver", server, "eth0")
	require.NoError(t, err)

	steps := []error{
		client.AddAddr("eth0", "198.18.1.2/24"),
		client.AddAddr("eth0", "2001:db8:1::2/64"),
		router.AddAddr("toclient", "198.18.1.1/24"),
		router.AddAddr("toclient", "2001:db8:1::1/64"),
		router.AddAddr("toserver", "198.18.2.1/24"),
		router.AddAddr("toserver", "2001:db8:2::1/64"),
		server.AddAddr("eth0", "198.18.2.2/24"),
		server.AddAddr("eth0", "2001:db8:2::2/64"),
		client.AddRoute("198.18.2.0/24", "198.18.1.1"),
		client.AddRoute("2001:db8:2::/64", "2001:db8:1::1"),
		server.AddRoute("198.18.1.0/24", "198.18.2.1"),
		server.AddRoute("2001:db8:1::/64", "2001:db8:2::1"),
		router.SetSysctl("net.ipv4.ip_forward", "1"),
		router.SetSysctl("net.ipv6.conf.all.forwarding", "1"),
	}
	for i, err := range steps {
		require.NoError(t, err, "step %d", i)
	}

	// Sysctls are per namespace.
	v, err := router.Sysctl("net.ipv4.ip_forward")
	require.NoError(t, err)
	assert.Equal(t, "1", v)
	v, err = client.Sysctl("net.ipv4.ip_forward")
	require.NoError(t, err)
	assert.Equal(t, "0", v)

	t.Run("tcp4", func(t *testing.T) { tcpEcho(t, ctx, client, server, "198.18.2.2:8080", "198.18.1.2") })
	t.Run("tcp6", func(t *testing.T) { tcpEcho(t, ctx, client, server, "[2001:db8:2::2]:8080", "2001:db8:1::2") })
}

func TestMultipathRoute(t *testing.T) {
	l := New(t, testPrefix(t))
	a, _, _, _ := pair(t, l)
	require.NoError(t, a.AddAddr("eth0", "198.18.0.3/24"))
	require.NoError(t, a.SetSysctl("net.ipv4.fib_multipath_hash_policy", "1"))
	require.NoError(t, a.AddMultipathRoute("198.18.100.0/24", "198.18.0.2", "198.18.0.4"))
	routes, err := a.Netlink().RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{Dst: prefixToIPNet(netip.MustParsePrefix("198.18.100.0/24"))}, netlink.RT_FILTER_DST)
	require.NoError(t, err)
	require.Len(t, routes, 1)
	assert.Len(t, routes[0].MultiPath, 2)
	require.NoError(t, a.DelRoute("198.18.100.0/24"))
}

func TestAddressRule(t *testing.T) {
	l := New(t, testPrefix(t))
	ctx := testCtx(t)
	a, _, _, _ := pair(t, l)

	for _, err := range []error{
		a.AddAddr("eth0", "10.1.2.3/24"),
		a.AddAddr("eth0", "198.18.0.9/8"),
		a.AddAddr("eth0", "2001:db9::1/64"),
		a.AddRoute("0.0.0.0/0", "198.18.0.2"),
		a.AddRoute("192.0.2.0/24", "198.18.0.2"),
		a.AddRoute("198.18.9.0/24", "192.168.0.1"),
		a.ReplaceRoute("::/0", "2001:db8::2"),
		a.AddMultipathRoute("198.18.9.0/24", "198.18.0.2", "8.8.8.8"),
		a.DelRoute("0.0.0.0/0"),
	} {
		assert.ErrorIs(t, err, ErrOutsideTestRange)
	}
	_, err := a.Dial(ctx, "tcp", "192.0.2.1:80")
	assert.ErrorIs(t, err, ErrOutsideTestRange)

	// Nothing was configured by the rejected calls.
	addrs, err := a.Netlink().AddrList(mustLink(t, a, "eth0"), netlink.FAMILY_V4)
	require.NoError(t, err)
	require.Len(t, addrs, 1)
	assert.Equal(t, "198.18.0.1/24", addrs[0].IPNet.String())
}

func mustLink(t *testing.T, n *NS, name string) netlink.Link {
	t.Helper()
	lk, err := n.Link(name)
	require.NoError(t, err)
	return lk
}

func TestDo(t *testing.T) {
	l := New(t, testPrefix(t))
	a, err := l.Namespace("a")
	require.NoError(t, err)

	err = a.Do(func() error {
		cur, err := netns.Get()
		if err != nil {
			return err
		}
		defer cur.Close()
		if !cur.Equal(a.Handle()) {
			return fmt.Errorf("Do ran in %v, want %v", cur, a.Handle())
		}
		return nil
	})
	require.NoError(t, err)

	// The caller's namespace is untouched.
	self, err := netns.Get()
	require.NoError(t, err)
	defer self.Close()
	assert.False(t, self.Equal(a.Handle()))

	assert.EqualError(t, a.Do(func() error { return io.EOF }), "EOF")
	assert.PanicsWithValue(t, "boom", func() { _ = a.Do(func() error { panic("boom") }) })
}

func TestCommandRunsInNamespace(t *testing.T) {
	l := New(t, testPrefix(t))
	ctx := testCtx(t)
	a, _, _, _ := pair(t, l)
	out, err := a.Command(ctx, "ip", "-o", "addr", "show", "dev", "eth0").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "198.18.0.1/24")
}

// fakeTB stands in for a test whose body fails: Fatalf ends the body's
// goroutine as testing.T does, and cleanups run when the caller says.
type fakeTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	f.failed = true
	f.mu.Unlock()
	f.TB.Logf("(fake) "+format, args...)
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

// finish runs the cleanups, last registered first, as testing does.
func (f *fakeTB) finish() {
	f.mu.Lock()
	c := f.cleanups
	f.cleanups = nil
	f.mu.Unlock()
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

func TestCleanupAfterFailedTest(t *testing.T) {
	RequireRoot(t)
	prefix := testPrefix(t)
	fake := &fakeTB{TB: t}
	var sleeper *exec.Cmd
	var nsNames []string

	done := make(chan struct{})
	go func() { // the "test body", which fails half way
		defer close(done)
		l := New(fake, prefix)
		a, err := l.Namespace("a")
		if err != nil {
			fake.Fatalf("%v", err)
		}
		b, err := l.Namespace("b")
		if err != nil {
			fake.Fatalf("%v", err)
		}
		if _, _, err := l.Veth(a, "eth0", b, "eth0"); err != nil {
			fake.Fatalf("%v", err)
		}
		nsNames = []string{a.Name(), b.Name()}
		// A process left running in a namespace.
		sleeper = a.Command(context.Background(), "sleep", "600")
		if err := sleeper.Start(); err != nil {
			fake.Fatalf("%v", err)
		}
		fake.Fatalf("simulated failure with the topology still up")
		panic("not reached")
	}()
	<-done
	require.True(t, fake.Failed())
	require.Len(t, nsNames, 2, "body built the topology before failing")
	require.Len(t, Leftovers(prefix), 2, "namespaces exist before cleanup: %v", Leftovers(prefix))

	fake.finish()

	assert.Empty(t, Leftovers(prefix))
	for _, n := range nsNames {
		_, err := os.Stat(NetnsDir + "/" + n)
		assert.ErrorIs(t, err, os.ErrNotExist)
	}
	err := sleeper.Wait()
	assert.Error(t, err, "the process in the namespace was killed")
}

func TestCloseIsIdempotentAndFinal(t *testing.T) {
	RequireRoot(t)
	prefix := testPrefix(t)
	l, err := NewStandalone(prefix)
	require.NoError(t, err)
	_, err = l.Namespace("a")
	require.NoError(t, err)
	require.NoError(t, l.Close())
	require.NoError(t, l.Close())
	assert.Empty(t, Leftovers(prefix))
	_, err = l.Namespace("b")
	assert.Error(t, err, "a closed lab makes nothing")
}

func TestCleanupStale(t *testing.T) {
	RequireRoot(t)
	prefix := testPrefix(t)

	// A pid that has certainly exited: a child we started and reaped.
	dead := exec.Command("true")
	require.NoError(t, dead.Run())

	crashed, err := NewStandalone(prefix)
	require.NoError(t, err)
	crashed.run = runID(dead.Process.Pid) // as if made by that process
	_, err = crashed.Namespace("x")
	require.NoError(t, err)

	live, err := NewStandalone(prefix)
	require.NoError(t, err)
	defer live.Close()
	liveNS, err := live.Namespace("y")
	require.NoError(t, err)

	require.Len(t, Leftovers(prefix), 2)
	require.NoError(t, CleanupStale(prefix))
	assert.Equal(t, []string{"netns " + liveNS.Name()}, Leftovers(prefix), "only the stale namespace is removed")

	require.NoError(t, crashed.Close(), "closing after a stale cleanup is harmless")
	require.NoError(t, live.Close())
	assert.Empty(t, Leftovers(prefix))
}

// FuzzParseTestPrefix checks the address rule's parser: whatever it accepts
// lies wholly inside TestRanges, first and last address included.
func FuzzParseTestPrefix(f *testing.F) {
	for _, s := range []string{"198.18.0.1/24", "198.18.0.0/15", "198.17.255.255/32", "2001:db8::/32",
		"2001:db8:ffff:ffff::1/64", "::ffff:198.18.0.1/120", "0.0.0.0/0", "198.18.0.1", "junk", "2001:db8::1%eth0/64"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parseTestPrefix(s)
		if err != nil {
			return
		}
		m := p.Masked()
		first := m.Addr()
		last := first
		b := last.AsSlice()
		for i := m.Bits(); i < len(b)*8; i++ {
			b[i/8] |= 0x80 >> (i % 8)
		}
		last, _ = netip.AddrFromSlice(b)
		if CheckAddr(first) != nil || CheckAddr(last) != nil || CheckAddr(p.Addr()) != nil {
			t.Fatalf("%q accepted as %v, which leaves the test ranges", s, p)
		}
	})
}
