package netlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NS is a named network namespace owned by a Lab. Its methods are safe for
// concurrent use.
type NS struct {
	lab    *Lab
	name   string // the caller's short name
	full   string // name under NetnsDir
	path   string
	handle netns.NsHandle
	nl     *netlink.Handle
}

// Name returns the namespace's system name (prefix-run-name), the one
// `ip netns exec` and `ip -n` take.
func (n *NS) Name() string { return n.full }

// Path returns the bind-mount path of the namespace, /run/netns/Name().
// Open it (netns.GetFromPath) to get a handle of your own.
func (n *NS) Path() string { return n.path }

// String returns the short name given to Lab.Namespace.
func (n *NS) String() string { return n.name }

// Handle returns the Lab's open handle of the namespace, for netlink's
// ...At functions and subscription options. It stays valid until the Lab is
// closed; do not close it.
func (n *NS) Handle() netns.NsHandle { return n.handle }

// Netlink returns a netlink handle whose requests act inside the namespace.
// It stays valid until the Lab is closed; do not close it.
func (n *NS) Netlink() *netlink.Handle { return n.nl }

// Do runs fn inside the namespace and returns its error. fn runs on its own
// goroutine, locked to an OS thread that is switched into the namespace for
// the call and back afterwards (if switching back fails, the thread is
// discarded, never reused). A panic in fn is re-raised in the caller.
//
// Only fn's own thread is in the namespace: goroutines it starts are not.
// File descriptors it creates (sockets, netlink) stay bound to the
// namespace and may be used anywhere after Do returns.
func (n *NS) Do(fn func() error) error {
	var err error
	p := onLockedThreadIn(n.handle, func() error {
		err = fn()
		return nil
	})
	if p != nil {
		return p
	}
	return err
}

// onLockedThreadIn runs fn on a fresh locked thread switched into target.
func onLockedThreadIn(target netns.NsHandle, fn func() error) error {
	return onLockedThread(func() error {
		if err := netns.Set(target); err != nil {
			return fmt.Errorf("netlab: setns: %w", err)
		}
		return fn()
	})
}

// panicked carries a panic from the locked goroutine back to the caller.
type panicked struct{ v any }

// onLockedThread runs fn on a new goroutine locked to its OS thread and
// restores that thread's network namespace afterwards. fn may change the
// thread's namespace (setns, unshare). If the restore fails the goroutine
// exits still locked, so the runtime terminates the thread.
func onLockedThread(fn func() error) error {
	done := make(chan any, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("netlab: get current netns: %w", err)
			return
		}
		defer orig.Close()
		defer func() {
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
		}()
		defer func() {
			if v := recover(); v != nil {
				done <- panicked{v}
			}
		}()
		done <- fn()
	}()
	switch v := (<-done).(type) {
	case nil:
		return nil
	case error:
		return v
	case panicked:
		panic(v.v)
	default:
		panic("unreachable")
	}
}

// Command returns a command that runs name with args inside the namespace,
// via `ip netns exec` (which also mounts the namespace's /sys, so tools that
// read /sys/class/net see its interfaces). Cancelling ctx kills the process.
// Lab.Close kills it too if it is still running, as well as any other
// process found in the namespace.
func (n *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.full, name}, args...)...)
	n.lab.mu.Lock()
	n.lab.cmds = append(n.lab.cmds, cmd)
	n.lab.mu.Unlock()
	return cmd
}

// Listen opens a stream listener (net.Listen semantics) inside the
// namespace. The listener works from any goroutine.
func (n *NS) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	var ln net.Listener
	err := n.Do(func() (err error) {
		ln, err = (&net.ListenConfig{}).Listen(ctx, network, address)
		return err
	})
	return ln, err
}

// ListenPacket opens a packet listener (net.ListenPacket semantics) inside
// the namespace.
func (n *NS) ListenPacket(ctx context.Context, network, address string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := n.Do(func() (err error) {
		pc, err = (&net.ListenConfig{}).ListenPacket(ctx, network, address)
		return err
	})
	return pc, err
}

