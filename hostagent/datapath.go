package hostagent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/engine/rawip"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/nat"
)

// dataPath is one build of the data path for one plan structure: a
// steering program per interface, an AF_XDP socket per (interface, queue),
// the NAT translator and the workers.
//
// Worker w owns the sockets on queue w of every interface: port 0 is the
// uplink's, port 1+i VM port i's (VMPort.Index), so a packet's OutPort
// means the same interface in every worker and each worker transmits only
// on sockets it owns. Its inputs are those sockets, the uplink through
//
//	Decap → partial checksums → nat.Inbound                          (→ the VM's port)
//
// and every VM port through
//
//	Parse{VNI} → partial checksums → nat.Return → NextHop(L3Dst)     (→ the uplink, DSR)
//
// Sockets on queues at or above the worker count (an interface with more
// queues than another) are extra inputs of worker queue % workers.
type dataPath struct {
	plan   *Plan
	uplink *iface
	vms    []*iface // in plan.Ports order
	ports  []*afxdp.Port
	slow   *rawip.Port // replies the data path cannot address: to the kernel
	nat    *nat.Translator
	eng    *engine.Engine
}

// iface is one interface the data path serves.
type iface struct {
	name     string
	index    int
	queues   int
	prog     *steer.Program
	attached bool          // prog is attached to the interface
	sockets  []*afxdp.Port // by queue
}

