package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Errors returned by a Checker.
var (
	// ErrInvalidTarget is wrapped by Set's errors about a target.
	ErrInvalidTarget = errors.New("health: invalid target")
	// ErrClosed: the Checker was closed.
	ErrClosed = errors.New("health: checker closed")
	// ErrRunning: Run was called while the Checker was already running.
	ErrRunning = errors.New("health: checker already running")
)

// CheckerConfig configures a Checker. The zero value is usable: probes over
// real sockets from the kernel-chosen source, no events, no logs.
type CheckerConfig struct {
	// Logger receives state changes (Info for up, Warn for down) and, at
	// Debug, probe schedules and failed probes. Nil discards.
	Logger *slog.Logger
	// Prober runs the probes. Nil means a NetProber with Source and
	// DialContext below; set either those or Prober, not both.
	Prober Prober
	// DialContext, when set, opens every probe connection (see
	// NetProber.DialContext), e.g. from inside a network namespace.
	DialContext func(ctx context.Context, network, address string) (net.Conn, error)
	// Source, when valid, is the local address probes are sent from (to
	// targets of its family): one of the infrastructure addresses listed
	// in the desired-state document, which hosts never NAT.
	Source netip.Addr
	// OnChange, when set, is told of every state change. See Checker for
	// how and when it is called.
	OnChange func(Event)
	// OnChanges, when set, is told of state changes in batches: every
	// change queued since its previous call returned, in order, at once
	// (a lone change is delivered as soon as it happens, a batch of one).
	// A consumer that does work per call rather than per change (a Mux
	// publishing a rule snapshot) thus keeps up however fast changes come.
	// It is called like OnChange, after it for each batch when both are
	// set. The slice is the callee's to keep.
	OnChanges func([]Event)
	// Rand returns numbers uniform in [0, 1) for the schedule's jitter; nil
	// means math/rand/v2. Tests inject a deterministic one. The Checker
	// serialises its calls.
	Rand func() float64

	clock clock // nil: real time; tests set a fake
}

// Target is one thing to probe: usually one backend of one VIP.
type Target struct {
	// Key names the target uniquely within a Set, e.g. "web/vm-a"
	// (VIP name / backend name).
	Key string
	// Addr is the DIP and port. Spec.Port, when set, replaces the port.
	Addr netip.AddrPort
	// Spec says how to probe. Set applies WithDefaults to it.
	Spec Spec
}

// Event is a state change of one target.
type Event struct {
	Key  string
	Addr netip.AddrPort // the probed address
	Old  State
	New  State
	// Time is when the deciding probe finished.
	Time time.Time
	// Reason says why, e.g. "3 consecutive failures: ..." or "first probe
	// succeeded".
	Reason string
	// Err is the deciding probe's error (nil for a change to Up).
	Err error
}

// Status is what a Checker knows about one target.
type Status struct {
	Key   string
	Addr  netip.AddrPort // the probed address (Spec.Port applied)
	Spec  Spec           // with defaults applied
	State State
	// Since is when the target entered State (for Unknown: when it was
	// added).
	Since time.Time
	// LastProbe is when the latest probe finished; zero before the first.
	LastProbe time.Time
	// LastOK is the latest probe's result, LastErr its error (nil if OK),
	// LastRTT how long it took.
	LastOK  bool
	LastErr error
	LastRTT time.Duration
	// ConsecutiveOK and ConsecutiveFail count the latest run of equal
	// results (one of them is zero). They restart when the Spec changes.
	ConsecutiveOK   int
	ConsecutiveFail int
	// Probes and Failures count probes finished and failed since the
	// target was added (they survive Spec changes; the Mux exports them).
	Probes   uint64
	Failures uint64
}

