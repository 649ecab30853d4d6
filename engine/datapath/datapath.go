package datapath

import (
	"errors"
	"fmt"
	"net"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/rawip"
	"github.com/xdplb/xdplb/engine/steer"
)

// DataPath is an open data path: the live object of a Spec, holding the
// steering programs, the AF_XDP sockets, the slow-path port and the
// workers. Its methods are not safe for concurrent use with each other;
// the accessors may be called from anywhere once Open has returned.
type DataPath struct {
	spec    Spec
	layout  Layout
	links   []*link // by Spec.Interfaces
	slow    *rawip.Port
	eng     *engine.Engine
	sockets int
	// beside is the running data path this one was built beside (Open),
	// until TakeOver or Discard.
	beside   *DataPath
	released bool // release ran: everything not kept is closed
}

// link is one interface of a data path, live.
type link struct {
	name     string
	index    int
	queues   int // served: sockets on queues 0..queues-1
	prog     *steer.Program
	attached bool
	drop     bool          // the program's DropNoSocket
	sockets  []*afxdp.Port // by queue; nil entries not opened yet
	// shared: prog and sockets belong to beside too; prev and prevDrop
	// are what prog held there, restored by Discard.
	shared   bool
	prev     steer.Config
	prevDrop bool
}

// Link is one interface of an open data path, for metrics and tests.
type Link struct {
	Name    string
	Ifindex int
	Program *steer.Program
	Sockets []*afxdp.Port // by queue
}

// Open validates spec and makes it live (see the package documentation
// for the steps). beside, when not nil, is a data path running now: Open
// builds beside it, sharing the interfaces both serve, and never stops
// it. On error everything Open made is released, the shared programs get
// their previous rules back, and beside is as it was.
func Open(spec Spec, beside *DataPath) (_ *DataPath, err error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	dp := &DataPath{spec: spec, layout: spec.Layout(), beside: beside}
	defer func() {
		if err != nil {
			if derr := dp.Discard(); derr != nil {
				err = errors.Join(err, derr)
			}
		}
	}()

	// 1. Interfaces and their programs, with their rules.
	queues := make([]int, len(spec.Interfaces))
	ifindex := make([]int, len(spec.Interfaces))
	for i := range spec.Interfaces {
		l, err := dp.openLink(&spec.Interfaces[i])
		if l != nil {
			dp.links = append(dp.links, l)
		}
		if err != nil {
			return nil, err
		}
		queues[i], ifindex[i] = l.queues, l.index
	}
	workers, err := workerCount(queues, spec.Workers)
	if err != nil {
		return nil, err
	}

	// 2. The slow path: never shared, each data path has its own.
	if spec.SlowPath {
		if dp.slow, err = rawip.Open("kernel"); err != nil {
			return nil, fmt.Errorf("datapath: slow path: %w", err)
		}
	}

	// 3. Sockets, one per (interface, served queue), registered in the
	// interface's XSKMAP.
	for _, l := range dp.links {
		if l.shared {
			dp.sockets += len(l.sockets)
			continue
		}
		l.sockets = make([]*afxdp.Port, l.queues)
		for q := range l.queues {
			pc := spec.Port
			pc.Name, pc.Interface, pc.Ifindex, pc.Queue = fmt.Sprintf("%s:%d", l.name, q), l.name, 0, q
			p, err := afxdp.Open(pc)
			if err != nil {
				return nil, fmt.Errorf("datapath: open %s queue %d: %w", l.name, q, err)
			}
			l.sockets[q] = p
			dp.sockets++
			if err := l.prog.RegisterSocket(q, p.FD()); err != nil {
				return nil, fmt.Errorf("datapath: %s queue %d: %w", l.name, q, err)
			}
		}
	}

	// 4. Pipelines and workers, every worker's ports numbered alike.
	ws := make([]*engine.Worker, workers)
	extra := extras(queues, workers)
	for w := range ws {
		cfg := engine.WorkerConfig{ID: w, IdleSpins: spec.IdleSpins, Snapshot: spec.Snapshot}
		pipes := make([]*engine.Pipeline, len(dp.links))
		for i, l := range dp.links {
			pl, err := spec.Pipeline(Input{Interface: i, Name: l.name, Worker: w, Workers: workers,
				Ifindex: ifindex, Layout: dp.layout})
			if err != nil {
				return nil, fmt.Errorf("datapath: pipeline of %s, worker %d: %w", l.name, w, err)
			}
			if pl == nil {
				return nil, fmt.Errorf("datapath: no pipeline for %s, worker %d", l.name, w)
			}
			pipes[i] = pl
			cfg.Ports = append(cfg.Ports, l.sockets[w])
			cfg.Inputs = append(cfg.Inputs, engine.Input{Port: i, Pipeline: pl})
		}
		if dp.slow != nil {
			cfg.Ports = append(cfg.Ports, dp.slow)
		}
		for _, s := range extra[w] {
			cfg.Ports = append(cfg.Ports, dp.links[s.Iface].sockets[s.Queue])
			cfg.Inputs = append(cfg.Inputs, engine.Input{Port: len(cfg.Ports) - 1, Pipeline: pipes[s.Iface]})
		}
		if ws[w], err = engine.NewWorker(cfg); err != nil {
			return nil, fmt.Errorf("datapath: worker %d: %w", w, err)
		}
	}
	if dp.eng, err = engine.New(ws...); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}

	// 5. Attach last. Shared programs are attached already.
	for _, l := range dp.links {
		if l.attached {
			continue
		}
		if err := l.prog.Attach(l.index, spec.XDPMode); err != nil {
			return nil, fmt.Errorf("datapath: attach the steering program to %s: %w", l.name, err)
		}
		l.attached = true
	}

	// 6. The shared programs take the new rules, live.
	if err := dp.syncShared(); err != nil {
		return nil, err
	}
	return dp, nil
}

