package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu   sync.Mutex
	recs []logRec
}

type logRec struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := logRec{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Resolve().String()
		return true
	})
	h.mu.Lock()
	h.recs = append(h.recs, rec)
	h.mu.Unlock()
	return nil
}

func (h *logRecorder) find(msg string) []logRec {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logRec
	for _, r := range h.recs {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

func (h *logRecorder) count(msg, target string) int {
	n := 0
	for _, r := range h.find(msg) {
		if r.attrs["target"] == target {
			n++
		}
	}
	return n
}

// eventLog collects OnChange calls and checks they never overlap.
type eventLog struct {
	mu       sync.Mutex
	events   []Event
	inFlight atomic.Int32
	overlap  atomic.Bool
}

func (l *eventLog) onChange(ev Event) {
	if l.inFlight.Add(1) > 1 {
		l.overlap.Store(true)
	}
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
	l.inFlight.Add(-1)
}

func (l *eventLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

func (l *eventLog) byKey() map[string][]Event {
	m := map[string][]Event{}
	for _, ev := range l.all() {
		m[ev.Key] = append(m[ev.Key], ev)
	}
	return m
}

// checkChains asserts every key's events form a chain (each Old is the
// previous New, starting from Unknown) and OnChange never overlapped.
func (l *eventLog) checkChains(t *testing.T) {
	t.Helper()
	assert.False(t, l.overlap.Load(), "OnChange ran concurrently")
	for key, evs := range l.byKey() {
		prev := Unknown
		for i, ev := range evs {
			if i > 0 && ev.Old == Unknown {
				prev = Unknown // the target was replaced (address change)
			}
			assert.Equal(t, prev, ev.Old, "%s event %d", key, i)
			assert.NotEqual(t, ev.Old, ev.New)
			prev = ev.New
		}
	}
}

// fakeEnv is a Checker on a fake clock with scripted probes.
type fakeEnv struct {
	clk  *fakeClock
	pr   *scriptProber
	c    *Checker
	ev   *eventLog
	logs *logRecorder
	done chan error
}

func newFakeEnv(t *testing.T, rnd func() float64) *fakeEnv {
	t.Helper()
	clk := newFakeClock()
	e := &fakeEnv{clk: clk, pr: newScriptProber(clk), ev: &eventLog{}, logs: &logRecorder{}}
	c, err := NewChecker(CheckerConfig{
		Logger:   slog.New(e.logs),
		Prober:   e.pr,
		OnChange: e.ev.onChange,
		Rand:     rnd,
		clock:    clk,
	})
	require.NoError(t, err)
	e.c = c
	return e
}

func (e *fakeEnv) run(t *testing.T) {
	e.done = make(chan error, 1)
	go func() { e.done <- e.c.Run(context.Background()) }()
	t.Cleanup(func() { e.stop(t) })
}

// stop closes the Checker; afterwards every event has been delivered.
func (e *fakeEnv) stop(t *testing.T) {
	require.NoError(t, e.c.Close())
	if e.done != nil {
		require.NoError(t, <-e.done)
		e.done = nil
	}
}

func (e *fakeEnv) state(t *testing.T, key string) State {
	t.Helper()
	s, ok := e.c.State(key)
	require.True(t, ok, key)
	return s
}

var (
	dipA = netip.MustParseAddrPort("198.18.1.1:80")
	dipB = netip.MustParseAddrPort("198.18.1.2:80")
	dipC = netip.MustParseAddrPort("198.18.1.3:80")
	dipD = netip.MustParseAddrPort("198.18.1.4:80")
	dipE = netip.MustParseAddrPort("198.18.1.5:80")
)

const nearlyOne = 0.999999 // Rand value giving the longest waits

// wait is the jittered wait nextDelay gives for Rand value r.
func wait(interval time.Duration, r float64) time.Duration {
	return interval + time.Duration((2*r-1)*IntervalJitter*float64(interval))
}

// TestDownBound kills a DIP at the worst moment (just as a probe starts
// that still succeeds, at its timeout) under the longest jitter, and
// checks in fake time that the target goes Down exactly at the Fall-th
// failed probe and within Spec.DownBound.
func TestDownBound(t *testing.T) {
	for _, fall := range []int{1, 2, 3, 5} {
		spec := Spec{Type: ProbeTCP, Interval: time.Second, Timeout: 400 * time.Millisecond, Rise: 2, Fall: fall}
		e := newFakeEnv(t, fixedRand(nearlyOne))
		e.pr.script(dipA, pass, result{ok: true, took: spec.Timeout - 1})
		for range fall {
			e.pr.script(dipA, hang)
		}
		require.NoError(t, e.c.Set([]Target{{Key: "web/a", Addr: dipA, Spec: spec}}))
		e.run(t)

		e.clk.step(t, 1)
		require.Equal(t, Up, e.state(t, "web/a"), "first probe decides")
		e.clk.step(t, 1) // the DIP dies as this probe starts; it still passes
		dies := e.pr.startTimes()[1]
		for i := range fall {
			require.Equal(t, Up, e.state(t, "web/a"), "fall %d: down after %d failures", fall, i)
			e.clk.step(t, 1)
		}
		st, _ := e.c.Status("web/a")
		require.Equal(t, Down, st.State)
		assert.Equal(t, fall, st.ConsecutiveFail)
		assert.ErrorIs(t, st.LastErr, ErrTimeout)

		elapsed := st.Since.Sub(dies)
		want := spec.Timeout - 1 + time.Duration(fall)*(wait(spec.Interval, nearlyOne)+spec.Timeout)
		assert.Equal(t, want, elapsed, "fall %d", fall)
		// Fake time has no scheduling slack, so the bound holds even
		// without it.
		assert.LessOrEqual(t, elapsed, spec.DownBound()-time.Duration(fall+1)*ProbeSlack, "fall %d", fall)

		e.stop(t)
		evs := e.ev.all()
		require.Len(t, evs, 2)
		assert.Equal(t, Event{Key: "web/a", Addr: dipA, Old: Unknown, New: Up, Time: e.pr.startTimes()[0],
			Reason: "first probe succeeded"}, evs[0])
		assert.Equal(t, Event{Key: "web/a", Addr: dipA, Old: Up, New: Down, Time: st.Since,
			Reason: fmt.Sprintf("%d consecutive failures", fall), Err: st.LastErr}, evs[1])
		assert.ErrorIs(t, evs[1].Err, ErrTimeout)
	}
}

// TestNominalDownTime checks the design's figure, Timeout×Fall +
// Interval×(Fall−1) from the start of the first failing probe, with the
// jitter at its midpoint (no jitter): the down verdict arrives exactly
// then, also with a timeout longer than the interval, and every probe
// starts Interval after the previous one ended (they never overlap).
func TestNominalDownTime(t *testing.T) {
	for _, tc := range []struct {
		interval, timeout time.Duration
		rise, fall        int
		want              time.Duration
	}{
		{2 * time.Second, time.Second, 2, 3, 7 * time.Second},
		{2 * time.Second, 5 * time.Second, 3, 3, 19 * time.Second}, // timeout > interval
		{time.Second, time.Second, 1, 2, 3 * time.Second},          // timeout = interval
		{time.Second, 10 * time.Second, 2, 1, 10 * time.Second},
	} {
		name := fmt.Sprintf("interval %v timeout %v fall %d", tc.interval, tc.timeout, tc.fall)
		t.Run(name, func(t *testing.T) {
			spec := Spec{Type: ProbeHTTP, Interval: tc.interval, Timeout: tc.timeout, Rise: tc.rise, Fall: tc.fall}.WithDefaults()
			require.NoError(t, spec.Validate())
			e := newFakeEnv(t, fixedRand(0.5))
			e.pr.script(dipA, pass)
			for range tc.fall {
				e.pr.script(dipA, hang)
			}
			require.NoError(t, e.c.Set([]Target{{Key: "k", Addr: dipA, Spec: spec}}))
			e.run(t)
			e.clk.step(t, 1) // the first probe passes
			require.Equal(t, Up, e.state(t, "k"))
			for i := range tc.fall {
				require.Equal(t, Up, e.state(t, "k"), "down after %d failures", i)
				e.clk.step(t, 1)
			}
			st, _ := e.c.Status("k")
			require.Equal(t, Down, st.State)
			starts := e.pr.startTimes()
			require.Len(t, starts, 1+tc.fall, "one probe at a time")
			firstFail := starts[1]
			assert.Equal(t, tc.want, st.Since.Sub(firstFail))
			assert.Equal(t, tc.timeout*time.Duration(tc.fall)+tc.interval*time.Duration(tc.fall-1), st.Since.Sub(firstFail))
			// A failing probe ends at its timeout; the next starts
			// Interval after that end, never while it runs.
			for i := 2; i < len(starts); i++ {
				assert.Equal(t, tc.timeout+tc.interval, starts[i].Sub(starts[i-1]), "probe %d", i)
			}
			assert.LessOrEqual(t, st.Since.Sub(firstFail), spec.DownBound())
		})
	}
}

// TestUpBound: the DIP recovers just as a probe starts that still fails at
// its timeout; Rise slow successes follow under the longest jitter.
func TestUpBound(t *testing.T) {
	for _, rise := range []int{1, 2, 4} {
		spec := Spec{Type: ProbeTCP, Interval: time.Second, Timeout: 300 * time.Millisecond, Rise: rise, Fall: 3}
		e := newFakeEnv(t, fixedRand(nearlyOne))
		e.pr.script(dipA, fail, hang)
		for range rise {
			e.pr.script(dipA, result{ok: true, took: spec.Timeout - 1})
		}
		require.NoError(t, e.c.Set([]Target{{Key: "k", Addr: dipA, Spec: spec}}))
		e.run(t)
		e.clk.step(t, 1)
		require.Equal(t, Down, e.state(t, "k"))
		e.clk.step(t, 1) // recovers as this probe starts; it still times out
		recovers := e.pr.startTimes()[1]
		for i := range rise {
			require.Equal(t, Down, e.state(t, "k"), "rise %d: up after %d successes", rise, i)
			e.clk.step(t, 1)
		}
		st, _ := e.c.Status("k")
		require.Equal(t, Up, st.State)
		elapsed := st.Since.Sub(recovers)
		assert.Equal(t, spec.Timeout+time.Duration(rise)*(wait(spec.Interval, nearlyOne)+spec.Timeout-1), elapsed)
		assert.LessOrEqual(t, elapsed, spec.UpBound()-time.Duration(rise+1)*ProbeSlack)
		e.stop(t)
	}
}

// TestSchedule: the first probe is placed at Rand×Interval, and each next
// one starts a jittered Interval after the previous one ended.
func TestSchedule(t *testing.T) {
	spec := Spec{Type: ProbeTCP, Interval: time.Second, Timeout: 500 * time.Millisecond, Rise: 1, Fall: 1}
	e := newFakeEnv(t, fixedRand(0.25, 0, 0.5, nearlyOne))
	e.pr.script(dipA, result{ok: true, took: 100 * time.Millisecond}, pass, fail, pass)
	require.NoError(t, e.c.Set([]Target{{Key: "k", Addr: dipA, Spec: spec}}))
	e.run(t)
	for range 4 {
		e.clk.step(t, 1)
	}
	starts := e.pr.startTimes()
	require.Len(t, starts, 4)
	assert.Equal(t, epoch.Add(250*time.Millisecond), starts[0])
	assert.Equal(t, 100*time.Millisecond+900*time.Millisecond, starts[1].Sub(starts[0]), "interval counts from the end of a probe")
	assert.Equal(t, time.Second, starts[2].Sub(starts[1]))
	assert.Equal(t, wait(time.Second, nearlyOne), starts[3].Sub(starts[2]))
	assert.Equal(t, []time.Duration{250 * time.Millisecond, 900 * time.Millisecond, time.Second,
		wait(time.Second, nearlyOne), wait(time.Second, nearlyOne)}, e.clk.sleepLog())

	st, _ := e.c.Status("k")
	assert.EqualValues(t, 4, st.Probes)
	assert.EqualValues(t, 1, st.Failures)
	assert.True(t, st.LastOK)
	assert.NoError(t, st.LastErr)
	assert.Equal(t, starts[3], st.LastProbe)
	assert.Zero(t, st.LastRTT)
	assert.Equal(t, 1, st.ConsecutiveOK)
}

func TestJitterRange(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	c, err := NewChecker(CheckerConfig{Rand: r.Float64})
	require.NoError(t, err)
	for _, iv := range []time.Duration{MinInterval, time.Second, 7 * time.Second} {
		s := Spec{Interval: iv}
		lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
		for range 10000 {
			d := c.nextDelay(iv)
			lo, hi = min(lo, d), max(hi, d)
			f := c.firstDelay(iv)
			require.GreaterOrEqual(t, f, time.Duration(0))
			require.Less(t, f, iv)
		}
		assert.GreaterOrEqual(t, lo, iv-iv/10)
		assert.LessOrEqual(t, hi, s.maxWait())
		// The draws cover most of the range (deterministic seed).
		assert.Less(t, lo, iv-iv/12)
		assert.Greater(t, hi, iv+iv/12)
	}
	// A Rand out of [0, 1) is clamped, not trusted.
	for _, v := range []float64{1, 2, -1, math.NaN(), math.Inf(1)} {
		c, _ := NewChecker(CheckerConfig{Rand: func() float64 { return v }})
		assert.Zero(t, c.firstDelay(time.Second), "%v", v)
		assert.Equal(t, 900*time.Millisecond, c.nextDelay(time.Second), "%v", v)
	}
}

// TestFirstProbesSpread: targets added together get their first probes
// spread over the interval.
func TestFirstProbesSpread(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	e := newFakeEnv(t, r.Float64)
	spec := Spec{Type: ProbeTCP, Interval: time.Second}
	var ts []Target
	for i := range 50 {
		ts = append(ts, Target{Key: string(rune('a' + i)), Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 2, byte(i)}), 80), Spec: spec})
	}
	require.NoError(t, e.c.Set(ts))
	e.run(t)
	e.clk.waitAsleep(t, 50)
	first := e.clk.sleepLog()
	require.Len(t, first, 50)
	seen := map[time.Duration]bool{}
	lo, hi := time.Second, time.Duration(0)
	for _, d := range first {
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.Less(t, d, time.Second)
		seen[d] = true
		lo, hi = min(lo, d), max(hi, d)
	}
	assert.Len(t, seen, 50, "no two targets start together")
	assert.Less(t, lo, 100*time.Millisecond)
	assert.Greater(t, hi, 900*time.Millisecond)
	assert.Len(t, e.logs.find("health: probe schedule"), 50)
}

