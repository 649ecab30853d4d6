package nexthop

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sysState is the Linux part of a Resolver: a netlink handle and the
// namespace it acts in. The zero value holds nothing.
type sysState struct {
	ns    netns.NsHandle // the namespace resolved in; valid only when ownNS
	ownNS bool
	h     *netlink.Handle
	// routeGet, when set, replaces h.RouteGet as Run's route query (a
	// test seam: it can fail the way the kernel's socket sometimes does).
	routeGet func(dst net.IP) ([]netlink.Route, error)
}

// subscribeNS returns the namespace for the calling thread, which must be
// locked, to subscribe in: None when the thread is in it already (no
// setns, which needs CAP_SYS_ADMIN), else the resolver's. Run's thread
// need not be in the namespace of the thread that called NewResolver.
func (s *sysState) subscribeNS() netns.NsHandle {
	if !s.ownNS {
		return netns.None()
	}
	if cur, err := netns.Get(); err == nil {
		defer cur.Close()
		if cur.Equal(s.ns) {
			return netns.None()
		}
	}
	return s.ns
}

func (s *sysState) close() error {
	if s.h != nil {
		s.h.Close()
		s.h = nil
	}
	if s.ownNS {
		s.ownNS = false
		return s.ns.Close()
	}
	return nil
}

// NewResolver returns a Resolver for the namespace cfg names. Nothing is
// resolved until Run is started.
func NewResolver(cfg Config) (*Resolver, error) {
	r, err := newResolver(cfg)
	if err != nil {
		return nil, err
	}
	if p := r.cfg.NetNSPath; p != "" {
		ns, err := netns.GetFromPath(p)
		if err != nil {
			return nil, fmt.Errorf("nexthop: open netns %s: %w", p, err)
		}
		r.sys.ns, r.sys.ownNS = ns, true
		r.sys.h, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	} else {
		// The calling thread's namespace, held for Run's subscriptions
		// (without /proc, Run's thread's namespace, normally the same).
		runtime.LockOSThread()
		if ns, err := netns.Get(); err == nil {
			r.sys.ns, r.sys.ownNS = ns, true
		}
		r.sys.h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		runtime.UnlockOSThread()
	}
	if err != nil {
		r.sys.close()
		return nil, fmt.Errorf("nexthop: netlink: %w", err)
	}
	return r, nil
}

// Run keeps the cache current until ctx is done or Close is called, then
// returns nil. It resolves queued misses, follows neighbour, route and link
// updates from the kernel (re-resolving only the destinations they affect),
// asks the kernel to resolve missing neighbours, retries, refreshes and
// evicts idle destinations. If it loses updates (socket overrun) it
// resubscribes and resolves everything again. It returns an error only if
// it cannot subscribe at all when it starts.
func (r *Resolver) Run(ctx context.Context) error {
	if err := r.startRun(); err != nil {
		return err
	}
	defer close(r.runDone)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.closing:
			cancel()
		case <-ctx.Done():
		}
	}()

	st := &runState{
		r:         r,
		h:         r.sys.h,
		routeGet:  r.sys.routeGet,
		managed:   !r.cfg.DisableManaged && managedSupported(kernelRelease()),
		prefix:    !r.cfg.DisablePrefixCache,
		cur:       make(map[netip.Prefix]*entry),
		pkeys:     make(map[netip.Prefix]struct{}),
		neigh:     make(map[neighKey]neighInfo),
		byNeigh:   make(map[neighKey]map[netip.Prefix]struct{}),
		links:     make(map[int]linkInfo),
		routeIDs:  make(map[routeID]int32),
		rules:     make(map[netip.Prefix]struct{}),
		dests:     newDestBuilder(),
		ours:      make(map[neighKey]struct{}),
		triggered: make(map[neighKey]time.Time),
		dirty:     make(map[netip.Prefix]struct{}),
		spare:     make(map[netip.Prefix]struct{}),
		retry:     make(map[netip.Prefix]struct{}),
	}
	if st.routeGet == nil {
		st.routeGet = st.h.RouteGet
	}
	defer st.releaseManaged()

	for first := true; ; first = false {
		err := st.session(ctx, !first)
		if ctx.Err() != nil {
			return nil
		}
		if first && errors.Is(err, errSubscribe) {
			return err
		}
		r.cfg.Logger.Warn("nexthop: lost kernel updates; resubscribing", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.cfg.RetryInterval):
		}
	}
}

// kernelRelease returns uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// managedSupported reports whether a kernel release has managed neighbour
// entries (NTF_EXT_MANAGED, Linux 5.16). Older kernels ignore the flag
// silently, so it must be known up front.
func managedSupported(release string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 5 || (major == 5 && minor >= 16)
}

var (
	errSubscribe = errors.New("nexthop: subscribe")
	errLost      = errors.New("nexthop: subscription ended (events lost)")
)