// Checker probes a set of targets, each on its own schedule, and keeps
// each one's state with the rise/fall machine.
//
// Each target has one goroutine while the Checker runs; a probe starts
// Interval (±IntervalJitter) after the previous one ended, and the first
// probe of a target is placed uniformly at random within one Interval of
// its start so that targets added together do not probe together.
//
// OnChange is called from one goroutine owned by the Checker, never
// concurrently with itself, in the order the changes happened (so in order
// per target). State, Status and Snapshot already show the change when
// OnChange sees it. A slow OnChange delays later events but not probing.
// OnChange may call State, Status, Snapshot and Set, but not Close. The
// same holds for OnChanges, from the same goroutine: each call gets every
// change that queued up while the previous call ran, so changes coalesce
// under load without delaying a lone one.
//
// All methods are safe for concurrent use.
type Checker struct {
	log    *slog.Logger
	prober Prober
	clock  clock
	notify func(Event)
	batch  func([]Event)

	randMu sync.Mutex
	rand   func() float64

	mu      sync.Mutex
	targets map[string]*target
	closed  bool
	running bool
	runCtx  context.Context
	stopRun context.CancelFunc
	runDone chan struct{} // closed when the latest Run has returned
	events  []Event       // waiting for OnChange
	wake    chan struct{} // cap 1: events were queued

	loops sync.WaitGroup
}

type target struct {
	addr netip.AddrPort // as given (the Target's Addr)
	spec Spec
	m    machine
	st   Status
	loop *loop // the running probe loop; nil when not running
}

// loop identifies one probe goroutine; a result from a loop that is no
// longer its target's current one is discarded.
type loop struct{ cancel context.CancelFunc }