// syncShared gives the programs dp shares with the running data path
// the new spec's rules, live, as a rule update of the running data path:
// the entries both keep stay steered throughout. Open's last step: a
// build that fails before it never changed what the running one steers.
func (dp *DataPath) syncShared() error {
	for i, l := range dp.links {
		if !l.shared {
			continue
		}
		f := &dp.spec.Interfaces[i]
		if err := l.prog.Sync(f.Steer); err != nil {
			return fmt.Errorf("datapath: steering rules of %s: %w", f.Name, err)
		}
		if f.DropNoSocket != l.drop {
			if err := l.prog.SetDropNoSocket(f.DropNoSocket); err != nil {
				return fmt.Errorf("datapath: steering program of %s: %w", f.Name, err)
			}
			l.drop = f.DropNoSocket
		}
	}
	return nil
}

// openLink resolves the interface f and gives it a program with f's
// rules: beside's, shared, or a new one. A returned link (also with an
// error) has something to release or restore.
func (dp *DataPath) openLink(f *Interface) (*link, error) {
	ifi, err := net.InterfaceByName(f.Name)
	if err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	n, err := afxdp.QueueCount(f.Name)
	if err != nil {
		return nil, fmt.Errorf("datapath: queues of %s: %w", f.Name, err)
	}
	served := n
	if f.Queues > 0 {
		if f.Queues > n {
			return nil, fmt.Errorf("datapath: %s has %d RX queues, %d asked", f.Name, n, f.Queues)
		}
		served = f.Queues
	}
	l := &link{name: f.Name, index: ifi.Index, queues: served}
	if old := dp.beside.link(f.Name); old != nil {
		if old.index != ifi.Index || old.queues != served {
			return nil, fmt.Errorf("%w: %s (ifindex %d → %d, queues %d → %d); restart the node to serve it as it is now",
				ErrInterfaceChanged, f.Name, old.index, ifi.Index, old.queues, served)
		}
		l.prog, l.attached, l.sockets, l.shared = old.prog, true, old.sockets, true
		l.prev, l.prevDrop, l.drop = old.prog.Config(), old.drop, old.drop
		// Its rules change last (syncShared), once everything else is
		// built: until then the running data path steers by its own.
		return l, nil
	}
	if l.prog, err = steer.Load(dp.spec.Program); err != nil {
		return nil, fmt.Errorf("datapath: load the steering program for %s: %w", f.Name, err)
	}
	if err := l.prog.Sync(f.Steer); err != nil {
		return l, fmt.Errorf("datapath: steering rules of %s: %w", f.Name, err)
	}
	if f.DropNoSocket {
		if err := l.prog.SetDropNoSocket(true); err != nil {
			return l, fmt.Errorf("datapath: steering program of %s: %w", f.Name, err)
		}
		l.drop = true
	}
	return l, nil
}

// link returns the interface named name that dp serves, or nil (also
// when dp is nil).
func (dp *DataPath) link(name string) *link {
	if dp == nil {
		return nil
	}
	for _, l := range dp.links {
		if l.name == name {
			return l
		}
	}
	return nil
}

// Spec returns the spec dp was opened from.
func (dp *DataPath) Spec() Spec { return dp.spec }

// Layout returns dp's port numbering.
func (dp *DataPath) Layout() Layout { return dp.layout }

// Engine returns dp's workers. Run it; once it has stopped, Close dp (or
// hand it over: TakeOver of the next data path).
func (dp *DataPath) Engine() *engine.Engine { return dp.eng }

// SlowPath returns the slow-path port (nil without one).
func (dp *DataPath) SlowPath() *rawip.Port { return dp.slow }