// open builds the data path for plan and attaches its programs. On error
// everything built so far is released.
//
// kept is what a previous data path handed over (a rebuild, see
// dataPath.close): by interface name, its steering programs, still
// attached, and its sockets, still bound and registered. open takes over
// those of the interfaces it still serves — new rules, the same sockets,
// never detached or unbound, so what arrives during the rebuild waits in
// the sockets' rings instead of being dropped — and releases the others.
func (a *Agent) open(plan *Plan, dips *nat.Locals, up *net.Interface, resolver *nexthop.Resolver, kept *handover) (_ *dataPath, err error) {
	dp := &dataPath{plan: plan}
	if kept == nil {
		kept = &handover{}
	}
	defer func() {
		kept.release() // not taken over
		if err != nil {
			dp.close(false)
		}
	}()
	newIface := func(name string, cfg steer.Config) (*iface, error) {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return nil, fmt.Errorf("hostagent: %w", err)
		}
		q, err := afxdp.QueueCount(name)
		if err != nil {
			return nil, fmt.Errorf("hostagent: queues of %s: %w", name, err)
		}
		f := &iface{name: name, index: ifi.Index, queues: q}
		if prog := kept.progs[name]; prog != nil && int(prog.Options().MaxQueues) >= q {
			delete(kept.progs, name)
			f.prog, f.attached = prog, true
			if socks := kept.sockets[name]; len(socks) == q {
				f.sockets = socks // bound to this interface's queues still
				delete(kept.sockets, name)
			}
		} else {
			prog, err := steer.Load(steer.Options{})
			if err != nil {
				return nil, fmt.Errorf("hostagent: load the steering program for %s: %w", name, err)
			}
			f.prog = prog
		}
		if err := f.prog.Sync(cfg); err != nil {
			f.prog.Close()
			return nil, fmt.Errorf("hostagent: steering rules of %s: %w", name, err)
		}
		// Frames steered while a queue has no socket (during a rebuild)
		// are dropped: passed to the kernel, a VM's reply would leave
		// untranslated and make the client reset its connection.
		if err := f.prog.SetDropNoSocket(true); err != nil {
			f.prog.Close()
			return nil, fmt.Errorf("hostagent: steering program of %s: %w", name, err)
		}
		return f, nil
	}
	if dp.uplink, err = newIface(up.Name, plan.Uplink); err != nil {
		return nil, err
	}
	for _, vp := range plan.Ports {
		f, err := newIface(vp.Interface, vp.Steer)
		if err != nil {
			return nil, err
		}
		dp.vms = append(dp.vms, f)
	}

	// Workers: at most the fewest queues of any interface.
	workers := dp.uplink.queues
	for _, f := range dp.vms {
		workers = min(workers, f.queues)
	}
	if n := a.cfg.Workers; n > 0 {
		if n > workers {
			return nil, fmt.Errorf("hostagent: %d workers asked, but an interface has only %d queues "+
				"(each worker transmits on a socket of its own per interface)", n, workers)
		}
		workers = n
	}

	// Direct connections to a DIP (not through a VIP) leave by the slow
	// path untranslated: the host's kernel routes them.
	if dp.nat, err = nat.New(nat.Config{Rules: a.rules, Table: a.table, Uplink: UplinkPort, Infra: plan.Infra,
		Direct: slowPort(plan), HasDirect: true}); err != nil {
		return nil, fmt.Errorf("hostagent: %w", err)
	}
	dp.nat.SetLocals(dips)
	// The slow path: a reply to a client whose next hop the resolver has
	// not resolved yet (the first reply into a route it has not seen, or
	// to a client behind an ECMP route or on-link) goes through the kernel
	// instead of being dropped.
	if dp.slow, err = rawip.Open("kernel"); err != nil {
		return nil, fmt.Errorf("hostagent: %w", err)
	}
	inbound, returns, err := a.pipelines(plan, dp.nat, up.Index, resolver)
	if err != nil {
		return nil, err
	}

	// Sockets, one per (interface, queue), registered in the
	// interface's XSKMAP; worker configurations.
	cfgs := make([]engine.WorkerConfig, workers)
	for w := range cfgs {
		cfgs[w] = engine.WorkerConfig{ID: w, IdleSpins: a.cfg.IdleSpins}
	}
	all := append([]*iface{dp.uplink}, dp.vms...)
	for i, f := range all {
		handed := f.sockets != nil
		if !handed {
			f.sockets = make([]*afxdp.Port, f.queues)
		}
		pl := inbound
		if i > 0 {
			pl = returns[i-1]
		}
		for q := 0; q < f.queues; q++ {
			port := f.sockets[q]
			if !handed {
				pc := a.cfg.Port
				pc.Name, pc.Interface, pc.Ifindex, pc.Queue = fmt.Sprintf("%s:%d", f.name, q), f.name, 0, q
				if port, err = afxdp.Open(pc); err != nil {
					return nil, fmt.Errorf("hostagent: open %s queue %d: %w", f.name, q, err)
				}
				f.sockets[q] = port
			}
			dp.ports = append(dp.ports, port)
			if !handed {
				if err := f.prog.RegisterSocket(q, port.FD()); err != nil {
					return nil, err
				}
			}
			if q < workers {
				// Worker q's own socket on this interface: port i.
				wc := &cfgs[q]
				wc.Ports = append(wc.Ports, port)
				wc.Inputs = append(wc.Inputs, engine.Input{Port: i, Pipeline: pl})
			}
		}
	}
	// The slow-path port follows the shared layout: port slowPort(plan)
	// of every worker. Extra queues go after it, as receive-only inputs.
	for w := range cfgs {
		cfgs[w].Ports = append(cfgs[w].Ports, dp.slow)
	}
	for _, f := range all {
		for q := workers; q < f.queues; q++ {
			pl := inbound
			if f != dp.uplink {
				pl = returns[indexOf(dp.vms, f)]
			}
			wc := &cfgs[q%workers]
			wc.Ports = append(wc.Ports, f.sockets[q])
			wc.Inputs = append(wc.Inputs, engine.Input{Port: len(wc.Ports) - 1, Pipeline: pl})
		}
	}
	ws := make([]*engine.Worker, workers)
	for w := range cfgs {
		if ws[w], err = engine.NewWorker(cfgs[w]); err != nil {
			return nil, err
		}
	}
	if dp.eng, err = engine.New(ws...); err != nil {
		return nil, err
	}

	// Attach last: from now on the steered traffic reaches the sockets.
	// Programs taken over from the previous data path are attached
	// already (their sockets were registered above).
	for _, f := range all {
		if f.attached {
			continue
		}
		if err := f.prog.Attach(f.index, a.cfg.XDPMode); err != nil {
			return nil, fmt.Errorf("hostagent: attach the steering program to %s: %w", f.name, err)
		}
		f.attached = true
	}
	return dp, nil
}

