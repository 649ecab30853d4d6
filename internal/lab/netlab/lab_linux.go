package netlab

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetnsDir is where named namespaces are bind-mounted, as by `ip netns add`.
const NetnsDir = "/run/netns"

var (
	prefixRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9_]{1,16}$`)
	ifnameRE = regexp.MustCompile(`^[A-Za-z0-9_.]{1,15}$`) // IFNAMSIZ-1, no '/', ':' or blanks
)

// Lab owns a set of namespaces (and the veths and XDP programs inside them)
// and removes them all on Close. It is safe for concurrent use.
type Lab struct {
	prefix string
	run    string // base36(pid) + 2 random base36 characters

	mu     sync.Mutex
	nss    []*NS
	cmds   []*exec.Cmd // from NS.Command, killed on Close if still running
	closed bool
}

// New returns a Lab for a test and registers a tb.Cleanup that closes it, so
// everything the Lab made is removed however the test ends. It calls
// RequireRoot first, so a test without privileges is skipped. prefix names
// this Lab's resources: 1 to 8 characters, [a-z][a-z0-9]*.
func New(tb testing.TB, prefix string) *Lab {
	tb.Helper()
	RequireRoot(tb)
	l, err := NewStandalone(prefix)
	if err != nil {
		tb.Fatalf("netlab: %v", err)
	}
	tb.Cleanup(func() {
		if err := l.Close(); err != nil {
			tb.Errorf("netlab: cleanup: %v", err)
		}
	})
	return l
}

// NewStandalone returns a Lab for a program that is not a test. The caller
// must call Close (typically deferred, and on SIGINT/SIGTERM too); if the
// program dies first, CleanupStale(prefix) removes what it left.
func NewStandalone(prefix string) (*Lab, error) {
	if !prefixRE.MatchString(prefix) {
		return nil, fmt.Errorf("netlab: prefix %q must match %s", prefix, prefixRE)
	}
	return &Lab{prefix: prefix, run: runID(os.Getpid())}, nil
}

// runID is the per-process part of every name: the pid in base 36 (so
// CleanupStale can tell whether the owner is alive) and two random
// characters (so two Labs in one process differ).
func runID(pid int) string {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	var b [2]byte
	_, _ = rand.Read(b[:])
	return strconv.FormatInt(int64(pid), 36) + string(digits[int(b[0])%36]) + string(digits[int(b[1])%36])
}

// ownerPID extracts the creating pid from a run id made by runID.
func ownerPID(run string) (int, bool) {
	if len(run) < 3 {
		return 0, false
	}
	pid, err := strconv.ParseInt(run[:len(run)-2], 36, 32)
	if err != nil || pid <= 0 {
		return 0, false
	}
	return int(pid), true
}

// Prefix returns the prefix the Lab was made with.
func (l *Lab) Prefix() string { return l.prefix }

// Namespace creates a network namespace called name within the Lab (its
// system name is prefix-run-name; see NS.Name), bind-mounted under
// /run/netns, with lo up and IPv6 duplicate address detection off (so
// addresses are usable at once). name is 1 to 16 characters [A-Za-z0-9_] and
// must be unique within the Lab.
func (l *Lab) Namespace(name string) (*NS, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("netlab: namespace name %q must match %s", name, nameRE)
	}
	full := l.prefix + "-" + l.run + "-" + name

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("netlab: lab is closed")
	}
	for _, n := range l.nss {
		if n.name == name {
			return nil, fmt.Errorf("netlab: namespace %q already exists", name)
		}
	}
	n, err := createNamed(full)
	if err != nil {
		return nil, fmt.Errorf("netlab: namespace %s: %w", full, err)
	}
	n.lab, n.name = l, name
	l.nss = append(l.nss, n)

	if err := n.setup(); err != nil {
		return nil, fmt.Errorf("netlab: namespace %s: %w", full, err)
	}
	return n, nil
}

var netnsDirOnce struct {
	sync.Once
	err error
}

// sharedNetnsDir makes NetnsDir a shared mount point, as iproute2's "ip
// netns add" does, before anything is mounted in it. Otherwise the first
// "ip netns add" on the machine (another test, BIRD's setup) bind-mounts
// the directory over itself and hides every namespace mounted in it
// before: those can then be neither listed nor removed.
func sharedNetnsDir() error {
	netnsDirOnce.Do(func() {
		err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if errors.Is(err, unix.EINVAL) { // not a mount point yet
			if err = unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
				err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
			}
		}
		if err != nil {
			netnsDirOnce.err = fmt.Errorf("netlab: make %s a shared mount point: %w", NetnsDir, err)
		}
	})
	return netnsDirOnce.err
}

// createNamed makes a new network namespace on a locked thread and
// bind-mounts it at NetnsDir/full. On failure nothing is left behind.
func createNamed(full string) (*NS, error) {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return nil, err
	}
	if err := sharedNetnsDir(); err != nil {
		return nil, err
	}
	path := filepath.Join(NetnsDir, full)
	var h netns.NsHandle = -1
	err := onLockedThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
		if err != nil {
			return err
		}
		f.Close()
		if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
			os.Remove(path)
			return fmt.Errorf("bind mount: %w", err)
		}
		h, err = netns.GetFromPath(path)
		if err != nil {
			unmountRemove(path)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		h.Close()
		unmountRemove(path)
		return nil, err
	}
	return &NS{full: full, path: path, handle: h, nl: nl}, nil
}

// setup brings lo up and turns off IPv6 DAD.
func (n *NS) setup() error {
	lo, err := n.nl.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := n.nl.LinkSetUp(lo); err != nil {
		return err
	}
	for _, k := range []string{"net.ipv6.conf.all.accept_dad", "net.ipv6.conf.default.accept_dad"} {
		if err := n.SetSysctl(k, "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Link is one end of a veth pair made by the Lab.
type Link struct {
	NS    *NS
	Name  string
	Index int
	MAC   net.HardwareAddr
}

// VethConfig describes a veth pair for VethWith. Zero MTU and Queues mean
// the kernel defaults (1500, one queue).
type VethConfig struct {
	A, B         *NS
	AName, BName string
	MTU          int
	Queues       int // RX and TX queues on each end (AF_XDP binds per queue)
}

// Veth creates a veth pair, end aName in a and end bName in b, and sets both
// up. The ends are created inside their namespaces, never in the caller's.
func (l *Lab) Veth(a *NS, aName string, b *NS, bName string) (*Link, *Link, error) {
	return l.VethWith(VethConfig{A: a, AName: aName, B: b, BName: bName})
}

// VethWith creates a veth pair as cfg describes and sets both ends up.
func (l *Lab) VethWith(cfg VethConfig) (*Link, *Link, error) {
	if cfg.A == nil || cfg.B == nil || cfg.A.lab != l || cfg.B.lab != l {
		return nil, nil, errors.New("netlab: veth ends must be namespaces of this lab")
	}
	for _, n := range []string{cfg.AName, cfg.BName} {
		if !ifnameRE.MatchString(n) {
			return nil, nil, fmt.Errorf("netlab: interface name %q must match %s", n, ifnameRE)
		}
	}
	if cfg.A == cfg.B && cfg.AName == cfg.BName {
		return nil, nil, errors.New("netlab: veth ends in one namespace need different names")
	}
	if cfg.MTU < 0 || cfg.Queues < 0 {
		return nil, nil, errors.New("netlab: negative MTU or queue count")
	}
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: cfg.AName, MTU: cfg.MTU},
		PeerName:      cfg.BName,
		PeerNamespace: netlink.NsFd(int(cfg.B.handle)),
		PeerMTU:       uint32(cfg.MTU),
	}
	if cfg.Queues > 0 {
		q := cfg.Queues
		v.NumTxQueues, v.NumRxQueues = q, q
		v.PeerNumTxQueues, v.PeerNumRxQueues = uint32(q), uint32(q)
	}
	if err := cfg.A.nl.LinkAdd(v); err != nil {
		return nil, nil, fmt.Errorf("netlab: veth %s/%s - %s/%s: %w", cfg.A.name, cfg.AName, cfg.B.name, cfg.BName, err)
	}
	la, err := cfg.A.linkUp(cfg.AName)
	if err != nil {
		return nil, nil, err
	}
	lb, err := cfg.B.linkUp(cfg.BName)
	if err != nil {
		return nil, nil, err
	}
	return la, lb, nil
}

func (n *NS) linkUp(name string) (*Link, error) {
	lk, err := n.nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("netlab: %s: link %s: %w", n.name, name, err)
	}
	if err := n.nl.LinkSetUp(lk); err != nil {
		return nil, fmt.Errorf("netlab: %s: set %s up: %w", n.name, name, err)
	}
	a := lk.Attrs()
	return &Link{NS: n, Name: name, Index: a.Index, MAC: a.HardwareAddr}, nil
}

// Close removes everything the Lab made: it kills processes still running
// in its namespaces, closes its handles and unmounts and deletes the
// namespaces, which destroys their veths and any XDP programs attached to
// them. Sockets the caller still holds keep a namespace alive (unnamed)
// until they are closed. Close is idempotent.
func (l *Lab) Close() error {
	l.mu.Lock()
	nss, cmds := l.nss, l.cmds
	l.nss, l.cmds, l.closed = nil, nil, true
	l.mu.Unlock()

	var errs []error
	// A started command may still be `ip netns exec` on its way into the
	// namespace, invisible to the scan below: kill it by pid.
	for _, c := range cmds {
		if c.Process != nil { // Kill after Wait is a harmless ErrProcessDone
			_ = c.Process.Kill()
		}
	}
	for i := len(nss) - 1; i >= 0; i-- {
		n := nss[i]
		n.nl.Close()
		ino, err := nsInode(n.path)
		if err == nil {
			errs = append(errs, killInNetns(ino))
		}
		n.handle.Close()
		errs = append(errs, unmountRemove(n.path))
	}
	return errors.Join(errs...)
}

// unmountRemove detaches the bind mount at path and removes the file.
func unmountRemove(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