// TestSetReconciles: a reload keeps the state and schedule of unchanged
// targets, keeps the state of respecified ones, resets moved ones and
// forgets removed ones, without events for any of that.
func TestSetReconciles(t *testing.T) {
	e := newFakeEnv(t, rand.New(rand.NewPCG(5, 6)).Float64)
	spec := Spec{Type: ProbeTCP, Interval: time.Second, Rise: 2, Fall: 2}.WithDefaults()
	e.pr.script(dipA, pass)
	e.pr.script(dipB, pass)
	e.pr.script(dipC, fail)
	e.pr.script(dipE, pass)
	cAddr2 := netip.MustParseAddrPort("198.18.1.33:80")
	e.pr.script(cAddr2, pass)
	e.pr.script(dipD, pass)

	first := []Target{
		{Key: "web/a", Addr: dipA, Spec: spec},
		{Key: "web/b", Addr: dipB, Spec: spec},
		{Key: "web/c", Addr: dipC, Spec: spec},
		{Key: "web/e", Addr: dipE, Spec: spec},
	}
	require.NoError(t, e.c.Set(first))
	for key, st := range e.c.Snapshot() {
		assert.Equal(t, Unknown, st.State, key)
		assert.Equal(t, epoch, st.Since)
	}
	e.run(t)
	for e.pr.count(dipA) < 3 || e.pr.count(dipB) < 3 || e.pr.count(dipC) < 3 || e.pr.count(dipE) < 3 {
		e.clk.step(t, 4)
	}
	snap := e.c.Snapshot()
	require.Len(t, snap, 4)
	assert.Equal(t, Up, snap["web/a"].State)
	assert.Equal(t, Up, snap["web/b"].State)
	assert.Equal(t, Down, snap["web/c"].State)
	assert.Equal(t, Up, snap["web/e"].State)
	beforeA, beforeB := snap["web/a"], snap["web/b"]

	// Same set again: nothing restarts.
	sleeps := len(e.clk.sleepLog())
	require.NoError(t, e.c.Set(first))
	e.clk.waitAsleep(t, 4)
	assert.Len(t, e.clk.sleepLog(), sleeps, "no loop restarted")

	specB := spec
	specB.Interval = 2 * time.Second
	second := []Target{
		{Key: "web/a", Addr: dipA, Spec: spec},   // unchanged
		{Key: "web/b", Addr: dipB, Spec: specB},  // new spec
		{Key: "web/c", Addr: cAddr2, Spec: spec}, // moved
		{Key: "web/d", Addr: dipD, Spec: spec},   // new
		// web/e removed
	}
	require.NoError(t, e.c.Set(second))

	snap = e.c.Snapshot()
	require.Len(t, snap, 4)
	assert.Equal(t, beforeA, snap["web/a"], "unchanged target untouched")
	b := snap["web/b"]
	assert.Equal(t, Up, b.State, "a new spec keeps the state")
	assert.Equal(t, beforeB.Since, b.Since)
	assert.Equal(t, beforeB.Probes, b.Probes, "counters survive a spec change")
	assert.Zero(t, b.ConsecutiveOK, "consecutive counts restart")
	assert.Equal(t, specB, b.Spec)
	c := snap["web/c"]
	assert.Equal(t, Unknown, c.State, "a moved target starts over")
	assert.Equal(t, cAddr2, c.Addr)
	assert.Zero(t, c.Probes)
	assert.Equal(t, Unknown, snap["web/d"].State)
	_, ok := e.c.State("web/e")
	assert.False(t, ok)

	// The three restarted loops (b, c, d) each asked for a first delay;
	// a's loop kept its timer; e's and the old b and c loops are gone.
	waitFor(t, func() bool { return len(e.clk.sleepLog()) == sleeps+3 })
	e.clk.waitAsleep(t, 4)
	callsE := e.pr.count(dipE)
	for e.pr.count(cAddr2) < 2 || e.pr.count(dipD) < 2 || e.c.Snapshot()["web/a"].Probes < beforeA.Probes+2 {
		e.clk.step(t, 4)
	}
	snap = e.c.Snapshot()
	assert.Equal(t, Up, snap["web/a"].State)
	assert.Equal(t, beforeA.Since, snap["web/a"].Since)
	assert.Equal(t, Up, snap["web/b"].State)
	assert.Equal(t, Up, snap["web/c"].State)
	assert.Equal(t, Up, snap["web/d"].State)
	assert.Equal(t, callsE, e.pr.count(dipE), "removed target not probed")

	e.stop(t)
	for key, n := range map[string]int{"web/a": 1, "web/b": 2, "web/c": 2, "web/d": 1, "web/e": 1} {
		assert.Equal(t, n, e.logs.count("health: probe schedule", key), key)
	}
	byKey := e.ev.byKey()
	transitions := func(key string) (out []string) {
		for _, ev := range byKey[key] {
			out = append(out, ev.Old.String()+">"+ev.New.String())
		}
		return out
	}
	assert.Equal(t, []string{"unknown>up"}, transitions("web/a"))
	assert.Equal(t, []string{"unknown>up"}, transitions("web/b"))
	assert.Equal(t, []string{"unknown>down", "unknown>up"}, transitions("web/c"))
	assert.Equal(t, []string{"unknown>up"}, transitions("web/d"))
	assert.Equal(t, []string{"unknown>up"}, transitions("web/e"))
	e.ev.checkChains(t)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached (hang guard)")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestEventsSerialInOrder: many targets flapping at every probe; OnChange
// never runs concurrently and every target's events chain in order.
func TestEventsSerialInOrder(t *testing.T) {
	e := newFakeEnv(t, rand.New(rand.NewPCG(7, 8)).Float64)
	spec := Spec{Type: ProbeTCP, Interval: 100 * time.Millisecond, Rise: 1, Fall: 1}
	const n = 8
	var ts []Target
	for i := range n {
		addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 3, byte(i)}), 80)
		for range 20 {
			e.pr.script(addr, pass, fail)
		}
		ts = append(ts, Target{Key: addr.String(), Addr: addr, Spec: spec})
	}
	require.NoError(t, e.c.Set(ts))
	e.run(t)
	for range 60 {
		e.clk.step(t, n)
	}
	e.stop(t)
	e.ev.checkChains(t)
	total := 0
	for _, tg := range ts {
		evs := e.ev.byKey()[tg.Key]
		assert.Len(t, evs, e.pr.count(tg.Addr), "rise=fall=1 and alternating results: one event per probe")
		total += len(evs)
		st, _ := e.c.Status(tg.Key)
		assert.Equal(t, evs[len(evs)-1].New, st.State)
	}
	assert.Len(t, e.ev.all(), total)
	// Global order follows time.
	all := e.ev.all()
	for i := 1; i < len(all); i++ {
		assert.False(t, all[i].Time.Before(all[i-1].Time), "event %d", i)
	}
}

