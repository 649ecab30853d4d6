//go:build linux

package pktrate

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// NAPIMode says where the kernel's receive work for the DUT's ingress veth
// and the sink's veth runs.
type NAPIMode uint8

const (
	// NAPIThreadedFIFO (the default): threaded NAPI, kernel threads
	// napi/<ifname>-<id> running SCHED_FIFO (the sink's at a higher
	// priority than the DUT's). Like softirq
	// processing they preempt ordinary processes, so a busy machine's other
	// work cannot starve them into dropping at low load; unlike softirq
	// they can run on another core than the sender (as a NIC's interrupt
	// would) and their CPU time is the DUT's (ingress) or the sink's,
	// measured exactly from schedstat.
	NAPIThreadedFIFO NAPIMode = iota
	// NAPIThreaded: threaded NAPI at normal priority (SCHED_OTHER) for the
	// DUT; the sink's thread is still SCHED_FIFO.
	NAPIThreaded
	// NAPISoftirq: NAPI stays in softirq, which runs on the CPU that woke
	// it, in practice inside the sender's sendto. The sender, the DUT's
	// kernel work and the sink then share one thread's time, and the DUT's
	// CPU can only be read as the machine's softirq time from /proc/stat
	// (which includes the sink's): an upper bound.
	NAPISoftirq
)

// String returns "threaded-fifo", "threaded" or "softirq".
func (m NAPIMode) String() string {
	switch m {
	case NAPIThreadedFIFO:
		return "threaded-fifo"
	case NAPIThreaded:
		return "threaded"
	case NAPISoftirq:
		return "softirq"
	}
	return fmt.Sprintf("NAPIMode(%d)", uint8(m))
}

