//go:build linux

package pktrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// A DUT is one device-under-test mode: something that, once started,
// forwards the test traffic arriving on Topology.DUTIn out of
// Topology.DUTOut towards the sink, with the sink's MAC as destination.
// Start must leave nothing behind once the Instance is stopped, so the
// next DUT finds the DUT namespace as NewTopology made it. A DUT runs on
// PathRouted and delivers plain test frames unless it implements PathDUT.
type DUT interface {
	// Name labels the mode in results ("xdp-redirect", "kernel", ...).
	Name() string
	// Start sets the mode up and returns once it forwards (or as good as:
	// the harness warms up before it measures).
	Start(ctx context.Context, t *Topology) (Instance, error)
}

// A PathDUT is a DUT that says which path it runs on and which kind of
// test frame it delivers to the sink.
type PathDUT interface {
	DUT
	Shape() (Path, Output)
}

// ShapeOf returns d's path and output: PathRouted and OutputPlain unless
// d is a PathDUT.
func ShapeOf(d DUT) (Path, Output) {
	if p, ok := d.(PathDUT); ok {
		return p.Shape()
	}
	return PathRouted, OutputPlain
}

// An Instance is a started DUT.
type Instance interface {
	// PIDs are processes whose CPU time (every thread) counts as the
	// DUT's, on top of the ingress veth's NAPI threads.
	PIDs() []int
	// Stop tears the mode down.
	Stop() error
}

// KernelForward is the DUT mode "kernel": plain Linux IPv4 forwarding
// (net.ipv4.ip_forward=1, connected routes, a permanent neighbour entry
// for the sink). It is what a user gets without xdplb. With OneArm it is
// "kernel-1arm" on PathOneArm: the route to VIPAddr leads back out of the
// interface the frame came in on (to the generator, with ICMP redirects
// off).
type KernelForward struct {
	OneArm bool
}

// Name returns "kernel" or "kernel-1arm".
func (k KernelForward) Name() string {
	if k.OneArm {
		return "kernel-1arm"
	}
	return "kernel"
}

// Shape returns PathOneArm with OneArm, else PathRouted; OutputPlain.
func (k KernelForward) Shape() (Path, Output) { return oneArmPath(k.OneArm), OutputPlain }

func oneArmPath(oneArm bool) Path {
	if oneArm {
		return PathOneArm
	}
	return PathRouted
}

// Start turns forwarding on in the DUT namespace.
func (KernelForward) Start(ctx context.Context, t *Topology) (Instance, error) {
	if err := t.DUT.SetSysctl("net.ipv4.ip_forward", "1"); err != nil {
		return nil, err
	}
	return stopFunc(func() error { return t.DUT.SetSysctl("net.ipv4.ip_forward", "0") }), nil
}

// XDPRedirect is the DUT mode "xdp-redirect": an XDP program in the DUT's
// ingress veth (bpf/redirect.c, driver mode) rewrites the MACs and
// bpf_redirects every IPv4 frame to the egress veth. No forwarder of this
// path can beat it: it is the ceiling. With OneArm it is "xdp-tx-1arm" on
// PathOneArm: the program sends every frame back out of the veth it came
// in on (XDP_TX), the ceiling of the one-armed path.
type XDPRedirect struct {
	OneArm bool
}

// Name returns "xdp-redirect" or "xdp-tx-1arm".
func (x XDPRedirect) Name() string {
	if x.OneArm {
		return "xdp-tx-1arm"
	}
	return "xdp-redirect"
}

// Shape returns PathOneArm with OneArm, else PathRouted; OutputPlain.
func (x XDPRedirect) Shape() (Path, Output) { return oneArmPath(x.OneArm), OutputPlain }