func TestStateChangeLogged(t *testing.T) {
	e := newFakeEnv(t, fixedRand(0.5))
	spec := Spec{Type: ProbeTCP, Interval: time.Second, Rise: 1, Fall: 1}
	e.pr.script(dipA, pass, fail)
	require.NoError(t, e.c.Set([]Target{{Key: "web/a", Addr: dipA, Spec: spec}}))
	e.run(t)
	e.clk.step(t, 1)
	e.clk.step(t, 1)
	e.stop(t)

	sched := e.logs.find("health: probe schedule")
	require.Len(t, sched, 1)
	assert.Equal(t, slog.LevelDebug, sched[0].level)
	assert.Equal(t, "500ms", sched[0].attrs["first_probe_in"])
	assert.Equal(t, dipA.String(), sched[0].attrs["addr"])
	assert.Contains(t, sched[0].attrs["probe"], "type=tcp")

	changes := e.logs.find("health: state change")
	require.Len(t, changes, 2)
	assert.Equal(t, slog.LevelInfo, changes[0].level)
	assert.Equal(t, map[string]string{"target": "web/a", "addr": dipA.String(), "old": "unknown", "new": "up",
		"reason": "first probe succeeded"}, changes[0].attrs)
	assert.Equal(t, slog.LevelWarn, changes[1].level)
	assert.Equal(t, map[string]string{"target": "web/a", "addr": dipA.String(), "old": "up", "new": "down",
		"reason": "1 consecutive failures", "err": errProbe.Error()}, changes[1].attrs)
	assert.Len(t, e.logs.find("health: probe failed"), 1)
}

