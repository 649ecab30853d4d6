package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Input is a port a worker receives from and the pipeline its frames run
// through. Port is an index into WorkerConfig.Ports.
type Input struct {
	Port     int
	Pipeline *Pipeline
}

// WorkerConfig describes a worker: the ports it may transmit on (indexed by
// Packet.OutPort) and the inputs it polls, in order.
type WorkerConfig struct {
	ID     int // 0..MaxWorkers-1, distinct among an Engine's workers
	Ports  []Port
	Inputs []Input
	// Clock returns monotonic nanoseconds; read once per batch. Default:
	// time elapsed since the worker was made.
	Clock func() int64
	// IdleWaitMs is how long an idle worker waits for frames (Waiter ports)
	// or sleeps before polling again (default 1).
	IdleWaitMs int
	// IdleSpins is how many empty polls in a row a worker makes, yielding
	// the processor between them, before it waits. 0 waits at once: a
	// Waiter port's Wait (poll(2)) returns as soon as a frame arrives, so
	// latency stays low and an idle worker costs no CPU. Raise it to trade
	// CPU for latency at high rates (busy polling).
	IdleSpins int
	// CheckEvery is how often Run checks the worker's ports that
	// implement Checker, from a goroutine beside the worker (default
	// DefaultCheckEvery). A failed port stops the worker with its error
	// after at most CheckEvery plus one idle wait or 64 busy polls.
	CheckEvery time.Duration
	// Snapshot, when set, returns the configuration snapshot a batch runs
	// with (Batch.Snapshot), e.g. the Load of a node's atomic.Pointer; it
	// is called once per batch received, before the pipeline.
	Snapshot func() any
}

// DefaultCheckEvery is the default WorkerConfig.CheckEvery.
const DefaultCheckEvery = 200 * time.Millisecond

// Worker moves batches from its inputs through their pipelines to its
// ports. A worker is single-goroutine: Poll and Run must not be called
// concurrently; Counters may be read from anywhere.
type Worker struct {
	cfg      WorkerConfig
	counters Counters
	batch    Batch
	pool     [MaxBatch]Packet
	scratch  [MaxBatch]*Packet
	groups   [MaxBatch]*Packet
	failed   atomic.Pointer[error] // set by the port checker: Run stops
}

// NewWorker checks cfg and returns a worker.
func NewWorker(cfg WorkerConfig) (*Worker, error) {
	if cfg.ID < 0 || cfg.ID >= MaxWorkers {
		// Stages keep per-worker state by this index (PerWorker).
		return nil, fmt.Errorf("engine: worker ID %d is outside 0..%d", cfg.ID, MaxWorkers-1)
	}
	if len(cfg.Ports) == 0 || len(cfg.Ports) > 1<<16 {
		return nil, errors.New("engine: a worker needs between 1 and 65536 ports")
	}
	if len(cfg.Inputs) == 0 {
		return nil, errors.New("engine: a worker needs at least one input")
	}
	for i, in := range cfg.Inputs {
		if in.Port < 0 || in.Port >= len(cfg.Ports) {
			return nil, fmt.Errorf("engine: input %d names port %d, but the worker has %d ports", i, in.Port, len(cfg.Ports))
		}
		if in.Pipeline == nil {
			return nil, fmt.Errorf("engine: input %d has no pipeline", i)
		}
	}
	for i, p := range cfg.Ports {
		if p == nil {
			return nil, fmt.Errorf("engine: port %d is nil", i)
		}
	}
	if cfg.Clock == nil {
		start := time.Now()
		cfg.Clock = func() int64 { return int64(time.Since(start)) }
	}
	if cfg.IdleWaitMs <= 0 {
		cfg.IdleWaitMs = 1
	}
	if cfg.CheckEvery <= 0 {
		cfg.CheckEvery = DefaultCheckEvery
	}
	if cfg.IdleSpins < 0 {
		return nil, errors.New("engine: IdleSpins must not be negative")
	}
	w := &Worker{cfg: cfg}
	w.batch.Worker = cfg.ID
	w.batch.Counters = &w.counters
	return w, nil
}