// NewChecker returns a Checker with no targets. It starts nothing: call
// Set and Run.
func NewChecker(cfg CheckerConfig) (*Checker, error) {
	c := &Checker{
		log:     cfg.Logger,
		prober:  cfg.Prober,
		clock:   cfg.clock,
		notify:  cfg.OnChange,
		batch:   cfg.OnChanges,
		rand:    cfg.Rand,
		targets: make(map[string]*target),
		wake:    make(chan struct{}, 1),
	}
	if c.prober != nil && (cfg.DialContext != nil || cfg.Source.IsValid()) {
		return nil, errors.New("health: CheckerConfig: set Prober or DialContext/Source, not both")
	}
	if c.prober == nil {
		c.prober = &NetProber{Source: cfg.Source, DialContext: cfg.DialContext}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.clock == nil {
		c.clock = realClock{}
	}
	if c.rand == nil {
		c.rand = rand.Float64
	}
	return c, nil
}

// probeAddr is the address a target's probes go to.
func probeAddr(addr netip.AddrPort, spec Spec) netip.AddrPort {
	if spec.Port != 0 {
		return netip.AddrPortFrom(addr.Addr(), spec.Port)
	}
	return addr
}

func checkTarget(t Target) error {
	if t.Key == "" {
		return errors.New("empty key")
	}
	if !t.Addr.Addr().IsValid() {
		return errors.New("no address")
	}
	if probeAddr(t.Addr, t.Spec).Port() == 0 {
		return errors.New("no port to probe (neither the address nor the probe has one)")
	}
	return t.Spec.Validate()
}

// Set makes targets the set being probed, whole or not at all: if any
// target is invalid (empty or duplicate key, no address, no port, a Spec
// that fails Validate after WithDefaults) Set changes nothing and returns
// every problem, each wrapping ErrInvalidTarget.
//
// Set reconciles rather than restarts, so that a configuration reload does
// not reset health:
//   - a target whose key, address and spec are unchanged keeps its state,
//     counters and probe schedule;
//   - a changed spec restarts the target's schedule and consecutive counts
//     but keeps its state (an Up backend is not pulled out of the table
//     because its probe path changed; the new probe must fail Fall times);
//   - a changed address is a new target: state Unknown, counters zero;
//   - keys no longer present stop being probed and are forgotten (a probe
//     in flight is abandoned and produces no event).
//
// Set may be called before Run; the targets start when Run does.
func (c *Checker) Set(targets []Target) error {
	next := make(map[string]Target, len(targets))
	var errs []error
	for i, t := range targets {
		t.Spec = t.Spec.WithDefaults()
		t.Addr = netip.AddrPortFrom(t.Addr.Addr().Unmap(), t.Addr.Port())
		err := checkTarget(t)
		if _, dup := next[t.Key]; dup && err == nil {
			err = errors.New("duplicate key")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%w %d (%q): %w", ErrInvalidTarget, i, t.Key, err))
			continue
		}
		next[t.Key] = t
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	for key, t := range c.targets {
		if _, ok := next[key]; !ok {
			c.stopLoop(t)
			delete(c.targets, key)
		}
	}
	now := c.clock.Now()
	for key, nt := range next {
		t, ok := c.targets[key]
		switch {
		case !ok || t.addr != nt.Addr:
			if ok {
				c.stopLoop(t)
			}
			t = &target{addr: nt.Addr, spec: nt.Spec}
			t.st = Status{Key: key, Addr: probeAddr(nt.Addr, nt.Spec), Spec: nt.Spec, State: Unknown, Since: now}
			c.targets[key] = t
		case t.spec != nt.Spec:
			c.stopLoop(t)
			t.spec = nt.Spec
			t.m.resetCounts()
			t.st.Spec = nt.Spec
			t.st.Addr = probeAddr(nt.Addr, nt.Spec)
			t.st.ConsecutiveOK, t.st.ConsecutiveFail = 0, 0
		default:
			continue // unchanged: keep the loop
		}
		if c.running {
			c.startLoop(key, t)
		}
	}
	return nil
}

// startLoop starts t's probe goroutine. c.mu is held and c is running.
func (c *Checker) startLoop(key string, t *target) {
	ctx, cancel := context.WithCancel(c.runCtx)
	l := &loop{cancel: cancel}
	t.loop = l
	c.loops.Add(1)
	go c.probeLoop(ctx, key, t, l, probeAddr(t.addr, t.spec), t.spec)
}

// stopLoop cancels t's probe goroutine, if any. c.mu is held.
func (c *Checker) stopLoop(t *target) {
	if t.loop != nil {
		t.loop.cancel()
		t.loop = nil
	}
}

func (c *Checker) random() float64 {
	c.randMu.Lock()
	r := c.rand()
	c.randMu.Unlock()
	if !(r >= 0 && r < 1) { // also NaN
		r = 0
	}
	return r
}

// firstDelay places a target's first probe uniformly in [0, interval).
func (c *Checker) firstDelay(interval time.Duration) time.Duration {
	return time.Duration(c.random() * float64(interval))
}

// nextDelay is interval ±IntervalJitter, uniform.
func (c *Checker) nextDelay(interval time.Duration) time.Duration {
	return interval + time.Duration((2*c.random()-1)*IntervalJitter*float64(interval))
}

// targetKeyCtx is the context key under which a probe's context carries
// its target's key.
type targetKeyCtx struct{}

// TargetKey returns the key of the Target whose probe ctx belongs to: a
// Checker sets it on every probe's context, so that a Prober (or a
// NetProber's DialContext, which gets the probe's context) can tell apart
// targets with the same address, e.g. two tenants' DIPs reached through
// different interfaces. It returns "" for any other context.
func TargetKey(ctx context.Context) string {
	k, _ := ctx.Value(targetKeyCtx{}).(string)
	return k
}

func (c *Checker) probeLoop(ctx context.Context, key string, t *target, l *loop, addr netip.AddrPort, spec Spec) {
	defer c.loops.Done()
	ctx = context.WithValue(ctx, targetKeyCtx{}, key)
	wait := c.firstDelay(spec.Interval)
	c.log.Debug("health: probe schedule", "target", key, "addr", addr, "probe", spec, "first_probe_in", wait)
	for {
		tm := c.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			tm.Stop()
			return
		case <-tm.C():
		}
		if ctx.Err() != nil { // both were ready
			return
		}
		start := c.clock.Now()
		pctx, cancel := c.clock.WithTimeout(ctx, spec.Timeout)
		err := c.prober.Probe(pctx, addr, spec)
		if ctx.Err() == nil {
			err = timeoutError(pctx, err)
		}
		cancel()
		if ctx.Err() != nil {
			return // removed, respecified or stopping: the result is moot
		}
		end := c.clock.Now()
		if err != nil {
			c.log.Debug("health: probe failed", "target", key, "addr", addr, "err", err)
		}
		if ev, ok := c.record(t, l, start, end, err); ok {
			level := slog.LevelInfo
			if ev.New == Down {
				level = slog.LevelWarn
			}
			attrs := []any{"target", key, "addr", addr, "old", ev.Old.String(), "new", ev.New.String(), "reason", ev.Reason}
			if ev.Err != nil {
				attrs = append(attrs, "err", ev.Err)
			}
			c.log.Log(ctx, level, "health: state change", attrs...)
		}
		wait = c.nextDelay(spec.Interval)
	}
}

// record applies one probe result to t, unless l is no longer t's loop.
// It reports the state change, if any, which it has also queued for
// OnChange.
func (c *Checker) record(t *target, l *loop, start, end time.Time, err error) (Event, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.loop != l {
		return Event{}, false
	}
	ok := err == nil
	st := &t.st
	st.Probes++
	if !ok {
		st.Failures++
	}
	st.LastProbe, st.LastOK, st.LastErr, st.LastRTT = end, ok, err, end.Sub(start)
	old, changed := t.m.record(ok, t.spec.Rise, t.spec.Fall)
	st.ConsecutiveOK, st.ConsecutiveFail = t.m.okRun, t.m.failRun
	if !changed {
		return Event{}, false
	}
	st.State, st.Since = t.m.state, end
	ev := Event{Key: st.Key, Addr: st.Addr, Old: old, New: t.m.state, Time: end, Err: err, Reason: reason(old, t.m)}
	if c.notify != nil || c.batch != nil {
		c.events = append(c.events, ev)
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	return ev, true
}

func reason(old State, m machine) string {
	switch {
	case old == Unknown && m.state == Up:
		return "first probe succeeded"
	case old == Unknown:
		return "first probe failed"
	case m.state == Up:
		return fmt.Sprintf("%d consecutive successes", m.okRun)
	default:
		return fmt.Sprintf("%d consecutive failures", m.failRun)
	}
}

// State returns the state of the target with key, and whether there is
// one.
func (c *Checker) State(key string) (State, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.targets[key]
	if !ok {
		return Unknown, false
	}
	return t.st.State, true
}

// Status returns the status of the target with key, and whether there is
// one.
func (c *Checker) Status(key string) (Status, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.targets[key]
	if !ok {
		return Status{}, false
	}
	return t.st, true
}

// Snapshot returns the status of every target, by key.
func (c *Checker) Snapshot() map[string]Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]Status, len(c.targets))
	for k, t := range c.targets {
		m[k] = t.st
	}
	return m
}