// pipelines returns the uplink's pipeline and each VM port's (in
// plan.Ports order), over the translator tr; replies leave through the
// interface uplinkIndex, resolved by r. The stages are safe for concurrent
// use: every worker shares them.
func (a *Agent) pipelines(plan *Plan, tr *nat.Translator, uplinkIndex int, r encap.Resolver) (*engine.Pipeline, []*engine.Pipeline, error) {
	decap, err := encap.NewDecap(encap.DecapConfig{Addrs: []netip.Addr{plan.Host.Address},
		Port: plan.Host.VXLANPort, Sources: a.cfg.TunnelSources}, &a.endpoints)
	if err != nil {
		return nil, nil, fmt.Errorf("hostagent: %w", err)
	}
	nh, err := encap.NewNextHop(encap.NextHopConfig{Mode: encap.L3Dst, Ports: map[int]uint16{uplinkIndex: UplinkPort},
		SlowPath: true, SlowPort: slowPort(plan)}, r)
	if err != nil {
		return nil, nil, fmt.Errorf("hostagent: %w", err)
	}
	// Partial checksums are completed before NAT rewrites them
	// (engine.PartialChecksums): VMs and containers on this machine always
	// send them, and so may clients on the Muxes' machines.
	inbound := engine.NewPipeline(decap, a.partialStage(a.cfg.Uplink), tr.Inbound())
	returns := make([]*engine.Pipeline, len(plan.Ports))
	for i, vp := range plan.Ports {
		returns[i] = engine.NewPipeline(engine.Parse{VNI: vp.VNI}, a.partialStage(vp.Interface), tr.Return(), nh)
	}
	return inbound, returns, nil
}

// partialStage returns the partial-checksum stage of the input interface
// ifname, the same one across data path rebuilds so its count survives
// them.
func (a *Agent) partialStage(ifname string) *engine.PartialChecksums {
	a.partialMu.Lock()
	defer a.partialMu.Unlock()
	if a.partial == nil {
		a.partial = map[string]*engine.PartialChecksums{}
	}
	s := a.partial[ifname]
	if s == nil {
		s = engine.NewPartialChecksums()
		a.partial[ifname] = s
	}
	return s
}

// slowPort is the index of the slow-path port in every worker's ports:
// after the uplink and the VM ports.
func slowPort(plan *Plan) uint16 { return uint16(1 + len(plan.Ports)) }

func indexOf(fs []*iface, f *iface) int {
	for i := range fs {
		if fs[i] == f {
			return i
		}
	}
	return -1
}

// steer replaces the steering rules of every interface with plan's (same
// structure). Called with the agent's lock held.
func (dp *dataPath) steer(plan *Plan) error {
	var errs []error
	if err := dp.uplink.prog.Sync(plan.Uplink); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", dp.uplink.name, err))
	}
	for i, f := range dp.vms {
		if err := f.prog.Sync(plan.Ports[i].Steer); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.name, err))
		}
	}
	return errors.Join(errs...)
}

// close detaches the programs (steered traffic goes to the kernel again),
// closes the sockets and frees the programs. The workers must have
// stopped. With keep (a rebuild) the attached programs stay attached, with
// no sockets, and are returned by interface name for the next open: the
// frames they steer meanwhile are dropped (SetDropNoSocket) rather than
// handed to the kernel.
func (dp *dataPath) close(keep bool) *handover {
	all := append([]*iface{dp.uplink}, dp.vms...)
	if !keep {
		for _, f := range all {
			if f != nil && f.prog != nil {
				_ = f.prog.Detach()
			}
		}
	}
	var kept *handover
	handed := map[*afxdp.Port]bool{}
	if keep {
		kept = &handover{progs: map[string]*steer.Program{}, sockets: map[string][]*afxdp.Port{}}
		for _, f := range all {
			if f == nil || f.prog == nil || !f.attached {
				continue
			}
			kept.progs[f.name] = f.prog
			if len(f.sockets) == f.queues && !slices.Contains(f.sockets, nil) {
				kept.sockets[f.name] = f.sockets
				for _, p := range f.sockets {
					handed[p] = true
				}
			}
		}
	}
	// Closing a socket takes it out of its program's XSKMAP.
	for _, p := range dp.ports {
		if !handed[p] {
			_ = p.Close()
		}
	}
	if dp.slow != nil {
		_ = dp.slow.Close()
	}
	for _, f := range all {
		if f == nil || f.prog == nil || kept != nil && kept.progs[f.name] == f.prog {
			continue
		}
		_ = f.prog.Detach()
		_ = f.prog.Close()
	}
	return kept
}

// handover is what a data path stopped for a rebuild hands to the next:
// by interface name, the steering programs, still attached, and the
// sockets of every queue, still bound and registered in their programs.
type handover struct {
	progs   map[string]*steer.Program
	sockets map[string][]*afxdp.Port
}

// release closes the sockets and detaches and closes the programs the
// next data path did not take over.
func (h *handover) release() {
	if h == nil {
		return
	}
	for name, socks := range h.sockets {
		for _, p := range socks {
			_ = p.Close()
		}
		delete(h.sockets, name)
	}
	for name, prog := range h.progs {
		_ = prog.Detach()
		_ = prog.Close()
		delete(h.progs, name)
	}
}