// Counters returns the worker's counters.
func (w *Worker) Counters() *Counters { return &w.counters }

// ID returns the worker's index.
func (w *Worker) ID() int { return w.cfg.ID }

// Poll receives one batch from each input, runs it through the input's
// pipeline and transmits the result, then flushes every port. It returns
// the number of packets received. It never blocks.
func (w *Worker) Poll() int {
	total := 0
	for _, in := range w.cfg.Inputs {
		total += w.pollInput(in)
	}
	for _, p := range w.cfg.Ports {
		_ = p.Flush() // errors surface through the port's own stats
	}
	w.counters.publish()
	return total
}

func (w *Worker) pollInput(in Input) int {
	b := &w.batch
	b.Reset()
	port := w.cfg.Ports[in.Port]
	n := port.Receive(b, w.pool[:], uint16(in.Port))
	if n == 0 {
		return 0
	}
	b.Now = w.cfg.Clock()
	if w.cfg.Snapshot != nil {
		b.Snapshot = w.cfg.Snapshot()
	}
	w.counters.rx += uint64(n)
	w.counters.batches++
	in.Pipeline.Process(b)
	b.Finish()
	w.transmit(b)
	w.release(b)
	b.Snapshot = nil // an idle worker holds no old configuration
	return n
}

// transmit hands live packets to their out ports, in groups.
func (w *Worker) transmit(b *Batch) {
	pkts := b.Packets()
	if len(pkts) == 0 {
		return
	}
	out := pkts[0].OutPort
	same := true
	for _, p := range pkts[1:] {
		if p.OutPort != out {
			same = false
			break
		}
	}
	if same {
		w.send(b, out, pkts)
		return
	}
	// Group by out port: repeatedly take the packets for the first port
	// left. Batches are small and rarely split more than two ways.
	rest := w.scratch[:0]
	rest = append(rest, pkts...)
	for len(rest) > 0 {
		out = rest[0].OutPort
		g := w.groups[:0]
		k := 0
		for _, p := range rest {
			if p.OutPort == out {
				g = append(g, p)
			} else {
				rest[k] = p
				k++
			}
		}
		rest = rest[:k]
		w.send(b, out, g)
	}
}

func (w *Worker) send(b *Batch, out uint16, pkts []*Packet) {
	if int(out) >= len(w.cfg.Ports) {
		for _, p := range pkts {
			p.Verdict, p.Reason = VerdictDrop, DropNoOutPort
			w.counters.countDrop(DropNoOutPort)
		}
		return
	}
	k := w.cfg.Ports[out].Transmit(pkts)
	w.counters.tx += uint64(k)
	for _, p := range pkts[k:] {
		// A port may say why it refused a frame; the default is a full
		// transmit ring.
		if p.Reason == 0 {
			p.Reason = DropTXFull
		}
		p.Verdict = VerdictDrop
		w.counters.countDrop(p.Reason)
	}
}

// release returns every frame of the batch that no port took to its owner.
// Frames almost always come from the input port, so that case is one call.
func (w *Worker) release(b *Batch) {
	rel := w.scratch[:0]
	var owner Port
	mixed := false
	add := func(p *Packet) {
		if p.sent {
			return
		}
		if len(rel) == 0 {
			owner = p.owner
		} else if p.owner != owner {
			mixed = true
		}
		rel = append(rel, p)
	}
	for _, p := range b.Packets() {
		add(p)
	}
	for _, p := range b.Dropped() {
		add(p)
	}
	if len(rel) == 0 {
		return
	}
	if !mixed {
		owner.Release(rel)
		return
	}
	for len(rel) > 0 {
		o := rel[0].owner
		g := w.groups[:0]
		k := 0
		for _, p := range rel {
			if p.owner == o {
				g = append(g, p)
			} else {
				rel[k] = p
				k++
			}
		}
		rel = rel[:k]
		o.Release(g)
	}
}