// Sockets returns how many AF_XDP sockets dp reads.
func (dp *DataPath) Sockets() int { return dp.sockets }

// Links returns dp's interfaces, in Spec.Interfaces order.
func (dp *DataPath) Links() []Link {
	out := make([]Link, len(dp.links))
	for i, l := range dp.links {
		out[i] = Link{Name: l.name, Ifindex: l.index, Program: l.prog, Sockets: l.sockets}
	}
	return out
}

// Steer replaces the steering rules of every interface, live, with
// rules[i] for interface i (a document that keeps the data path's
// structure), whole or not at all: when an interface refuses its rules
// (steer.Program.Sync, which undoes its own part), the interfaces before
// it get their running rules back, so a node refusing the version keeps
// steering the one it runs. Only if putting them back fails too — the
// error then says so — are rules left between the two sets; a later
// Steer converges.
func (dp *DataPath) Steer(rules ...steer.Config) error {
	if len(rules) != len(dp.links) {
		return fmt.Errorf("datapath: %d steering configs for %d interfaces", len(rules), len(dp.links))
	}
	running := make([]steer.Config, len(dp.links))
	for i, l := range dp.links {
		running[i] = l.prog.Config()
	}
	for i, l := range dp.links {
		if err := l.prog.Sync(rules[i]); err != nil {
			errs := []error{fmt.Errorf("%s: %w", l.name, err)}
			for j, done := range dp.links[:i] {
				if rerr := done.prog.Sync(running[j]); rerr != nil {
					errs = append(errs, fmt.Errorf("%s: putting the running rules back: %w", done.name, rerr))
				}
			}
			return errors.Join(errs...)
		}
	}
	return nil
}

// TakeOver makes dp, built beside a data path whose workers have now
// stopped, the owner of everything: it releases what of the old data
// path dp does not share (the programs and sockets of interfaces dp does
// not serve, the old slow path). Nothing here can fail. Without a data
// path beside, it does nothing.
func (dp *DataPath) TakeOver() {
	old := dp.beside
	if old == nil {
		return
	}
	dp.beside = nil
	old.release(dp)
	for _, l := range dp.links {
		l.shared = false
	}
}

// Discard drops dp, whose workers never ran: it releases what dp opened
// and gives the programs it shares with the data path it was built
// beside their previous rules back; that data path is untouched
// otherwise. Without a data path beside, it is Close. An error means a
// program's rules could not be restored (they are between the two sets; a
// later Steer converges).
func (dp *DataPath) Discard() error {
	dp.release(dp.beside)
	var errs []error
	for _, l := range dp.links {
		if !l.shared {
			continue
		}
		if err := l.prog.Sync(l.prev); err != nil {
			errs = append(errs, fmt.Errorf("datapath: restore the steering rules of %s: %w", l.name, err))
		}
		if l.drop != l.prevDrop {
			if err := l.prog.SetDropNoSocket(l.prevDrop); err != nil {
				errs = append(errs, fmt.Errorf("datapath: restore the steering program of %s: %w", l.name, err))
			}
		}
	}
	dp.beside = nil
	return errors.Join(errs...)
}

// Close detaches the programs (steered traffic goes to the kernel again),
// closes the sockets and the slow path and frees the programs. The
// workers must have stopped. A data path built beside another and not
// yet handed over (TakeOver) must be dropped with Discard instead.
func (dp *DataPath) Close() error {
	if dp.beside != nil {
		return errors.New("datapath: Close of a data path built beside another: TakeOver or Discard it")
	}
	dp.release(nil)
	return nil
}

// release detaches and closes the programs and closes the sockets of dp,
// except those it shares with keep (nil: none), and closes its slow
// path.
func (dp *DataPath) release(keep *DataPath) {
	if dp.released {
		return // a raw socket's descriptor must not be closed twice
	}
	dp.released = true
	keptProg := map[*steer.Program]bool{}
	keptPort := map[*afxdp.Port]bool{}
	if keep != nil {
		for _, l := range keep.links {
			keptProg[l.prog] = true
			for _, p := range l.sockets {
				keptPort[p] = true
			}
		}
	}
	// Detach first: steered traffic goes to the kernel again rather than
	// to sockets about to close.
	for _, l := range dp.links {
		if l.prog != nil && l.attached && !keptProg[l.prog] {
			_ = l.prog.Detach()
			l.attached = false
		}
	}
	// Closing a socket takes it out of its program's XSKMAP.
	for _, l := range dp.links {
		for _, p := range l.sockets {
			if p != nil && !keptPort[p] {
				_ = p.Close()
			}
		}
	}
	if dp.slow != nil {
		_ = dp.slow.Close()
	}
	for _, l := range dp.links {
		if l.prog != nil && !keptProg[l.prog] {
			_ = l.prog.Close()
		}
	}
}