// ParseNAPIMode parses the names String returns.
func ParseNAPIMode(s string) (NAPIMode, error) {
	for m := NAPIThreadedFIFO; m <= NAPISoftirq; m++ {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("pktrate: NAPI mode %q: want threaded-fifo, threaded or softirq", s)
}

// TopologyConfig describes the three-namespace topology. The zero value
// is the default.
type TopologyConfig struct {
	// Path is the topology's shape (default PathRouted). Run sets it from
	// its DUTs.
	Path Path
	// Queues is the number of RX/TX queues of each veth (default 1). The
	// generator sends on queue 0.
	Queues int
	// NAPI says where the receive work of the DUT's ingress and of the
	// sink runs (default NAPIThreadedFIFO).
	NAPI NAPIMode
	// DUTNAPICPUs and SinkNAPICPUs pin the threaded NAPI threads to these
	// CPUs (none: not pinned). On a machine with cores to spare, giving
	// the generator, the DUT and the sink a core each keeps them from
	// measuring each other.
	DUTNAPICPUs, SinkNAPICPUs []int
	// SinkCapture makes the sink keep copies of the first test frames it
	// counts (SinkConfig.Capture; Sink.Captured), for tests. Zero for
	// measurements.
	SinkCapture int
}

// Topology is the namespaces, veths, addresses and sink of one Path.
//
// PathRouted and PathTunnel: generator namespace → DUT namespace → sink
// namespace over two veth pairs:
//
//	gen [GenLink 198.18.0.1] ── [DUTIn 198.18.0.2] dut [DUTOut 198.18.1.1] ── [SinkLink 198.18.1.2] sink
//
// On PathTunnel the DUT is a host (DUTIn's address is the host's, where
// VXLAN arrives), DUTOut is its VM port and the sink namespace is the VM
// (SinkAddr is the DIP, SinkLink's MAC the VM's).
//
// PathOneArm: generator namespace ⇄ DUT namespace over one veth pair; the
// DUT's only veth is both DUTIn and DUTOut, and the sink counts on the
// generator's veth (SinkNS is Gen, SinkLink is GenLink):
//
//	gen [GenLink 198.18.0.1] ── [DUTIn = DUTOut 198.18.0.2] dut
//
// The DUT routes 198.18.0.0/15 via 198.18.0.1 (the generator is its
// router, with a permanent neighbour entry), so VIPAddr and the Mux's
// backend hosts are reached back out of the same veth; ICMP redirects are
// off.
//
// SinkLink carries the counting program (Sink). The DUT namespace starts
// with forwarding off, reverse-path filtering off, a permanent neighbour
// entry for its next hop (SinkAddr, or GenAddr one-armed), and no XDP
// program: each DUT mode adds its own and removes it when it stops. IPv6
// is disabled in all namespaces so no neighbour discovery or MLD frames
// cross the path.
//
// DUTIn has GRO on so it has NAPI even without an XDP program, and
// GenLink has TSO off so the veth hands the generator's frames to that
// NAPI instead of the receiving CPU's backlog (veth only uses NAPI for
// skbs GRO may aggregate); with threaded NAPI the DUT's receive work is
// then always on its own kernel thread.
type Topology struct {
	Gen, DUT, SinkNS                 *netlab.NS
	GenLink, DUTIn, DUTOut, SinkLink *netlab.Link
	// Sink counts what arrives at SinkLink.
	Sink *Sink

	path              Path
	napi              NAPIMode
	dutCPUs, sinkCPUs []int
}

// NewTopology builds the topology in lab. Everything it makes lives in
// lab's namespaces and goes with lab.Close; Close the Topology first to
// detach the sink program.
func NewTopology(lab *netlab.Lab, cfg TopologyConfig) (t *Topology, err error) {
	if cfg.NAPI > NAPISoftirq {
		return nil, fmt.Errorf("pktrate: unknown NAPI mode %d", cfg.NAPI)
	}
	if cfg.Path > PathTunnel {
		return nil, fmt.Errorf("pktrate: unknown path %d", cfg.Path)
	}
	if cfg.SinkCapture < 0 || cfg.SinkCapture > MaxCapture {
		return nil, fmt.Errorf("pktrate: sink capture %d outside [0, %d]", cfg.SinkCapture, MaxCapture)
	}
	oneArm := cfg.Path == PathOneArm
	t = &Topology{path: cfg.Path, napi: cfg.NAPI, dutCPUs: cfg.DUTNAPICPUs, sinkCPUs: cfg.SinkNAPICPUs}
	defer func() {
		if err != nil {
			t.Close()
			t = nil
		}
	}()
	namespaces := []struct {
		ns   **netlab.NS
		name string
	}{{&t.Gen, "gen"}, {&t.DUT, "dut"}, {&t.SinkNS, "sink"}}
	if oneArm {
		namespaces = namespaces[:2]
	}
	for _, p := range namespaces {
		if *p.ns, err = lab.Namespace(p.name); err != nil {
			return t, err
		}
		for _, k := range []string{"net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"} {
			if err := (*p.ns).SetSysctl(k, "1"); err != nil {
				return t, err
			}
		}
	}
	// Interface names unique to this run: the NAPI threads are found by
	// name, and names are only unique per namespace.
	tag := randomTag()
	if t.GenLink, t.DUTIn, err = lab.VethWith(netlab.VethConfig{
		A: t.Gen, AName: "pg" + tag, B: t.DUT, BName: "pi" + tag, Queues: cfg.Queues,
	}); err != nil {
		return t, err
	}
	addrs := []struct {
		ns     *netlab.NS
		ifname string
		prefix string
	}{
		{t.Gen, t.GenLink.Name, GenAddr.String() + "/24"},
		{t.DUT, t.DUTIn.Name, DUTInAddr.String() + "/24"},
	}
	nextHop, nextMAC := SinkAddr, net.HardwareAddr(nil)
	if oneArm {
		t.SinkNS, t.DUTOut, t.SinkLink = t.Gen, t.DUTIn, t.GenLink
		nextHop, nextMAC = GenAddr, t.GenLink.MAC
	} else {
		if t.DUTOut, t.SinkLink, err = lab.VethWith(netlab.VethConfig{
			A: t.DUT, AName: "po" + tag, B: t.SinkNS, BName: "ps" + tag, Queues: cfg.Queues,
		}); err != nil {
			return t, err
		}
		addrs = append(addrs, []struct {
			ns     *netlab.NS
			ifname string
			prefix string
		}{
			{t.DUT, t.DUTOut.Name, DUTOutAddr.String() + "/24"},
			{t.SinkNS, t.SinkLink.Name, SinkAddr.String() + "/24"},
		}...)
		nextMAC = t.SinkLink.MAC
	}
	for _, a := range addrs {
		if err := a.ns.AddAddr(a.ifname, a.prefix); err != nil {
			return t, err
		}
	}
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "0"},
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
		{"net.ipv4.conf." + t.DUTIn.Name + ".rp_filter", "0"},
		{"net.ipv4.conf." + t.DUTOut.Name + ".rp_filter", "0"},
		{"net.ipv4.conf.all.send_redirects", "0"},
		{"net.ipv4.conf.default.send_redirects", "0"},
		// The kernel sends a redirect when it forwards a packet out of
		// the interface it came in on (one-armed) unless both this and
		// "all" are off.
		{"net.ipv4.conf." + t.DUTIn.Name + ".send_redirects", "0"},
	} {
		if err := t.DUT.SetSysctl(kv[0], kv[1]); err != nil {
			return t, err
		}
	}
	if err := t.DUT.Netlink().NeighSet(&netlink.Neigh{
		LinkIndex:    t.DUTOut.Index,
		Family:       unix.AF_INET,
		State:        netlink.NUD_PERMANENT,
		IP:           nextHop.AsSlice(),
		HardwareAddr: nextMAC,
	}); err != nil {
		return t, fmt.Errorf("pktrate: neighbour %v on %s: %w", nextHop, t.DUTOut.Name, err)
	}
	if oneArm {
		if err := t.DUT.AddRoute("198.18.0.0/15", GenAddr.String()); err != nil {
			return t, err
		}
	}
	if err := setFeature(t.Gen, t.GenLink.Name, unix.ETHTOOL_STSO, false); err != nil {
		return t, err
	}
	if err := setFeature(t.DUT, t.DUTIn.Name, unix.ETHTOOL_SGRO, true); err != nil {
		return t, err
	}
	sc := SinkConfig{MAC: t.SinkLink.MAC, Capture: cfg.SinkCapture}
	switch t.path {
	case PathRouted:
		sc.DstAddr, sc.DstPort = SinkAddr, DstPort
	case PathOneArm:
		sc.DstAddr, sc.DstPort = VIPAddr, DstPort
	case PathTunnel:
		sc.DstAddr, sc.DstPort = DIPAddr, DIPPort
	}
	if t.Sink, err = AttachSink(t.SinkNS, t.SinkLink.Index, sc); err != nil {
		return t, err
	}
	if t.Threaded() {
		// Both have NAPI now: DUTIn through GRO, SinkLink through XDP.
		for _, l := range []*netlab.Link{t.DUTIn, t.SinkLink} {
			if err := setThreadedNAPI(l); err != nil {
				return t, err
			}
		}
		if _, err := t.SinkNAPIThreads(); err != nil {
			return t, err
		}
		if _, err := t.DUTNAPIThreads(); err != nil {
			return t, err
		}
	}
	return t, nil
}

