package health

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeClock is a manual clock. Probe loops sleep on its timers; the test
// advances it. Sleep timers (NewTimer) and timeout timers (WithTimeout)
// are told apart so the test can wait until every loop is asleep before
// moving time.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer    // pending
	sleeps []time.Duration // every NewTimer duration, in order
}

type fakeTimer struct {
	c    *fakeClock
	when time.Time
	ch   chan time.Time // sleep timer; nil for a timeout timer
	fn   func()         // timeout timer
}

var epoch = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func newFakeClock() *fakeClock { return &fakeClock{now: epoch} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, when: c.now.Add(d), ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.sleeps = append(c.sleeps, d)
	return t
}

func (c *fakeClock) WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	c.mu.Lock()
	t := &fakeTimer{c: c, when: c.now.Add(d), fn: func() { cancel(context.DeadlineExceeded) }}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	return ctx, func() { t.Stop(); cancel(context.Canceled) }
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	i := slices.Index(t.c.timers, t)
	if i < 0 {
		return false
	}
	t.c.timers = slices.Delete(t.c.timers, i, i+1)
	return true
}

// Advance moves time forward by d and fires the timers that are due.
func (c *fakeClock) Advance(d time.Duration) { c.advanceTo(c.Now().Add(d)) }

func (c *fakeClock) advanceTo(when time.Time) {
	c.mu.Lock()
	if when.After(c.now) {
		c.now = when
	}
	var due []*fakeTimer
	c.timers = slices.DeleteFunc(c.timers, func(t *fakeTimer) bool {
		if !t.when.After(c.now) {
			due = append(due, t)
			return true
		}
		return false
	})
	now := c.now
	c.mu.Unlock()
	slices.SortStableFunc(due, func(a, b *fakeTimer) int { return a.when.Compare(b.when) })
	for _, t := range due {
		if t.ch != nil {
			t.ch <- now
		} else {
			t.fn()
		}
	}
}

func (c *fakeClock) pendingSleeps() (n int, next time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.timers {
		if t.ch == nil {
			continue
		}
		if n == 0 || t.when.Before(next) {
			next = t.when
		}
		n++
	}
	return n, next
}

func (c *fakeClock) sleepLog() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sleeps)
}

// hangGuard bounds every wait for goroutines in these tests; it only
// catches hangs and is never reached by a passing test.
const hangGuard = 20 * time.Second

// waitAsleep waits until exactly n probe loops are asleep on a timer,
// i.e. every loop has finished its previous probe and recorded it.
func (c *fakeClock) waitAsleep(tb testing.TB, n int) time.Time {
	tb.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		k, next := c.pendingSleeps()
		if k == n {
			return next
		}
		if time.Now().After(deadline) {
			tb.Fatalf("fake clock: %d loops asleep, want %d", k, n)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// step waits until n loops are asleep, then advances to the earliest
// wake-up and waits for the loops to be asleep again (so the probes due
// have been run and recorded).
func (c *fakeClock) step(tb testing.TB, n int) {
	tb.Helper()
	next := c.waitAsleep(tb, n)
	c.advanceTo(next)
	c.waitAsleep(tb, n)
}

// result is one scripted probe outcome.
type result struct {
	ok   bool
	took time.Duration // fake time the probe takes (single-loop tests only)
	hang bool          // the probe runs into its timeout
}

var (
	pass     = result{ok: true}
	fail     = result{}
	hang     = result{hang: true}
	errProbe = errors.New("scripted failure")
)

// scriptProber plays back per-address scripts; when a script runs out its
// last result repeats (pass if it was empty).
type scriptProber struct {
	clk *fakeClock

	mu      sync.Mutex
	scripts map[netip.AddrPort][]result
	last    map[netip.AddrPort]result
	calls   map[netip.AddrPort]int
	starts  []time.Time // of every probe, any address
}

func newScriptProber(clk *fakeClock) *scriptProber {
	return &scriptProber{
		clk:     clk,
		scripts: make(map[netip.AddrPort][]result),
		last:    make(map[netip.AddrPort]result),
		calls:   make(map[netip.AddrPort]int),
	}
}

func (p *scriptProber) script(addr netip.AddrPort, rs ...result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.scripts[addr] = append(p.scripts[addr], rs...)
}

func (p *scriptProber) count(addr netip.AddrPort) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[addr]
}

func (p *scriptProber) Probe(ctx context.Context, addr netip.AddrPort, spec Spec) error {
	p.mu.Lock()
	r := pass
	if s := p.scripts[addr]; len(s) > 0 {
		r, p.scripts[addr] = s[0], s[1:]
	} else if l, seen := p.last[addr]; seen {
		r = l
	}
	p.last[addr] = r
	p.calls[addr]++
	p.starts = append(p.starts, p.clk.Now())
	p.mu.Unlock()

	switch {
	case r.hang:
		p.clk.Advance(spec.Timeout)
		if ctx.Err() == nil {
			return errors.New("scriptProber: context still live after its timeout")
		}
		return ctx.Err()
	case r.took > 0:
		p.clk.Advance(r.took)
	}
	if !r.ok {
		return errProbe
	}
	return nil
}

// fixedRand returns the values in turn, then repeats the last.
func fixedRand(vs ...float64) func() float64 {
	var mu sync.Mutex
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		v := vs[0]
		if len(vs) > 1 {
			vs = vs[1:]
		}
		return v
	}
}

func (p *scriptProber) startTimes() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.starts)
}