// Run polls until ctx is done, on a goroutine locked to its OS thread.
// When no input had a packet it waits on the first input port if it is a
// Waiter, otherwise it sleeps IdleWaitMs.
//
// Ports that implement Checker are checked every CheckEvery from a
// goroutine beside the worker (never on the packet path); when one fails,
// or a Waiter's Wait fails, Run returns the error: a dead port stops its
// worker instead of being polled in vain.
func (w *Worker) Run(ctx context.Context) error {
	stopChecks := w.startChecks()
	defer stopChecks()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var waiter Waiter
	if wt, ok := w.cfg.Ports[w.cfg.Inputs[0].Port].(Waiter); ok && len(w.cfg.Inputs) == 1 {
		waiter = wt
	}
	idle := 0
	done := ctx.Done()
	for polls := 0; ; polls++ {
		// A busy worker checks for cancellation every 64 polls, an idle
		// one every time.
		if w.Poll() > 0 {
			idle = 0
			if polls&63 == 0 {
				select {
				case <-done:
					return nil
				default:
				}
				if err := w.failed.Load(); err != nil {
					return *err
				}
			}
			continue
		}
		select {
		case <-done:
			return nil
		default:
		}
		if err := w.failed.Load(); err != nil {
			return *err
		}
		idle++
		if idle <= w.cfg.IdleSpins {
			runtime.Gosched()
			continue
		}
		if waiter != nil {
			if err := waiter.Wait(w.cfg.IdleWaitMs); err != nil {
				return err
			}
		} else {
			time.Sleep(time.Duration(w.cfg.IdleWaitMs) * time.Millisecond)
		}
	}
}

// startChecks starts the goroutine that checks the worker's Checker
// ports every CheckEvery and records the first failure in w.failed; it
// returns the function that stops it.
func (w *Worker) startChecks() (stop func()) {
	var checkers []Checker
	var names []string
	for _, p := range w.cfg.Ports {
		if c, ok := p.(Checker); ok {
			checkers = append(checkers, c)
			names = append(names, p.Name())
		}
	}
	if len(checkers) == 0 {
		return func() {}
	}
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(w.cfg.CheckEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			for i, c := range checkers {
				if err := c.Check(); err != nil {
					err = fmt.Errorf("port %s failed: %w", names[i], err)
					w.failed.CompareAndSwap(nil, &err)
					return
				}
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// Engine runs a set of workers, one goroutine (and OS thread) each.
type Engine struct {
	workers []*Worker
}

// New returns an engine over workers, whose IDs must differ.
func New(workers ...*Worker) (*Engine, error) {
	if len(workers) == 0 {
		return nil, errors.New("engine: no workers")
	}
	ids := make(map[int]bool, len(workers))
	for _, w := range workers {
		if ids[w.ID()] {
			// Stages shared by the workers keep per-worker state by index
			// (PerWorker): two workers with one index would race.
			return nil, fmt.Errorf("engine: two workers have ID %d", w.ID())
		}
		ids[w.ID()] = true
	}
	return &Engine{workers: workers}, nil
}

// Workers returns the engine's workers.
func (e *Engine) Workers() []*Worker { return e.workers }

// Run runs every worker until ctx is done or one fails; it returns the
// first error.
func (e *Engine) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(e.workers))
	for _, w := range e.workers {
		wg.Add(1)
		go func(w *Worker) {
			defer wg.Done()
			if err := w.Run(ctx); err != nil {
				errs <- fmt.Errorf("engine: worker %d: %w", w.ID(), err)
				cancel()
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Stats sums the counters of every worker.
func (e *Engine) Stats() Stats {
	var s Stats
	for _, w := range e.workers {
		w.counters.Snapshot(&s)
	}
	return s
}
