package nexthop

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// routeQueries stands in for Run's route query (sysState.routeGet): it
// passes queries to the kernel but answers the next ones from script
// (a nil entry: the kernel's answer), then every later one with every if
// set. If reached is set, the first query after the script closes it and
// waits for release before it is answered: the test then sees the
// snapshot the previous answers made, with Run held still.
type routeQueries struct {
	kernel func(dst net.IP) ([]netlink.Route, error)

	mu               sync.Mutex
	n                int
	script           []error
	every            error
	reached, release chan struct{}
}

func (q *routeQueries) get(dst net.IP) ([]netlink.Route, error) {
	q.mu.Lock()
	q.n++
	var err error
	var wait chan struct{}
	switch {
	case len(q.script) > 0:
		err, q.script = q.script[0], q.script[1:]
	case q.reached != nil:
		close(q.reached)
		q.reached, wait = nil, q.release
	default:
		err = q.every
	}
	q.mu.Unlock()
	if wait != nil {
		<-wait
	}
	if err != nil {
		return nil, err
	}
	return q.kernel(dst)
}

func (q *routeQueries) queries() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// startScripted runs a Resolver in ns whose route queries go through a
// routeQueries set up by script.
func startScripted(t *testing.T, ns *netlab.NS, cfg Config, script func(*routeQueries)) (*Resolver, *routeQueries) {
	t.Helper()
	cfg.NetNSPath = ns.Path()
	r, err := NewResolver(cfg)
	require.NoError(t, err)
	q := &routeQueries{kernel: r.sys.h.RouteGet}
	script(q)
	r.sys.routeGet = q.get
	runResolver(t, r)
	return r, q
}

// A route query that fails for a reason of its own (EINTR, ENOBUFS, a
// netlink socket error) was cached as ErrNoRoute, like the kernel's
// answer that there is no route: the destination stayed unresolvable,
// every Lookup a miss that asked nothing, until the next refresh. Now the
// failure caches nothing (the next Lookup asks again and is answered) and
// is counted; the kernel's no-route answers are still cached.
func TestRouteQueryErrorNotCached(t *testing.T) {
	l := newLAN(t)
	ctx := testCtx(t)
	// No tick retries nor refreshes during the test: only Lookups ask again.
	cfg := Config{RetryInterval: time.Hour, RefreshInterval: time.Hour}

	for _, tc := range []struct {
		name  string
		dst   string
		first error // the first query's answer instead of the kernel's
		every error // every query's answer instead of the kernel's
		want  error // nil: the peer's hop
	}{
		{name: "EINTR", dst: "198.18.0.2", first: unix.EINTR},
		{name: "ENOBUFS v6", dst: "2001:db8::2", first: unix.ENOBUFS},
		{name: "socket timeout", dst: "198.18.0.2", first: fmt.Errorf("netlink receive: %w", unix.EAGAIN)},
		{name: "mismatched reply v6", dst: "2001:db8::2", first: errors.New("Wrong Seq nr 7, expected 8")},
		{name: "no route", dst: "198.18.200.1", want: ErrNoRoute},
		{name: "no route v6", dst: "2001:db8:200::1", want: ErrNoRoute},
		{name: "unreachable route", dst: "198.18.0.2", every: unix.EHOSTUNREACH, want: ErrNoRoute},
		{name: "prohibit route v6", dst: "2001:db8::2", every: fmt.Errorf("%w: extack", unix.EACCES), want: ErrNoRoute},
		{name: "blackhole route", dst: "198.18.0.2", every: unix.EINVAL, want: ErrNoRoute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, q := startScripted(t, l.mux, cfg, func(q *routeQueries) {
				if tc.first != nil {
					q.script = []error{tc.first}
				}
				q.every = tc.every
			})
			dst := netip.MustParseAddr(tc.dst)

			if tc.want != nil {
				_, err := r.Resolve(ctx, dst)
				require.ErrorIs(t, err, tc.want)
				// Cached: Lookups miss without asking, Resolve answers at once.
				for range 3 {
					_, ok := r.Lookup(dst)
					assert.False(t, ok)
				}
				_, err = r.Resolve(ctx, dst)
				assert.ErrorIs(t, err, tc.want)
				st := r.Stats()
				assert.Equal(t, 1, st.Failed)
				assert.Zero(t, st.RouteErrors, "a no-route answer is not a failed query")
				assert.Equal(t, 1, q.queries(), "the answer was cached")
				return
			}

			_, ok := r.Lookup(dst)
			require.False(t, ok, "the first lookup misses")
			var hop Hop
			waitFor(t, "a later lookup to resolve", func() bool {
				if st := r.Stats(); st.Failed != 0 {
					t.Fatalf("one failed route query (%v) cached as a failure: %+v", tc.first, st)
				}
				hop, ok = r.Lookup(dst)
				return ok
			})
			assert.Equal(t, mac(l.peerLink.MAC), hop.DstMAC)
			assert.Equal(t, l.muxLink.Index, hop.IfIndex)
			assert.Equal(t, uint64(1), r.Stats().RouteErrors)
			assert.GreaterOrEqual(t, q.queries(), 2)
		})
	}
}

// The same at a refresh: a destination resolved, whose route query fails
// once when it is resolved again, keeps its hop (it was unresolvable
// until the next refresh), while the kernel's no-route answer replaces it
// as before.
func TestRouteQueryErrorAtRefresh(t *testing.T) {
	l := newLAN(t)
	ctx := testCtx(t)
	// Refreshes follow each other closely, so the test need not wait long
	// for one; it holds Run still at the query after the scripted one.
	cfg := Config{RetryInterval: 10 * time.Millisecond, RefreshInterval: 10 * time.Millisecond}

	for _, tc := range []struct {
		name    string
		dst     string
		refresh error // the answer to the first query after the destination is resolved
		keeps   bool  // the hop survives it
	}{
		{"EINTR", "198.18.0.2", unix.EINTR, true},
		{"ENOBUFS v6", "2001:db8::2", unix.ENOBUFS, true},
		{"socket timeout", "198.18.0.2", fmt.Errorf("netlink receive: %w", unix.EAGAIN), true},
		{"no route", "198.18.0.2", unix.ENETUNREACH, false},
		{"no route v6", "2001:db8::2", unix.EHOSTUNREACH, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, q := startScripted(t, l.mux, cfg, func(*routeQueries) {})
			dst := netip.MustParseAddr(tc.dst)
			hop, err := r.Resolve(ctx, dst)
			require.NoError(t, err)

			reached, release := make(chan struct{}), make(chan struct{})
			defer close(release) // before runResolver's cleanup stops Run
			q.mu.Lock()
			q.script, q.reached, q.release = []error{tc.refresh}, reached, release
			q.mu.Unlock()
			select {
			case <-reached:
			case <-ctx.Done():
				t.Fatal("no query after the scripted one")
			}

			got, ok := r.Lookup(dst)
			st := r.Stats()
			if tc.keeps {
				assert.True(t, ok, "one failed route query (%v) made the destination unresolvable: %+v", tc.refresh, st)
				assert.Equal(t, hop, got)
				assert.Equal(t, uint64(1), st.RouteErrors)
				assert.Zero(t, st.Failed)
			} else {
				assert.False(t, ok, "the kernel's answer %v was not cached", tc.refresh)
				assert.Equal(t, 1, st.Failed)
				assert.Zero(t, st.RouteErrors)
			}
		})
	}
}