// Path returns the topology's path.
func (t *Topology) Path() Path { return t.path }

// Spec returns the FrameSpec of the test traffic for a frame size and flow
// count on the topology's path: from the generator through the DUT's
// ingress MAC to SinkAddr (PathRouted) or VIPAddr (PathOneArm); on
// PathTunnel in VXLAN to the host's address DUTInAddr, around frames to
// VIPAddr addressed to the VM's MAC (SinkLink's), as a Mux would send
// them (inner source MAC: the generator's, as the Mux keeps it).
func (t *Topology) Spec(size, flows int) FrameSpec {
	s := FrameSpec{
		SrcMAC: t.GenLink.MAC, DstMAC: t.DUTIn.MAC,
		Src: FlowSrc, Dst: SinkAddr, DstPort: DstPort,
		Size: size, Flows: flows,
	}
	switch t.path {
	case PathOneArm:
		s.Dst = VIPAddr
	case PathTunnel:
		s.Dst, s.DstMAC = VIPAddr, t.SinkLink.MAC
		s.VXLAN = &VXLANSpec{SrcMAC: t.GenLink.MAC, DstMAC: t.DUTIn.MAC,
			Src: GenAddr, Dst: DUTInAddr, Port: VXLANPort, VNI: TunnelVNI}
	}
	return s
}

// Threaded reports whether the DUT's and the sink's NAPI run on kernel
// threads.
func (t *Topology) Threaded() bool { return t.napi != NAPISoftirq }

// NAPI returns the topology's NAPI mode.
func (t *Topology) NAPI() NAPIMode { return t.napi }

// DUTNAPIThreads returns the pids of the NAPI threads of the DUT's ingress
// veth (none with NAPISoftirq), made SCHED_FIFO with NAPIThreadedFIFO. An
// XDP program attached or detached may recreate them, so the harness looks
// them up for every trial.
func (t *Topology) DUTNAPIThreads() ([]int, error) {
	if !t.Threaded() {
		return nil, nil
	}
	prio := 0
	if t.napi == NAPIThreadedFIFO {
		prio = dutPriority
	}
	return napiThreadsFIFO(t.DUTIn.Name, prio, t.dutCPUs)
}

// SinkNAPIThreads returns the pids of the sink veth's NAPI threads (none
// with NAPISoftirq), and makes sure they run SCHED_FIFO in both threaded
// modes: the sink is an instrument and must not drop frames because the
// scheduler let other threads run first. Its XDP program only counts and
// drops, so the priority costs little.
func (t *Topology) SinkNAPIThreads() ([]int, error) {
	if !t.Threaded() {
		return nil, nil
	}
	return napiThreadsFIFO(t.SinkLink.Name, sinkPriority, t.sinkCPUs)
}