func TestSetRejects(t *testing.T) {
	c, err := NewChecker(CheckerConfig{})
	require.NoError(t, err)
	good := Target{Key: "web/a", Addr: dipA, Spec: Spec{Type: ProbeTCP}}
	require.NoError(t, c.Set([]Target{good}))

	for _, tc := range []struct {
		name    string
		targets []Target
		want    []string
		spec    bool // also wraps ErrInvalidSpec
	}{
		{"empty key", []Target{{Addr: dipA, Spec: Spec{Type: ProbeTCP}}}, []string{`target 0 (""): empty key`}, false},
		{"duplicate", []Target{good, good}, []string{`target 1 ("web/a"): duplicate key`}, false},
		{"no address", []Target{{Key: "x", Spec: Spec{Type: ProbeTCP}}}, []string{"no address"}, false},
		{"no port", []Target{{Key: "x", Addr: netip.AddrPortFrom(dipA.Addr(), 0), Spec: Spec{Type: ProbeTCP}}},
			[]string{"no port to probe"}, false},
		{"bad spec", []Target{{Key: "x", Addr: dipA, Spec: Spec{Type: ProbeTCP, Interval: time.Second, Timeout: -time.Second}}},
			[]string{`target 0 ("x"): health: invalid probe: timeout -1s must be positive`}, true},
		{"no type", []Target{{Key: "x", Addr: dipA}}, []string{"type 0"}, true},
		{"several", []Target{good, {Key: "y"}, good}, []string{`target 1 ("y"): no address`, `target 2 ("web/a"): duplicate key`}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Set(tc.targets)
			require.ErrorIs(t, err, ErrInvalidTarget)
			if tc.spec {
				assert.ErrorIs(t, err, ErrInvalidSpec)
			}
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			snap := c.Snapshot()
			assert.Len(t, snap, 1, "a rejected Set changes nothing")
			assert.Contains(t, snap, "web/a")
		})
	}

	// Spec.Port supplies a missing target port; 4in6 addresses are
	// unmapped; defaults are applied.
	mapped := netip.AddrPortFrom(netip.AddrFrom16(dipB.Addr().As16()), 0)
	require.NoError(t, c.Set([]Target{{Key: "b", Addr: mapped, Spec: Spec{Type: ProbeHTTP, Port: 8080}}}))
	st, ok := c.Status("b")
	require.True(t, ok)
	assert.Equal(t, netip.MustParseAddrPort("198.18.1.2:8080"), st.Addr)
	assert.Equal(t, Spec{Type: ProbeHTTP, Port: 8080}.WithDefaults(), st.Spec)
	_, ok = c.State("web/a")
	assert.False(t, ok)
}