// neighInfo mirrors one kernel neighbour entry.
type neighInfo struct {
	mac     [6]byte
	hasMAC  bool
	state   int
	managed bool
}

const nudValid = netlink.NUD_PERMANENT | netlink.NUD_NOARP | netlink.NUD_REACHABLE |
	netlink.NUD_PROBE | netlink.NUD_STALE | netlink.NUD_DELAY

func (n neighInfo) valid() bool { return n.hasMAC && n.state&nudValid != 0 }

type linkInfo struct {
	mac      [6]byte
	ethernet bool
}

// runState is everything Run owns. Only Run's goroutine touches it.
//
// Entries are keyed by prefix: a destination's key is its full-length
// prefix (/32, /128), a prefix entry's the prefix it answers for.
type runState struct {
	r        *Resolver
	h        *netlink.Handle
	routeGet func(dst net.IP) ([]netlink.Route, error) // h.RouteGet but in tests
	managed  bool                                      // trigger with managed entries (else NTF_USE)
	prefix   bool                                      // learn prefix entries (Config.DisablePrefixCache unset)

	cur     map[netip.Prefix]*entry                // the next snapshot's contents
	pkeys   map[netip.Prefix]struct{}              // the prefix entries among cur
	plen    [2][129]int32                          // prefix entries by family and length
	neigh   map[neighKey]neighInfo                 // mirror of the kernel's neighbour tables
	byNeigh map[neighKey]map[netip.Prefix]struct{} // entries using each neighbour
	links   map[int]linkInfo                       // egress links seen, by index

	bounds   boundaries                // route and rule prefixes (with prefix caching only)
	routeIDs map[routeID]int32         // the routes whose prefixes bounds holds
	rules    map[netip.Prefix]struct{} // the rule destinations bounds holds

	dests   destBuilder // the per-destination entries of the next snapshot
	pfxDiff bool        // prefix entries changed since the last publish
	counts  [3]int      // entries by state

	ours                   map[neighKey]struct{}     // neighbours we made managed
	triggered              map[neighKey]time.Time    // last trigger per neighbour
	dirty, spare           map[netip.Prefix]struct{} // entries or destinations to resolve (again)
	retry                  map[netip.Prefix]struct{} // whose route query failed: resolved again at the next tick
	routeDirt              []netip.Prefix            // changed route prefixes not yet applied
	routeAll               bool                      // too many route changes: recheck everything
	changed                bool                      // cur differs from the published snapshot
	lastSweep, lastRefresh time.Time
}

// session subscribes and processes events until ctx is done or a
// subscription ends. resync marks every cached destination for resolution.
func (st *runState) session(ctx context.Context, resync bool) error {
	r := st.r
	runtime.LockOSThread() // for subscribeNS
	ns := r.sys.subscribeNS()
	done := make(chan struct{})
	neighCh := make(chan netlink.NeighUpdate, 1024)
	routeCh := make(chan netlink.RouteUpdate, 1024)
	linkCh := make(chan netlink.LinkUpdate, 64)
	nhCh := make(chan struct{}, 1)
	onErr := func(err error) { r.cfg.Logger.Debug("nexthop: subscription error", "err", err) }
	const rcvbuf = 4 << 20 // capped by net.core.rmem_max
	var subErr error
	if err := netlink.NeighSubscribeWithOptions(neighCh, done, netlink.NeighSubscribeOptions{
		Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: rcvbuf,
	}); err != nil {
		subErr = err
		close(neighCh)
	}
	if err := netlink.RouteSubscribeWithOptions(routeCh, done, netlink.RouteSubscribeOptions{
		Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: rcvbuf,
	}); err != nil {
		subErr = err
		close(routeCh)
	}
	if err := netlink.LinkSubscribeWithOptions(linkCh, done, netlink.LinkSubscribeOptions{
		Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: rcvbuf,
	}); err != nil {
		subErr = err
		close(linkCh)
	}
	if err := subscribeNexthops(ns, nhCh, done, rcvbuf, onErr); err != nil {
		subErr = err
		close(nhCh)
	}
	runtime.UnlockOSThread()
	defer func() {
		// Stop the subscriptions and drain them: their goroutines may be
		// blocked sending to us.
		close(done)
		for range neighCh {
		}
		for range routeCh {
		}
		for range linkCh {
		}
		for range nhCh {
		}
	}()
	if subErr != nil {
		return fmt.Errorf("%w: %w", errSubscribe, subErr)
	}
	// Subscribed first, then dumped: every change after the dump is queued
	// as an event, so the mirror cannot miss one.
	if err := st.loadNeighbors(); err != nil {
		return fmt.Errorf("%w: neighbour dump: %w", errSubscribe, err)
	}
	if st.prefix {
		if err := st.loadBoundaries(); err != nil {
			return fmt.Errorf("%w: route dump: %w", errSubscribe, err)
		}
	}
	if resync {
		r.stats.resyncs.Add(1)
		clear(st.links)
		for k := range st.cur {
			st.dirty[k] = struct{}{}
		}
	}
	st.flush()

	now := time.Now()
	st.lastSweep, st.lastRefresh = now, now
	tick := time.NewTicker(r.cfg.RetryInterval)
	defer tick.Stop()
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	settling := false

	for batch := 0; ; batch++ {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-neighCh:
			if !ok {
				return errLost
			}
			st.onNeigh(u)
		case u, ok := <-routeCh:
			if !ok {
				return errLost
			}
			st.onRoute(u)
			if !settling {
				settle.Reset(r.cfg.RouteSettle)
				settling = true
			}
		case u, ok := <-linkCh:
			if !ok {
				return errLost
			}
			st.onLink(u)
		case _, ok := <-nhCh:
			if !ok {
				return errLost
			}
			st.onNexthop()
			if !settling {
				settle.Reset(r.cfg.RouteSettle)
				settling = true
			}
		case k := <-r.req:
			st.onRequest(k)
		case <-settle.C:
			settling = false
			st.applyRoutes()
		case now := <-tick.C:
			st.onTick(now)
		}
		// Take whatever else is already queued before publishing once.
		if batch < 256 && len(neighCh)+len(routeCh)+len(linkCh)+len(nhCh)+len(r.req) > 0 {
			continue
		}
		batch = -1
		st.flush()
	}
}