// Dial connects from inside the namespace (net.Dialer semantics). The
// destination must be a literal ip:port inside TestRanges or a loopback
// address (which never leaves the namespace).
func (n *NS) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil, fmt.Errorf("netlab: dial %q: want a literal ip:port: %w", address, err)
	}
	if !ap.Addr().IsLoopback() {
		if err := CheckAddr(ap.Addr()); err != nil {
			return nil, err
		}
	}
	var c net.Conn
	err = n.Do(func() (err error) {
		c, err = (&net.Dialer{}).DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Link returns the interface called name in the namespace.
func (n *NS) Link(name string) (netlink.Link, error) {
	return n.nl.LinkByName(name)
}

// AddAddr adds an address with its prefix length ("198.18.0.1/24",
// "2001:db8::1/64") to interface ifname. The whole prefix must lie inside
// TestRanges. IPv6 addresses are added without DAD, usable at once.
func (n *NS) AddAddr(ifname, prefix string) error {
	p, err := parseTestPrefix(prefix)
	if err != nil {
		return err
	}
	lk, err := n.nl.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("netlab: %s: link %s: %w", n.name, ifname, err)
	}
	a := &netlink.Addr{IPNet: prefixToIPNet(p)}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := n.nl.AddrAdd(lk, a); err != nil {
		return fmt.Errorf("netlab: %s: add %s to %s: %w", n.name, prefix, ifname, err)
	}
	return nil
}

// AddRoute adds a route to dst (a prefix or a single address) via the
// gateway via. Both must be inside TestRanges; in particular there are no
// default routes in a lab.
func (n *NS) AddRoute(dst, via string) error {
	r, err := n.route(dst, via)
	if err != nil {
		return err
	}
	if err := n.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("netlab: %s: route %s via %s: %w", n.name, dst, via, err)
	}
	return nil
}

// ReplaceRoute adds the route to dst via via, or replaces the existing route
// to dst (`ip route replace`).
func (n *NS) ReplaceRoute(dst, via string) error {
	r, err := n.route(dst, via)
	if err != nil {
		return err
	}
	if err := n.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("netlab: %s: replace route %s via %s: %w", n.name, dst, via, err)
	}
	return nil
}

// AddMultipathRoute adds an ECMP route to dst with one next hop per gateway.
// Set net.ipv4.fib_multipath_hash_policy (SetSysctl) to choose the hash.
func (n *NS) AddMultipathRoute(dst string, vias ...string) error {
	if len(vias) == 0 {
		return errors.New("netlab: multipath route needs at least one gateway")
	}
	p, err := parseTestPrefix(dst)
	if err != nil {
		return err
	}
	r := &netlink.Route{Dst: prefixToIPNet(p.Masked())}
	for _, v := range vias {
		gw, err := parseTestAddr(v)
		if err != nil {
			return err
		}
		r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{Gw: gw.AsSlice()})
	}
	if err := n.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("netlab: %s: multipath route %s via %v: %w", n.name, dst, vias, err)
	}
	return nil
}

// DelRoute deletes the route to dst.
func (n *NS) DelRoute(dst string) error {
	p, err := parseTestPrefix(dst)
	if err != nil {
		return err
	}
	if err := n.nl.RouteDel(&netlink.Route{Dst: prefixToIPNet(p.Masked())}); err != nil {
		return fmt.Errorf("netlab: %s: delete route %s: %w", n.name, dst, err)
	}
	return nil
}

func (n *NS) route(dst, via string) (*netlink.Route, error) {
	p, err := parseTestPrefix(dst)
	if err != nil {
		return nil, err
	}
	gw, err := parseTestAddr(via)
	if err != nil {
		return nil, err
	}
	return &netlink.Route{Dst: prefixToIPNet(p.Masked()), Gw: gw.AsSlice()}, nil
}

// SetSysctl writes a sysctl inside the namespace. key is in sysctl(8) form
// ("net.ipv4.ip_forward") or a path under /proc/sys ("net/ipv4/conf/eth0.5/
// rp_filter", needed when a name contains a dot). Only per-namespace keys
// (net.*) are meaningful; others would change the whole host and are refused.
func (n *NS) SetSysctl(key, val string) error {
	p, err := sysctlPath(key)
	if err != nil {
		return err
	}
	return n.Do(func() error { return os.WriteFile(p, []byte(val), 0) })
}

// Sysctl reads a sysctl inside the namespace (key as for SetSysctl), with
// surrounding whitespace trimmed.
func (n *NS) Sysctl(key string) (string, error) {
	p, err := sysctlPath(key)
	if err != nil {
		return "", err
	}
	var v []byte
	err = n.Do(func() (err error) {
		v, err = os.ReadFile(p)
		return err
	})
	return strings.TrimSpace(string(v)), err
}

func sysctlPath(key string) (string, error) {
	k := strings.TrimPrefix(key, "/proc/sys/")
	if !strings.Contains(k, "/") {
		k = strings.ReplaceAll(k, ".", "/")
	}
	if !strings.HasPrefix(k, "net/") || strings.Contains(k, "..") {
		return "", fmt.Errorf("netlab: sysctl %q: only per-namespace net.* keys may be set", key)
	}
	return filepath.Join("/proc/sys", k), nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