func TestLifecycle(t *testing.T) {
	_, err := NewChecker(CheckerConfig{Prober: &NetProber{}, Source: netip.MustParseAddr("198.18.0.1")})
	assert.Error(t, err, "Prober and Source are exclusive")

	e := newFakeEnv(t, fixedRand(0.5))
	spec := Spec{Type: ProbeTCP, Interval: time.Second}
	require.NoError(t, e.c.Set([]Target{{Key: "k", Addr: dipA, Spec: spec}}))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.c.Run(ctx) }()
	e.clk.step(t, 1)
	assert.Equal(t, Up, e.state(t, "k"))
	waitFor(t, func() bool { return len(e.ev.all()) == 1 })
	assert.ErrorIs(t, e.c.Run(context.Background()), ErrRunning)
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
	e.clk.waitAsleep(t, 0)

	// A second Run resumes with the state kept.
	e.run(t)
	e.clk.waitAsleep(t, 1)
	assert.Equal(t, Up, e.state(t, "k"))
	e.stop(t)
	require.NoError(t, e.c.Close(), "idempotent")
	assert.ErrorIs(t, e.c.Run(context.Background()), ErrClosed)
	assert.ErrorIs(t, e.c.Set(nil), ErrClosed)
	_, ok := e.c.State("k")
	assert.True(t, ok, "status still readable after Close")
	assert.Len(t, e.ev.all(), 1)

	// Close without Run returns at once.
	c, err := NewChecker(CheckerConfig{})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// TestRemovedTargetAbandonsProbe: a probe in flight when its target is
// removed is cancelled and its result produces no event.
func TestRemovedTargetAbandonsProbe(t *testing.T) {
	started := make(chan struct{})
	causes := make(chan error, 1)
	pr := ProberFunc(func(ctx context.Context, addr netip.AddrPort, spec Spec) error {
		close(started)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return errors.New("abandoned")
	})
	var ev eventLog
	c, err := NewChecker(CheckerConfig{Prober: pr, OnChange: ev.onChange, Rand: func() float64 { return 0 }})
	require.NoError(t, err)
	spec := Spec{Type: ProbeTCP, Interval: time.Hour, Timeout: 30 * time.Minute}
	require.NoError(t, c.Set([]Target{{Key: "k", Addr: dipA, Spec: spec}}))
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	<-started
	require.NoError(t, c.Set(nil))
	assert.ErrorIs(t, <-causes, context.Canceled)
	require.NoError(t, c.Close())
	require.NoError(t, <-done)
	assert.Empty(t, ev.all())
	assert.Empty(t, c.Snapshot())
}
