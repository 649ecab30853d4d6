package fleet

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/flow"
)

// AllocationWatcherConfig configures an AllocationWatcher.
type AllocationWatcherConfig struct {
	Client *clientv3.Client // required
	Prefix string           // default DefaultPrefix
	// OnAllocations is called with every range of the fleet held (a claim)
	// or guarded for its last holder (AllocationWatcher) whenever that
	// changes, one call at a time, from a goroutine Run
	// starts (the Mux's Controller.SetPortAllocations; the document's
	// static allocations are the Mux's to add). What changes while a call
	// runs is handed over in the next call, together.
	OnAllocations func([]flow.PortAllocation)
	Logger        *slog.Logger
}

// AllocationWatcher follows every Host Agent's port claims, for a Mux: a
// claim made is a range whose replies go to its DIP's host. A range
// whose claim expired with its holder's lease stays its holder's for as
// long as its guard lives (the guard time): replies to connections the
// holder made still reach its host, and a holder that restarts takes the
// range back with no change for the Mux. A range returned (no
// connection left on it) or whose guard time has passed is gone. While
// etcd is unreachable the last allocations stay: the Mux keeps sending
// replies where it did.
type AllocationWatcher struct {
	cfg   AllocationWatcherConfig
	k     keys
	ready chan struct{}
	poke  chan struct{}

	mu             sync.Mutex
	claims, guards map[rangeID]flow.PortAllocation
	dirty          bool
	read           bool // a complete read is among what is not reported yet
}

// NewAllocationWatcher returns an AllocationWatcher; nothing happens
// until Run.
func NewAllocationWatcher(cfg AllocationWatcherConfig) (*AllocationWatcher, error) {
	if cfg.Client == nil || cfg.OnAllocations == nil {
		return nil, errors.New("fleet: AllocationWatcherConfig needs a Client and OnAllocations")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &AllocationWatcher{cfg: cfg, k: newKeys(cfg.Prefix), claims: map[rangeID]flow.PortAllocation{},
		guards: map[rangeID]flow.PortAllocation{}, ready: make(chan struct{}), poke: make(chan struct{}, 1)}, nil
}

// Ready is closed once the first complete read is reported.
func (w *AllocationWatcher) Ready() <-chan struct{} { return w.ready }

// Allocations are the allocations as last read (not necessarily reported
// yet).
func (w *AllocationWatcher) Allocations() []flow.PortAllocation {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.list()
}

// Run follows the claims until ctx is done.
func (w *AllocationWatcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { w.reportLoop(ctx) })
	f := follower{client: w.cfg.Client, logger: w.cfg.Logger, prefix: w.k.ports(), what: "the last allocations",
		read: w.readAll, events: w.apply}
	f.run(ctx)
	return nil
}

// readAll replaces every claim and guard with what etcd holds.
func (w *AllocationWatcher) readAll(resp *clientv3.GetResponse) {
	claims, guards := map[rangeID]flow.PortAllocation{}, map[rangeID]flow.PortAllocation{}
	for _, kv := range resp.Kvs {
		if m, id, ok := w.parse(claims, guards, kv.Key); ok {
			if c, ok := decodeClaim(kv.Value); ok && c.Last >= id.first {
				m[id] = c.allocation(id.vip, id.first)
			}
		}
	}
	w.mu.Lock()
	w.claims, w.guards, w.dirty, w.read = claims, guards, true, true
	w.mu.Unlock()
	w.wake()
}

// parse says which of claims and guards key belongs in, and its range.
func (w *AllocationWatcher) parse(claims, guards map[rangeID]flow.PortAllocation, key []byte) (map[rangeID]flow.PortAllocation, rangeID, bool) {
	if vip, first, ok := parsePortKey(w.k.portClaims(), string(key)); ok {
		return claims, rangeID{vip, first}, true
	}
	if vip, first, ok := parsePortKey(w.k.portGuards(), string(key)); ok {
		return guards, rangeID{vip, first}, true
	}
	return nil, rangeID{}, false
}

// apply applies one watch response's changes.
func (w *AllocationWatcher) apply(events []*clientv3.Event) {
	w.mu.Lock()
	for _, ev := range events {
		m, id, ok := w.parse(w.claims, w.guards, ev.Kv.Key)
		if !ok {
			continue
		}
		if ev.Type == clientv3.EventTypeDelete {
			delete(m, id)
			w.dirty = true
			continue
		}
		if c, ok := decodeClaim(ev.Kv.Value); ok && c.Last >= id.first {
			m[id] = c.allocation(id.vip, id.first)
			w.dirty = true
		}
	}
	w.mu.Unlock()
	w.wake()
}

func (w *AllocationWatcher) wake() {
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// reportLoop hands the claims to OnAllocations when they changed, one
// call at a time, until ctx is done.
func (w *AllocationWatcher) reportLoop(ctx context.Context) {
	var last []flow.PortAllocation
	reported := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.poke:
		}
		w.mu.Lock()
		dirty, read := w.dirty, w.read
		all := w.list()
		w.dirty, w.read = false, false
		w.mu.Unlock()
		// A claim rewritten unchanged (a restarted host taking its ranges
		// back under a new lease), or expired with its guard left, is no
		// change for the Mux.
		if dirty && (!reported || !slices.Equal(all, last)) {
			w.cfg.OnAllocations(all)
			last, reported = all, true
		}
		if read {
			select {
			case <-w.ready:
			default:
				close(w.ready)
			}
		}
	}
}

// list is the claims, and the guards of ranges not claimed (their last
// holder's), sorted by VIP and first port; w.mu is held. A claim is
// made with its guard and the same owner, and no claim is made where a
// guard lies, so the two never disagree.
func (w *AllocationWatcher) list() []flow.PortAllocation {
	out := make([]flow.PortAllocation, 0, len(w.guards))
	for _, a := range w.claims {
		out = append(out, a)
	}
	for id, a := range w.guards {
		if _, ok := w.claims[id]; !ok {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(x, y flow.PortAllocation) int {
		return cmp.Or(x.VIP.Compare(y.VIP), cmp.Compare(x.First, y.First))
	})
	return out
}
