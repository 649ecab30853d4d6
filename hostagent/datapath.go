package hostagent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/engine/rawip"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/guard"
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
//	Decap → source filter → partial checksums → nat.Inbound                     (→ the VM's port)
//
// and every VM port through
//
//	Parse{VNI} → client filter → TTL → partial checksums → nat.Return → NextHop(L3Dst)  (→ the uplink, DSR)
//
// (Decap accepts VXLAN only from Plan.TunnelSources; the filters drop
// a client that is a VIP or a martian, package guard; TTL decrements the
// reply's TTL / hop limit, as the host routes it.)
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
	// shared: prog and sockets belong to the running data path this one
	// was built beside (see open); prev is the rules prog held then,
	// restored if this build is dropped.
	shared bool
	prev   steer.Config
}

// open builds the data path for plan and attaches its programs. On error
// everything it built is released, and the running data path is left as
// it was.
//
// run, when not nil, is the data path running now (a rebuild), and open
// builds beside it: it must not stop it, and on error run keeps
// forwarding its version. The interfaces both serve are shared: the new
// data path takes run's steering programs, attached, and its sockets,
// bound and registered (it only resyncs the programs' rules, live, as a
// live update does), so nothing is detached or unbound at the swap and
// what arrives while the workers are replaced waits in the sockets'
// rings. What only the new plan serves (a new VM port) is built whole
// here — program loaded and attached, sockets opened and registered —
// while run forwards: whatever fails there (a foreign XDP program on the
// new port, an interface without the queues, no memory for the rings)
// fails the build before anything of run is touched.
func (a *Agent) open(plan *Plan, dips *nat.DIPs, up *net.Interface, resolver *nexthop.Resolver, run *dataPath) (_ *dataPath, err error) {
	dp := &dataPath{plan: plan}
	defer func() {
		if err != nil {
			if derr := dp.discard(run); derr != nil {
				err = errors.Join(err, derr)
			}
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
		if old := run.iface(name); old != nil {
			// A socket is bound to one queue of one interface, and a
			// queue takes one socket: a second set cannot be opened
			// beside the running one.
			if old.index != ifi.Index || old.queues != q || len(old.sockets) != q {
				return nil, fmt.Errorf("hostagent: %s changed under the running data path (ifindex %d → %d, queues %d → %d); "+
					"restart the agent to serve it as it is now", name, old.index, ifi.Index, old.queues, q)
			}
			f.prog, f.attached, f.sockets, f.shared, f.prev = old.prog, true, old.sockets, true, old.prog.Config()
			// Live, as a document that keeps the structure does
			// (dataPath.steer): on error the previous rules come back
			// (discard).
			if err := f.prog.Sync(cfg); err != nil {
				return f, fmt.Errorf("hostagent: steering rules of %s: %w", name, err)
			}
			return f, nil
		}
		prog, err := steer.Load(steer.Options{})
		if err != nil {
			return nil, fmt.Errorf("hostagent: load the steering program for %s: %w", name, err)
		}
		f.prog = prog
		if err := f.prog.Sync(cfg); err != nil {
			return f, fmt.Errorf("hostagent: steering rules of %s: %w", name, err)
		}
		// Frames steered while a queue has no socket (during a rebuild)
		// are dropped: passed to the kernel, a VM's reply would leave
		// untranslated and make the client reset its connection.
		if err := f.prog.SetDropNoSocket(true); err != nil {
			return f, fmt.Errorf("hostagent: steering program of %s: %w", name, err)
		}
		return f, nil
	}
	if dp.uplink, err = newIface(up.Name, plan.Uplink); err != nil {
		return nil, err
	}
	for _, vp := range plan.Ports {
		f, err := newIface(vp.Interface, vp.Steer)
		if f != nil {
			dp.vms = append(dp.vms, f)
		}
		if err != nil {
			return nil, err
		}
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
	dp.nat.SetDIPs(dips)
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
		cfgs[w] = engine.WorkerConfig{ID: w, IdleSpins: a.cfg.IdleSpins, Snapshot: a.batchSnapshot}
	}
	all := append([]*iface{dp.uplink}, dp.vms...)
	for i, f := range all {
		handed := f.shared
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

	// Attach last: from now on the steered traffic reaches the sockets
	// (and waits in their rings until the workers run). Shared programs
	// are attached already. A foreign XDP program on the interface fails
	// the build here (steer.ErrForeignProgram).
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
	if len(plan.TunnelSources) == 0 {
		return nil, nil, fmt.Errorf("hostagent: %w", ErrNoTunnelSources)
	}
	decap, err := encap.NewDecap(encap.DecapConfig{Addrs: []netip.Addr{plan.Host.Address},
		Port: plan.Host.VXLANPort, Sources: plan.TunnelSources}, &a.endpoints)
	if err != nil {
		return nil, nil, fmt.Errorf("hostagent: %w", err)
	}
	// Spoofed clients: a request from a VIP or a martian (inner source),
	// a reply to one (destination on the return path). Infrastructure
	// sources are the NAT stages' (nat_infra).
	inSrc, err := guard.NewSources(guard.SourcesConfig{Rules: a.rules})
	if err != nil {
		return nil, nil, fmt.Errorf("hostagent: %w", err)
	}
	retDst, err := guard.NewSources(guard.SourcesConfig{Rules: a.rules, Destination: true})
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
	// The return path routes the VM's packets: their TTL / hop limit goes
	// down by one (guard.TTL), so a loop nobody thought of ends. Before
	// nat.Return, which hands direct connections to the slow path at once
	// (Emit): the host routes those too.
	inbound := engine.NewPipeline(decap, inSrc, a.partialStage(a.cfg.Uplink), tr.Inbound())
	returns := make([]*engine.Pipeline, len(plan.Ports))
	for i, vp := range plan.Ports {
		returns[i] = engine.NewPipeline(engine.Parse{VNI: vp.VNI}, retDst, guard.TTL{}, a.partialStage(vp.Interface),
			tr.Return(), nh)
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

// iface returns the interface named name that dp serves, or nil (also
// when dp is nil).
func (dp *dataPath) iface(name string) *iface {
	if dp == nil {
		return nil
	}
	for _, f := range append([]*iface{dp.uplink}, dp.vms...) {
		if f != nil && f.name == name {
			return f
		}
	}
	return nil
}

// close detaches the programs (steered traffic goes to the kernel again),
// closes the sockets and frees the programs. The workers must have
// stopped.
func (dp *dataPath) close() { dp.release(nil) }

// retire closes what of dp, whose workers have stopped, next does not
// share (see open): the programs and sockets of the interfaces next does
// not serve, and the slow path.
func (dp *dataPath) retire(next *dataPath) { dp.release(next) }

// discard drops dp, a build whose workers never ran: it releases what dp
// built and gives the interfaces it shares with run, the data path still
// forwarding, their previous steering rules back. run is untouched
// otherwise. An error means a program's rules could not be restored
// (they are between the two sets; a later Sync converges).
func (dp *dataPath) discard(run *dataPath) error {
	dp.release(run)
	var errs []error
	for _, f := range append([]*iface{dp.uplink}, dp.vms...) {
		if f != nil && f.shared {
			if err := f.prog.Sync(f.prev); err != nil {
				errs = append(errs, fmt.Errorf("hostagent: restore the steering rules of %s: %w", f.name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// release detaches and closes the programs and closes the sockets of dp,
// except those it shares with keep (nil: none), and closes the slow path.
func (dp *dataPath) release(keep *dataPath) {
	kept := map[*steer.Program]bool{}
	keptPort := map[*afxdp.Port]bool{}
	if keep != nil {
		for _, f := range append([]*iface{keep.uplink}, keep.vms...) {
			if f != nil && f.prog != nil {
				kept[f.prog] = true
				for _, p := range f.sockets {
					keptPort[p] = true
				}
			}
		}
	}
	all := append([]*iface{dp.uplink}, dp.vms...)
	// Detach first: steered traffic goes to the kernel again rather than
	// to sockets about to close.
	for _, f := range all {
		if f != nil && f.prog != nil && !kept[f.prog] {
			_ = f.prog.Detach()
		}
	}
	// Closing a socket takes it out of its program's XSKMAP.
	closed := map[*afxdp.Port]bool{}
	closePort := func(p *afxdp.Port) {
		if p != nil && !keptPort[p] && !closed[p] {
			closed[p] = true
			_ = p.Close()
		}
	}
	for _, p := range dp.ports {
		closePort(p)
	}
	for _, f := range all {
		if f != nil {
			for _, p := range f.sockets { // opened, not yet in dp.ports
				closePort(p)
			}
		}
	}
	if dp.slow != nil {
		_ = dp.slow.Close()
	}
	for _, f := range all {
		if f != nil && f.prog != nil && !kept[f.prog] {
			_ = f.prog.Close()
		}
	}
}