// SCHED_FIFO priorities of the NAPI threads: the sink's is above the
// DUT's, so on a shared core the sink preempts the DUT and never drops.
const (
	dutPriority  = 1
	sinkPriority = 2
)

// napiThreadsFIFO finds an interface's NAPI threads, sets them SCHED_FIFO
// at prio (unless prio is 0) and pins them to cpus (unless empty).
func napiThreadsFIFO(ifname string, prio int, cpus []int) ([]int, error) {
	pids, err := napiThreads(ifname)
	if err != nil {
		return nil, err
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("pktrate: no NAPI thread napi/%s-* found (threaded NAPI threads are only visible from the initial pid namespace)", ifname)
	}
	if prio > 0 {
		for _, pid := range pids {
			attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(prio)}
			if err := unix.SchedSetAttr(pid, &attr, 0); err != nil {
				return nil, fmt.Errorf("pktrate: SCHED_FIFO for NAPI thread %d (%s): %w", pid, ifname, err)
			}
		}
	}
	if len(cpus) > 0 {
		var set unix.CPUSet
		for _, c := range cpus {
			set.Set(c)
		}
		for _, pid := range pids {
			if err := unix.SchedSetaffinity(pid, &set); err != nil {
				return nil, fmt.Errorf("pktrate: pin NAPI thread %d (%s) to CPUs %v: %w", pid, ifname, cpus, err)
			}
		}
	}
	return pids, nil
}

// DUTXDPAttached reports whether the DUT's ingress veth carries an XDP
// program.
func (t *Topology) DUTXDPAttached() (bool, error) { return xdpAttached(t.DUTIn) }

// xdpAttached reports whether l carries an XDP program.
func xdpAttached(l *netlab.Link) (bool, error) {
	lk, err := l.NS.Netlink().LinkByIndex(l.Index)
	if err != nil {
		return false, err
	}
	x := lk.Attrs().Xdp
	return x != nil && (x.Attached || x.ProgId != 0), nil
}

// drops reads the drop counters of the path's four interfaces.
func (t *Topology) drops() (Drops, error) {
	var d Drops
	for _, x := range []struct {
		l   *netlab.Link
		v   *uint64
		out bool
	}{{t.GenLink, &d.GenTX, true}, {t.DUTIn, &d.DUTInRX, false}, {t.DUTOut, &d.DUTOutTX, true}, {t.SinkLink, &d.SinkRX, false}} {
		l, err := x.l.NS.Netlink().LinkByIndex(x.l.Index)
		if err != nil {
			return d, err
		}
		if st := l.Attrs().Statistics; st != nil {
			if x.out {
				*x.v = st.TxDropped
			} else {
				*x.v = st.RxDropped
			}
		}
	}
	return d, nil
}

// Close detaches the sink program. The namespaces, veths and anything
// else attached to them go with the Lab.
func (t *Topology) Close() error {
	if t.Sink != nil {
		err := t.Sink.Close()
		t.Sink = nil
		return err
	}
	return nil
}

func randomTag() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [5]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

// setFeature switches an offload on or off with a legacy ethtool ioctl
// (ETHTOOL_SGRO, ETHTOOL_STSO, ...) from a socket made inside ns, so no
// ethtool binary is needed.
func setFeature(ns *netlab.NS, ifname string, cmd uint32, on bool) error {
	return ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		val := struct{ cmd, data uint32 }{cmd: cmd}
		if on {
			val.data = 1
		}
		var ifr struct {
			name [unix.IFNAMSIZ]byte
			data unsafe.Pointer
			_    [24 - unsafe.Sizeof(uintptr(0))]byte
		}
		copy(ifr.name[:], ifname)
		ifr.data = unsafe.Pointer(&val)
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
			return fmt.Errorf("pktrate: ethtool %#x on %s in %s: %w", cmd, ifname, ns, e)
		}
		return nil
	})
}

// setThreadedNAPI writes 1 to /sys/class/net/<if>/threaded. sysfs shows
// the interfaces of the namespace it was mounted from, so the write runs
// under `ip netns exec`, which mounts the namespace's own.
func setThreadedNAPI(l *netlab.Link) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := l.NS.Command(ctx, "sh", "-c", "echo 1 > /sys/class/net/"+l.Name+"/threaded")
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("pktrate: threaded NAPI on %s: %s", l.Name, out)
		}
		return fmt.Errorf("pktrate: threaded NAPI on %s: %w", l.Name, err)
	}
	return nil
}
