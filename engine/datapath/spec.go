package datapath

import (
	"errors"
	"fmt"
	"strings"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/steer"
)

// Sentinel errors; returned errors wrap them (errors.Is).
var (
	// ErrInvalidSpec wraps every Validate failure.
	ErrInvalidSpec = errors.New("datapath: invalid spec")
	// ErrInterfaceChanged: Open beside a running data path found an
	// interface both serve changed under the running one (another
	// ifindex — deleted and recreated — or another number of queues). A
	// queue takes one socket, so a second set cannot be opened beside the
	// running one: restart the node to serve the interface as it is now.
	ErrInterfaceChanged = errors.New("datapath: interface changed under the running data path")
)

// Spec describes a data path. It is a plain value apart from its two
// functions (Pipeline, Snapshot): Validate checks it, Layout numbers its
// ports, Open makes it live. Nothing in it is resolved against the system
// until Open.
type Spec struct {
	// Interfaces are the interfaces served, in port order (see the
	// package documentation, "Port numbering"): port i of every worker
	// is Interfaces[i]'s socket on that worker's queue.
	Interfaces []Interface
	// Workers is how many workers to run; 0 means as many as the
	// interface with the fewest served queues has. It may not be more:
	// each worker owns a transmit socket on every interface.
	Workers int
	// SlowPath adds the slow-path port (engine/rawip, named "kernel"),
	// port len(Interfaces) of every worker: frames the data path cannot
	// address itself go to the kernel's IP output.
	SlowPath bool
	// Port is the template of every AF_XDP socket (ring sizes, frames,
	// bind mode, ring implementation); Name, Interface, Ifindex and
	// Queue are set per socket.
	Port afxdp.Config
	// XDPMode is how the steering programs are attached.
	XDPMode steer.AttachMode
	// Program sizes every steering program's maps.
	Program steer.Options
	// IdleSpins is every worker's engine.WorkerConfig.IdleSpins.
	IdleSpins int
	// Snapshot is every worker's engine.WorkerConfig.Snapshot (may be
	// nil): the node's configuration, loaded once per batch.
	Snapshot func() any
	// Pipeline returns the pipeline of one input: interface
	// in.Interface's sockets read by worker in.Worker. Open calls it once
	// per (interface, worker), workers in order, then interfaces in
	// order; a worker's extra receive-only sockets of an interface run
	// through that same pipeline. It may return one pipeline for every
	// worker (its stages are then shared between goroutines and must
	// keep per-worker state by engine.Batch.Worker) or one per worker.
	Pipeline func(in Input) (*engine.Pipeline, error)
}

// Interface is one interface a data path serves.
type Interface struct {
	// Name is the interface's name in the network namespace Open runs in.
	Name string
	// Queues is how many RX queues to serve, 0..Queues-1 (0: all of
	// them). A queue without a socket gets nothing steered: its traffic
	// passes to the kernel, or is dropped with DropNoSocket.
	Queues int
	// Steer is the steering program's rules: what of the interface's
	// traffic reaches the data path.
	Steer steer.Config
	// DropNoSocket makes the program drop steered frames on a queue that
	// has no socket instead of passing them to the kernel
	// (steer.Program.SetDropNoSocket): where a frame the kernel handles
	// would do harm, as a VM's reply leaving untranslated.
	DropNoSocket bool
}

// Input is what Spec.Pipeline is told about the input it makes a
// pipeline for.
type Input struct {
	// Interface is the input's index in Spec.Interfaces, which is also
	// its port number; Name is its name.
	Interface int
	Name      string
	// Worker is the worker that reads it, one of Workers.
	Worker, Workers int
	// Ifindex is every interface's index, in Spec.Interfaces order (a
	// next-hop stage maps egress interfaces to ports with it).
	Ifindex []int
	// Layout is the data path's port numbering.
	Layout Layout
}

// Layout is the port numbering every worker of a data path shares (see
// the package documentation, "Port numbering").
type Layout struct {
	// Interfaces names the data ports: port i is Interfaces[i]'s socket.
	Interfaces []string
	// SlowPath says whether port len(Interfaces) is the slow path.
	SlowPath bool
}

// Layout returns the spec's port numbering.
func (s Spec) Layout() Layout {
	names := make([]string, len(s.Interfaces))
	for i := range s.Interfaces {
		names[i] = s.Interfaces[i].Name
	}
	return Layout{Interfaces: names, SlowPath: s.SlowPath}
}

// Port returns the port of the interface named name.
func (l Layout) Port(name string) (uint16, bool) {
	for i, n := range l.Interfaces {
		if n == name {
			return uint16(i), true
		}
	}
	return 0, false
}

// Slow returns the slow-path port: right after the data ports. ok is
// false without a slow path.
func (l Layout) Slow() (port uint16, ok bool) {
	return uint16(len(l.Interfaces)), l.SlowPath
}