// Start loads and attaches the program.
func (x XDPRedirect) Start(ctx context.Context, t *Topology) (Instance, error) {
	spec, err := loadRedirect()
	if err != nil {
		return nil, fmt.Errorf("pktrate: redirect program: %w", err)
	}
	out := uint32(t.DUTOut.Index)
	if x.OneArm {
		out = 0 // XDP_TX
	}
	for name, v := range map[string]any{
		"out_ifindex": out,
		"new_dst":     [6]byte(t.SinkLink.MAC),
		"new_src":     [6]byte(t.DUTOut.MAC),
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("pktrate: redirect %s: %w", name, err)
		}
	}
	var objs redirectObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("pktrate: load redirect program: %w", err)
	}
	var lnk link.Link
	err = t.DUT.Do(func() error {
		var err error
		lnk, err = link.AttachXDP(link.XDPOptions{Program: objs.XdpL2redirect, Interface: t.DUTIn.Index, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		objs.Close()
		return nil, fmt.Errorf("pktrate: attach redirect program to %s: %w", t.DUTIn.Name, err)
	}
	return stopFunc(func() error { return errors.Join(lnk.Close(), objs.Close()) }), nil
}

type stopFunc func() error

func (stopFunc) PIDs() []int   { return nil }
func (f stopFunc) Stop() error { return f() }

// Process is a DUT mode run as a program inside the DUT namespace, such as
// examples/l2fwd (Mux and HostAgent run theirs through it). Its arguments
// are templates; these placeholders are replaced:
//
//	{in}        the ingress interface (Topology.DUTIn)
//	{out}       the egress interface (Topology.DUTOut)
//	{in_mac}    {out_mac}   their MAC addresses
//	{next_mac}  the sink's MAC (the next hop's, the frames' new destination)
//	{next_ip}   the sink's address (198.18.1.2)
//
// The program must attach an XDP program to {in} (AF_XDP needs one) when
// it is ready, forward until SIGTERM, and exit on SIGTERM, detaching it.
// Start waits for the XDP program to appear; Stop sends SIGTERM, then
// SIGKILL after StopTimeout, and removes a netlink-attached program the
// process left behind on {in} or {out}.
type Process struct {
	// Label is the mode's name.
	Label string
	// On is the path the program runs on (default PathRouted); Delivers
	// what it delivers to the sink (default OutputPlain).
	On       Path
	Delivers Output
	// Path is the program; Args its argument templates.
	Path string
	Args []string
	// Env is added to the program's environment (KEY=value).
	Env []string
	// ReadyTimeout bounds the wait for the XDP program (default 15 s).
	ReadyTimeout time.Duration
	// StopTimeout bounds the wait after SIGTERM (default 5 s).
	StopTimeout time.Duration
}

// Name returns the Label.
func (p Process) Name() string { return p.Label }

// Shape returns p.On and p.Delivers.
func (p Process) Shape() (Path, Output) { return p.On, p.Delivers }

// ExpandArgs returns p.Args with the placeholders replaced for t.
func (p Process) ExpandArgs(t *Topology) []string {
	r := strings.NewReplacer(
		"{in}", t.DUTIn.Name, "{out}", t.DUTOut.Name,
		"{in_mac}", t.DUTIn.MAC.String(), "{out_mac}", t.DUTOut.MAC.String(),
		"{next_mac}", t.SinkLink.MAC.String(), "{next_ip}", SinkAddr.String(),
	)
	out := make([]string, len(p.Args))
	for i, a := range p.Args {
		out[i] = r.Replace(a)
	}
	return out
}

// Start runs the program and waits until it has attached its XDP program.
func (p Process) Start(ctx context.Context, t *Topology) (Instance, error) {
	if attached, err := t.DUTXDPAttached(); err != nil || attached {
		return nil, fmt.Errorf("pktrate: %s: ingress %s already has an XDP program (or: %v)", p.Label, t.DUTIn.Name, err)
	}
	ready, stop := p.ReadyTimeout, p.StopTimeout
	if ready == 0 {
		ready = 15 * time.Second
	}
	if stop == 0 {
		stop = 5 * time.Second
	}
	out := &tailBuffer{max: 8 << 10}
	// Not ctx: cancelling the harness must still let Stop end the process
	// gracefully so it detaches its program.
	cmd := t.DUT.Command(context.Background(), p.Path, p.ExpandArgs(t)...)
	cmd.Stdout, cmd.Stderr = out, out
	if len(p.Env) > 0 {
		cmd.Env = append(os.Environ(), p.Env...)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pktrate: start %s: %w", p.Label, err)
	}
	pi := &procInstance{p: p, t: t, cmd: cmd, out: out, stopTimeout: stop, exited: make(chan struct{})}
	go func() {
		pi.waitErr = cmd.Wait()
		close(pi.exited)
	}()
	deadline := time.NewTimer(ready)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if attached, err := t.DUTXDPAttached(); err == nil && attached {
			return pi, nil
		}
		select {
		case <-pi.exited:
			return nil, fmt.Errorf("pktrate: %s exited before it attached an XDP program to %s: %v\n%s", p.Label, t.DUTIn.Name, pi.waitErr, out)
		case <-deadline.C:
			err := pi.Stop()
			return nil, fmt.Errorf("pktrate: %s attached no XDP program to %s within %v (stop: %v)\n%s", p.Label, t.DUTIn.Name, ready, err, out)
		case <-ctx.Done():
			pi.Stop()
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

type procInstance struct {
	p           Process
	t           *Topology
	cmd         *exec.Cmd
	out         *tailBuffer
	stopTimeout time.Duration
	exited      chan struct{}
	waitErr     error
	once        sync.Once
	stopErr     error
}

func (pi *procInstance) PIDs() []int { return []int{pi.cmd.Process.Pid} }

func (pi *procInstance) Stop() error {
	pi.once.Do(func() { pi.stopErr = pi.stop() })
	return pi.stopErr
}

func (pi *procInstance) stop() error {
	var errs []error
	select {
	case <-pi.exited:
		errs = append(errs, fmt.Errorf("pktrate: %s exited while measured: %v\n%s", pi.p.Label, pi.waitErr, pi.out))
	default:
		_ = pi.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-pi.exited:
			if !exitedCleanly(pi.waitErr) {
				errs = append(errs, fmt.Errorf("pktrate: %s on SIGTERM: %v\n%s", pi.p.Label, pi.waitErr, pi.out))
			}
		case <-time.After(pi.stopTimeout):
			_ = pi.cmd.Process.Kill()
			<-pi.exited
			errs = append(errs, fmt.Errorf("pktrate: %s ignored SIGTERM for %v; killed", pi.p.Label, pi.stopTimeout))
		}
	}
	// A bpf_link goes with the process; a netlink-attached program stays.
	// Give the kernel a moment, then remove what is left.
	links := []*netlab.Link{pi.t.DUTIn}
	if pi.t.DUTOut != pi.t.DUTIn {
		links = append(links, pi.t.DUTOut)
	}
	for _, l := range links {
		if err := removeXDP(l); err != nil {
			errs = append(errs, fmt.Errorf("pktrate: %s: %w", pi.p.Label, err))
		}
	}
	return errors.Join(errs...)
}

// removeXDP waits up to a second for l's XDP program to go, then detaches
// whatever is left.
func removeXDP(l *netlab.Link) error {
	for i := 0; i < 50; i++ {
		if attached, err := xdpAttached(l); err != nil || !attached {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = l.NS.Do(func() error {
		lk, err := netlink.LinkByIndex(l.Index)
		if err == nil {
			for _, f := range []int{nl.XDP_FLAGS_DRV_MODE, nl.XDP_FLAGS_SKB_MODE} {
				_ = netlink.LinkSetXdpFdWithFlags(lk, -1, f)
			}
		}
		return err
	})
	if attached, err := xdpAttached(l); err != nil || attached {
		return fmt.Errorf("left an XDP program on %s that cannot be removed", l.Name)
	}
	return nil
}

// exitedCleanly: exit status 0, or death by the SIGTERM we sent.
func exitedCleanly(err error) bool {
	if err == nil {
		return true
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return true
		}
	}
	return false
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