// onLink forgets what is known about a link and re-resolves the entries
// leaving through it (its MAC, state or routes may have changed).
func (st *runState) onLink(u netlink.LinkUpdate) {
	st.r.stats.linkEvents.Add(1)
	idx := int(u.Index)
	delete(st.links, idx)
	for p, e := range st.cur {
		if e.hop.IfIndex == idx {
			st.dirty[p] = struct{}{}
		}
	}
}

// onTick retries unresolved neighbours and failed route queries, refreshes
// and sweeps idle entries.
func (st *runState) onTick(now time.Time) {
	cfg := &st.r.cfg
	for p := range st.retry {
		st.dirty[p] = struct{}{}
	}
	clear(st.retry)
	for _, e := range st.cur {
		if e.state != stateResolved && e.nh != (neighKey{}) {
			st.ensure(e.nh, false)
		}
	}
	if now.Sub(st.lastRefresh) >= cfg.RefreshInterval {
		st.lastRefresh = now
		if st.prefix {
			if len(st.routeIDs) > mirrorReloadMax || st.loadBoundaries() != nil {
				_ = st.loadRules()
			}
		}
		for p := range st.cur {
			st.dirty[p] = struct{}{}
		}
		if !st.managed {
			// Without managed entries nothing keeps used neighbours
			// verified (our traffic bypasses the kernel): re-probe stale ones.
			for nk := range st.byNeigh {
				if n, ok := st.neigh[nk]; ok && n.state&netlink.NUD_STALE != 0 {
					st.ask(nk)
				}
			}
		}
	}
	if cfg.IdleTimeout > 0 && now.Sub(st.lastSweep) >= cfg.IdleTimeout {
		st.lastSweep = now
		for p, e := range st.cur {
			if !e.used.Swap(false) {
				st.evict(p, e)
			}
		}
		// Data-path caches (Stage's, per worker) answer from their own
		// copies without calling Lookup, so used stays clear for a
		// destination they keep sending to. A new version empties them:
		// the next packet to each destination in use looks it up again
		// and marks it before the next sweep.
		if len(st.cur) > 0 {
			st.changed = true
		}
	}
	st.flush()
}

// flushRounds bounds the passes flush makes over entries that resolving
// others marked (stale prefix entries overlapping a new answer).
const flushRounds = 4

// flush resolves the dirty entries and publishes a new snapshot if
// anything changed.
func (st *runState) flush() {
	for round := 0; round < flushRounds && len(st.dirty) > 0; round++ {
		work := st.dirty
		st.dirty, st.spare = st.spare, nil
		// Prefix entries first: once current, they answer for the queued
		// destinations inside them.
		for p := range work {
			if !isDest(p) {
				st.resolve(p)
			}
		}
		for p := range work {
			if isDest(p) {
				st.resolve(p)
			}
		}
		clear(work)
		st.spare = work
	}
	if !st.changed {
		return
	}
	st.changed = false
	prev := st.r.tab.Load()
	v4, v6, prefixes := prev.v4, prev.v6, prev.prefixes
	if st.pfxDiff {
		st.pfxDiff = false
		ps := make([]prefixEntry, 0, len(st.pkeys))
		for p := range st.pkeys {
			ps = append(ps, prefixEntry{p, st.cur[p]})
		}
		v4, v6, prefixes = prefixTables(ps)
	}
	st.r.publish(st.dests.publish(), v4, v6, prefixes, st.counts)
}