// Extra returns the first port of the receive-only sockets: after the
// data ports and the slow path.
func (l Layout) Extra() int {
	if l.SlowPath {
		return len(l.Interfaces) + 1
	}
	return len(l.Interfaces)
}

// String shows the numbering, e.g. "0:eth0 1:vm1 2:slow".
func (l Layout) String() string {
	var b strings.Builder
	for i, n := range l.Interfaces {
		fmt.Fprintf(&b, "%d:%s ", i, n)
	}
	if p, ok := l.Slow(); ok {
		fmt.Fprintf(&b, "%d:slow ", p)
	}
	return strings.TrimSuffix(b.String(), " ")
}

// maxIfname is the longest interface name Linux takes (IFNAMSIZ − 1).
const maxIfname = 15

// Validate checks the spec without touching the system: at least one
// interface, valid and distinct names, queue and worker counts in range,
// valid steering rules and AF_XDP port template, a Pipeline. The errors
// wrap ErrInvalidSpec.
func (s Spec) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, args...))
	}
	if len(s.Interfaces) == 0 {
		return bad("no interfaces")
	}
	// Ports are uint16, and the slow path may take one.
	if len(s.Interfaces) >= 1<<16-1 {
		return bad("%d interfaces: at most %d", len(s.Interfaces), 1<<16-2)
	}
	seen := make(map[string]int, len(s.Interfaces))
	fewest := 0 // of the interfaces with a set queue count; 0: none set
	for i := range s.Interfaces {
		f := &s.Interfaces[i]
		if err := checkIfname(f.Name); err != nil {
			return bad("interfaces[%d]: %v", i, err)
		}
		if j, dup := seen[f.Name]; dup {
			return bad("interfaces[%d] and [%d] are both %q: an interface's queue takes one socket", j, i, f.Name)
		}
		seen[f.Name] = i
		if f.Queues < 0 {
			return bad("interfaces[%d] (%s): %d queues is negative", i, f.Name, f.Queues)
		}
		if f.Queues > 0 && (fewest == 0 || f.Queues < fewest) {
			fewest = f.Queues
		}
		if err := f.Steer.Validate(); err != nil {
			return bad("interfaces[%d] (%s): steering rules: %v", i, f.Name, err)
		}
	}
	switch {
	case s.Workers < 0:
		return bad("%d workers is negative", s.Workers)
	case s.Workers > engine.MaxWorkers:
		return bad("%d workers: at most %d", s.Workers, engine.MaxWorkers)
	case fewest > 0 && s.Workers > fewest:
		return bad("%d workers, but an interface serves only %d queues (each worker transmits on a socket of its own per interface)",
			s.Workers, fewest)
	}
	if s.IdleSpins < 0 {
		return bad("IdleSpins %d is negative", s.IdleSpins)
	}
	port := s.Port
	port.Interface, port.Ifindex, port.Queue = s.Interfaces[0].Name, 0, 0
	if err := port.Validate(); err != nil {
		return bad("port template: %v", err)
	}
	if s.Pipeline == nil {
		return bad("no Pipeline")
	}
	return nil
}

// checkIfname applies the kernel's rule for interface names
// (dev_valid_name): 1 to 15 bytes, no '/', ':' or white space, not "."
// or "..".
func checkIfname(name string) error {
	switch {
	case name == "":
		return errors.New("no name")
	case len(name) > maxIfname:
		return fmt.Errorf("name %q is longer than %d bytes", name, maxIfname)
	case name == "." || name == "..":
		return fmt.Errorf("name %q is not an interface name", name)
	case strings.ContainsAny(name, "/: \t\n\v\f\r"):
		return fmt.Errorf("name %q has a '/', ':' or white space", name)
	}
	return nil
}

// workerCount returns how many workers serve interfaces with these
// served queue counts: asked, or (0) the fewest queues.
func workerCount(queues []int, asked int) (int, error) {
	fewest := queues[0]
	for _, q := range queues[1:] {
		fewest = min(fewest, q)
	}
	if fewest <= 0 {
		return 0, errors.New("datapath: an interface has no RX queue to serve")
	}
	if asked == 0 {
		return min(fewest, engine.MaxWorkers), nil
	}
	if asked > fewest {
		return 0, fmt.Errorf("datapath: %d workers asked, but an interface has only %d queues "+
			"(each worker transmits on a socket of its own per interface)", asked, fewest)
	}
	return asked, nil
}

// socket names one AF_XDP socket: queue Queue of interface Iface.
type socket struct{ Iface, Queue int }

// extras returns, per worker, its receive-only sockets: those on queues at
// or above the worker count, queue q read by worker q % workers, in
// interface then queue order. They are the worker's ports from
// Layout.Extra on.
func extras(queues []int, workers int) [][]socket {
	out := make([][]socket, workers)
	for i, n := range queues {
		for q := workers; q < n; q++ {
			out[q%workers] = append(out[q%workers], socket{i, q})
		}
	}
	return out
}