// Run probes the targets until ctx ends or Close is called, then stops
// every probe (abandoning those in flight), delivers the events already
// queued to OnChange, and returns: ctx's error if ctx ended, nil after
// Close. Targets keep their state across Runs. Run returns ErrRunning if
// another Run is active and ErrClosed after Close.
func (c *Checker) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.running {
		c.mu.Unlock()
		return ErrRunning
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	c.running, c.runCtx, c.stopRun, c.runDone = true, runCtx, stop, done
	for key, t := range c.targets {
		c.startLoop(key, t)
	}
	c.mu.Unlock()

	finish := make(chan struct{})
	dispatched := make(chan struct{})
	go c.dispatch(finish, dispatched)

	<-runCtx.Done()
	c.mu.Lock()
	c.running = false
	for _, t := range c.targets {
		c.stopLoop(t)
	}
	c.mu.Unlock()
	c.loops.Wait()
	close(finish)
	<-dispatched
	stop()
	close(done)
	return ctx.Err()
}

// dispatch calls OnChange for queued events, in order, until finish is
// closed and the queue is empty.
func (c *Checker) dispatch(finish <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	finishing := false
	for {
		c.mu.Lock()
		evs := c.events
		c.events = nil
		c.mu.Unlock()
		if c.notify != nil {
			for _, ev := range evs {
				c.notify(ev)
			}
		}
		if c.batch != nil && len(evs) > 0 {
			c.batch(evs)
		}
		if len(evs) > 0 {
			continue
		}
		if finishing {
			return
		}
		select {
		case <-c.wake:
		case <-finish:
			finishing = true
		}
	}
}

// Close stops a running Checker and waits for Run to return; afterwards
// Set and Run return ErrClosed. It is idempotent and must not be called
// from OnChange.
func (c *Checker) Close() error {
	c.mu.Lock()
	c.closed = true
	done := c.runDone
	if c.stopRun != nil {
		c.stopRun()
	}
	c.mu.Unlock()
	if done != nil {
		<-done
	}
	return nil
}
