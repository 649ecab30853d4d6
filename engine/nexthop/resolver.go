package nexthop

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Resolver caches next hops for destinations and keeps them current from the
// kernel. Lookup and Snapshot are safe for concurrent use by any number of
// data-path workers; one goroutine runs Run.
type Resolver struct {
	cfg Config
	tab atomic.Pointer[Snapshot]
	req chan [16]byte

	mu      sync.Mutex // lifecycle
	running bool
	closed  bool
	closing chan struct{}
	runDone chan struct{}

	sys sysState // the platform part (netlink handle and namespace on Linux)

	stats struct {
		resolutions, neighEvents, routeEvents, linkEvents, triggers, resyncs, evictions atomic.Uint64
		fibMatches, prefixesLearned, covered, routeErrors                               atomic.Uint64
	}
}

// Stats counts what a Resolver has done. Entries to Prefixes are from the
// current snapshot; the rest are totals since NewResolver.
type Stats struct {
	// Entries counts cache entries, destinations and prefixes; Resolved,
	// Pending and Failed split them by state.
	Entries, Resolved, Pending, Failed int
	// Prefixes counts the entries that answer for a whole prefix.
	Prefixes int

	Resolutions     uint64 // destinations and prefix entries resolved (an RTM_GETROUTE each)
	RouteErrors     uint64 // of those, route queries that failed without an answer (EINTR, ENOBUFS, a socket error...): nothing cached, asked again
	FIBMatches      uint64 // FIB-match lookups made to learn a route's prefix
	PrefixesLearned uint64 // prefix entries made
	Covered         uint64 // misses that reached Run and were answered by a prefix entry learned meanwhile, with no FIB lookup
	NeighborEvents  uint64 // neighbour updates received
	RouteEvents     uint64 // route updates received
	LinkEvents      uint64 // link updates received
	Triggers        uint64 // neighbour resolutions asked of the kernel
	Resyncs         uint64 // full resynchronisations after losing events
	Evictions       uint64 // entries forgotten as idle
}

func newResolver(cfg Config) (*Resolver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r := &Resolver{
		cfg:     cfg,
		req:     make(chan [16]byte, cfg.QueueLen),
		closing: make(chan struct{}),
		runDone: make(chan struct{}),
	}
	r.tab.Store(&Snapshot{dests: new(destTable), req: r.req, changed: make(chan struct{}), version: 1})
	return r, nil
}

// publish swaps in a snapshot of the given tables and wakes the waiters
// on the previous one. Run is the only publisher.
func (r *Resolver) publish(dests *destTable, v4, v6 *lpmTable, prefixes []netip.Prefix, counts [3]int) {
	s := &Snapshot{dests: dests, v4: v4, v6: v6, prefixes: prefixes, req: r.req,
		changed: make(chan struct{}), counts: counts, version: r.tab.Load().version + 1}
	close(r.tab.Swap(s).changed)
}

// Snapshot returns the current view of the cache. Take one per batch.
func (r *Resolver) Snapshot() *Snapshot { return r.tab.Load() }

// Lookup is Snapshot().Lookup(dst): the hot path, lock-free and
// allocation-free. False means "drop with reason nexthop_unresolved"; the
// destination has been queued for resolution.
func (r *Resolver) Lookup(dst netip.Addr) (Hop, bool) { return r.tab.Load().Lookup(dst) }

// Version returns the current snapshot's version: it changes whenever any
// answer of Lookup may have changed (see Snapshot.Version).
func (r *Resolver) Version() uint64 { return r.tab.Load().version }

// Resolve returns the next hop for dst, waiting until Run has resolved it,
// it is known to be unresolvable (ErrNoRoute, ErrNotUnicast,
// ErrNotEthernet, ErrNeighborFailed), ctx is done (an error wrapping
// ErrUnresolved and ctx.Err()) or the resolver is closed. It is for setup
// and tests, not the data path; Run must be running.
func (r *Resolver) Resolve(ctx context.Context, dst netip.Addr) (Hop, error) {
	if !dst.IsValid() {
		return Hop{}, ErrInvalidAddr
	}
	k := dst.As16()
	for {
		s := r.tab.Load()
		if e := s.find(&k); e != nil {
			e.used.Store(true)
			switch e.state {
			case stateResolved:
				return e.hop, nil
			case stateFailed:
				return Hop{}, fmt.Errorf("%w: %v", e.err, dst)
			}
		} else {
			select {
			case r.req <- k:
			case <-ctx.Done():
				return Hop{}, fmt.Errorf("%w: %v: %w", ErrUnresolved, dst, ctx.Err())
			case <-r.closing:
				return Hop{}, ErrClosed
			}
		}
		select {
		case <-s.changed:
		case <-ctx.Done():
			return Hop{}, fmt.Errorf("%w: %v: %w", ErrUnresolved, dst, ctx.Err())
		case <-r.closing:
			return Hop{}, ErrClosed
		}
	}
}

// Stats returns the resolver's counters.
func (r *Resolver) Stats() Stats {
	s := r.tab.Load()
	return Stats{
		Entries:         s.Len(),
		Pending:         s.counts[statePending],
		Resolved:        s.counts[stateResolved],
		Failed:          s.counts[stateFailed],
		Prefixes:        len(s.prefixes),
		Resolutions:     r.stats.resolutions.Load(),
		FIBMatches:      r.stats.fibMatches.Load(),
		PrefixesLearned: r.stats.prefixesLearned.Load(),
		Covered:         r.stats.covered.Load(),
		RouteErrors:     r.stats.routeErrors.Load(),
		NeighborEvents:  r.stats.neighEvents.Load(),
		RouteEvents:     r.stats.routeEvents.Load(),
		LinkEvents:      r.stats.linkEvents.Load(),
		Triggers:        r.stats.triggers.Load(),
		Resyncs:         r.stats.resyncs.Load(),
		Evictions:       r.stats.evictions.Load(),
	}
}

// startRun marks the resolver running; it fails if it is closed or already
// running.
func (r *Resolver) startRun() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return ErrClosed
	case r.running:
		return errors.New("nexthop: Run is already running")
	}
	r.running = true
	return nil
}

// Close stops Run (waiting for it to return, which releases any managed
// neighbour entries it created) and releases the resolver's resources.
// Lookups on snapshots taken before keep working; nothing new is resolved.
func (r *Resolver) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	close(r.closing)
	running := r.running
	r.mu.Unlock()
	if running {
		<-r.runDone
	}
	return r.sys.close()
}
