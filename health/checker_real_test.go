package health

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests in this file probe real servers on loopback with real time and
// short intervals. They wait for conditions (the hang guard only stops a
// hung test) and assert no durations.

func realSpec(typ ProbeType) Spec {
	return Spec{Type: typ, Interval: 100 * time.Millisecond, Timeout: 90 * time.Millisecond, Rise: 2, Fall: 2}.WithDefaults()
}

func waitState(t *testing.T, c *Checker, key string, want State) Status {
	t.Helper()
	var st Status
	waitFor(t, func() bool {
		st, _ = c.Status(key)
		return st.State == want
	})
	return st
}

func TestCheckerHTTP(t *testing.T) {
	var code atomic.Int32
	code.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(code.Load()))
	}))
	defer srv.Close()
	addr := netip.MustParseAddrPort(srv.Listener.Addr().String())

	var ev eventLog
	logs := &logRecorder{}
	c, err := NewChecker(CheckerConfig{OnChange: ev.onChange, Logger: slog.New(logs), Source: netip.MustParseAddr("127.0.0.1")})
	require.NoError(t, err)
	require.NoError(t, c.Set([]Target{{Key: "web/a", Addr: addr, Spec: realSpec(ProbeHTTP)}}))
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()

	waitState(t, c, "web/a", Up)
	code.Store(http.StatusInternalServerError)
	st := waitState(t, c, "web/a", Down)
	assert.ErrorIs(t, st.LastErr, ErrUnexpectedStatus)
	code.Store(http.StatusOK)
	waitState(t, c, "web/a", Up)

	require.NoError(t, c.Close())
	require.NoError(t, <-done)
	ev.checkChains(t)
	evs := ev.all()
	require.GreaterOrEqual(t, len(evs), 3)
	assert.Equal(t, Up, evs[len(evs)-1].New)
	st, _ = c.Status("web/a")
	assert.GreaterOrEqual(t, st.Failures, uint64(2))
	assert.Greater(t, st.Probes, st.Failures)
	assert.Len(t, logs.find("health: state change"), len(evs))
}

func TestCheckerTCPWithDialHook(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := netip.MustParseAddrPort(ln.Addr().String())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	var dials atomic.Int32
	c, err := NewChecker(CheckerConfig{DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}})
	require.NoError(t, err)
	require.NoError(t, c.Set([]Target{{Key: "k", Addr: addr, Spec: realSpec(ProbeTCP)}}))
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()

	waitState(t, c, "k", Up)
	ln.Close() // the DIP stops listening: connections are refused
	st := waitState(t, c, "k", Down)
	assert.ErrorIs(t, st.LastErr, syscall.ECONNREFUSED)
	require.NoError(t, c.Close())
	require.NoError(t, <-done)
	st, _ = c.Status("k")
	assert.GreaterOrEqual(t, uint64(dials.Load()), st.Probes, "every probe went through the hook")
	assert.GreaterOrEqual(t, st.Probes, uint64(3))
}

// TestOnChangesBatches: OnChanges gets every change once, in order, never
// concurrently; changes that happen while it runs come in one batch.
func TestOnChangesBatches(t *testing.T) {
	clk := newFakeClock()
	pr := newScriptProber(clk)
	each := &eventLog{}
	var (
		mu       sync.Mutex
		batches  [][]Event
		inFlight atomic.Int32
		overlap  atomic.Bool
		once     sync.Once
	)
	first, release := make(chan struct{}), make(chan struct{})
	c, err := NewChecker(CheckerConfig{
		Logger:   slog.New(slog.DiscardHandler),
		Prober:   pr,
		OnChange: each.onChange,
		OnChanges: func(evs []Event) {
			if inFlight.Add(1) > 1 {
				overlap.Store(true)
			}
			mu.Lock()
			batches = append(batches, evs)
			mu.Unlock()
			once.Do(func() { close(first); <-release }) // a slow consumer, once
			inFlight.Add(-1)
		},
		Rand:  rand.New(rand.NewPCG(7, 8)).Float64,
		clock: clk,
	})
	require.NoError(t, err)
	spec := Spec{Type: ProbeTCP, Interval: 100 * time.Millisecond, Rise: 1, Fall: 1}
	const n = 8
	var ts []Target
	for i := range n {
		addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 3, byte(i)}), 80)
		for range 20 {
			pr.script(addr, pass, fail)
		}
		ts = append(ts, Target{Key: addr.String(), Addr: addr, Spec: spec})
	}
	require.NoError(t, c.Set(ts))
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	for i := 0; ; i++ {
		require.Less(t, i, 100, "no first batch")
		clk.step(t, n)
		select {
		case <-first:
		case <-time.After(10 * time.Millisecond):
			continue
		}
		break
	}
	for range 10 { // changes pile up behind the slow consumer
		clk.step(t, n)
	}
	close(release)
	for range 10 {
		clk.step(t, n)
	}
	require.NoError(t, c.Close())
	require.NoError(t, <-done)

	assert.False(t, overlap.Load(), "OnChanges ran concurrently")
	var got []Event
	biggest := 0
	for _, b := range batches {
		require.NotEmpty(t, b)
		got = append(got, b...)
		biggest = max(biggest, len(b))
	}
	assert.Equal(t, each.all(), got, "every change once, in order, as OnChange saw them")
	assert.GreaterOrEqual(t, biggest, 10, "the changes behind the slow consumer (one or more per step) came in one batch")
	t.Logf("%d changes in %d batches, the largest %d", len(got), len(batches), biggest)
}
