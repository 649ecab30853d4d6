package nexthop

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sysState is the Linux part of a Resolver: a netlink handle and the
// namespace it acts in. The zero value holds nothing.
type sysState struct {
	ns    netns.NsHandle // valid only when ownNS; else netns.None() is used
	ownNS bool
	h     *netlink.Handle
}

// nsHandle returns the namespace to subscribe in (None: the caller's).
func (s *sysState) nsHandle() netns.NsHandle {
	if s.ownNS {
		return s.ns
	}
	return netns.None()
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
		r.sys.h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
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
	r       *Resolver
	h       *netlink.Handle
	managed bool // trigger with managed entries (else NTF_USE)
	prefix  bool // learn prefix entries (Config.DisablePrefixCache unset)

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
	routeDirt              []netip.Prefix            // changed route prefixes not yet applied
	routeAll               bool                      // too many route changes: recheck everything
	changed                bool                      // cur differs from the published snapshot
	lastSweep, lastRefresh time.Time
}

// session subscribes and processes events until ctx is done or a
// subscription ends. resync marks every cached destination for resolution.
func (st *runState) session(ctx context.Context, resync bool) error {
	r := st.r
	ns := r.sys.nsHandle()
	done := make(chan struct{})
	neighCh := make(chan netlink.NeighUpdate, 1024)
	routeCh := make(chan netlink.RouteUpdate, 1024)
	linkCh := make(chan netlink.LinkUpdate, 64)
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
		case k := <-r.req:
			st.onRequest(k)
		case <-settle.C:
			settling = false
			st.applyRoutes()
		case now := <-tick.C:
			st.onTick(now)
		}
		// Take whatever else is already queued before publishing once.
		if batch < 256 && len(neighCh)+len(routeCh)+len(linkCh)+len(r.req) > 0 {
			continue
		}
		batch = -1
		st.flush()
	}
}

// loadNeighbors replaces the neighbour mirror with a dump of the kernel's
// tables.
func (st *runState) loadNeighbors() error {
	var list []netlink.Neigh
	var err error
	for range 5 {
		list, err = st.h.NeighList(0, netlink.FAMILY_ALL)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return err
	}
	old := st.neigh
	st.neigh = make(map[neighKey]neighInfo, len(list))
	for i := range list {
		if nk, n, ok := toNeighInfo(&list[i]); ok {
			st.neigh[nk] = n
		}
	}
	// Destinations whose neighbour changed while we were not listening.
	for nk := range st.byNeigh {
		if old[nk] != st.neigh[nk] {
			for k := range st.byNeigh[nk] {
				st.reneigh(k)
			}
		}
	}
	return nil
}

// toNeighInfo converts an IPv4/IPv6 neighbour entry; ok is false for
// others (bridge FDB, proxy entries).
func toNeighInfo(u *netlink.Neigh) (neighKey, neighInfo, bool) {
	if (u.Family != unix.AF_INET && u.Family != unix.AF_INET6) || u.Flags&netlink.NTF_PROXY != 0 {
		return neighKey{}, neighInfo{}, false
	}
	a, ok := netip.AddrFromSlice(u.IP)
	if !ok {
		return neighKey{}, neighInfo{}, false
	}
	n := neighInfo{state: u.State, managed: u.FlagsExt&netlink.NTF_EXT_MANAGED != 0}
	if len(u.HardwareAddr) == 6 {
		n.mac, n.hasMAC = [6]byte(u.HardwareAddr), true
	}
	return neighKey{int32(u.LinkIndex), a.Unmap().As16()}, n, true
}

// onRequest handles a miss queued by Lookup or Resolve.
func (st *runState) onRequest(k [16]byte) {
	p := destKey(netip.AddrFrom16(k))
	if _, ok := st.cur[p]; ok {
		return // already cached (duplicate request)
	}
	st.dirty[p] = struct{}{} // flush first checks whether a prefix entry answers for it
}

// onNeigh updates the neighbour mirror and the entries using it.
func (st *runState) onNeigh(u netlink.NeighUpdate) {
	st.r.stats.neighEvents.Add(1)
	nk, n, ok := toNeighInfo(&u.Neigh)
	if !ok {
		return
	}
	if u.Type == unix.RTM_DELNEIGH {
		delete(st.neigh, nk)
		delete(st.ours, nk)
		delete(st.triggered, nk) // ask again at once if still needed
	} else {
		st.neigh[nk] = n
	}
	for p := range st.byNeigh[nk] {
		st.reneigh(p)
	}
}

// reneigh re-evaluates entry p after its neighbour changed, without asking
// the FIB again.
func (st *runState) reneigh(p netip.Prefix) {
	old := st.cur[p]
	if old == nil || old.nh == (neighKey{}) {
		return
	}
	ne := &entry{hop: old.hop, nh: old.nh, rep: old.rep}
	st.applyNeigh(ne)
	st.set(p, old, ne)
	st.ensure(ne.nh, false)
}

// routeID identifies a route for the mirror of route prefixes. The mirror
// must never miss a prefix the kernel holds (a prefix entry could then
// straddle a route), while holding one too many only cuts prefix entries
// smaller. So identities are counted, not set: a route announced twice
// (replaced in place, or seen in the dump and as an event while Run
// subscribed) is kept until deleted twice, and two routes that look the
// same to us (vishvananda/netlink does not parse RTA_SRC, the source
// prefix of IPv6 source-specific routes) are both deleted before their
// prefix goes. A prefix held too long goes at the next refresh, which
// reloads the mirror when the tables are small (mirrorReloadMax routes).
type routeID struct {
	dst   netip.Prefix
	table int
	typ   int
	tos   int
	prio  int
	oif   int
	gw    netip.Addr
	src   netip.Addr // preferred source
	paths uint64     // a hash of the multipath next hops, 0 for none
}

// mirrorReloadMax is the largest mirror of route prefixes reloaded from a
// dump on every refresh. Bigger ones (full Internet tables) follow the
// route notifications only and are reloaded on resynchronisation.
const mirrorReloadMax = 1 << 16

// ipnetPrefix converts a route's or rule's destination; nil is the
// family's default route.
func ipnetPrefix(n *net.IPNet, fam int) (netip.Prefix, bool) {
	if n == nil {
		switch fam {
		case unix.AF_INET:
			return netip.PrefixFrom(netip.IPv4Unspecified(), 0), true
		case unix.AF_INET6:
			return netip.PrefixFrom(netip.IPv6Unspecified(), 0), true
		}
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	ones, size := n.Mask.Size()
	if size != a.BitLen() && !(size == 128 && a.Is4() && ones >= 96) {
		return netip.Prefix{}, false
	}
	if size == 128 && a.Is4() {
		ones -= 96
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}

// routeKey returns the prefix and identity of an IPv4 or IPv6 route.
func routeKey(rt *netlink.Route) (routeID, bool) {
	if rt.Family != unix.AF_INET && rt.Family != unix.AF_INET6 {
		return routeID{}, false
	}
	p, ok := ipnetPrefix(rt.Dst, rt.Family)
	if !ok {
		return routeID{}, false
	}
	id := routeID{dst: p, table: rt.Table, typ: rt.Type, tos: rt.Tos, prio: rt.Priority,
		oif: rt.LinkIndex, gw: gatewayOf(rt)}
	if src, ok := netip.AddrFromSlice(rt.Src); ok {
		id.src = src.Unmap()
	}
	for _, nh := range rt.MultiPath {
		h := fnv.New64a()
		h.Write(nh.Gw)
		if via, ok := nh.Via.(*netlink.Via); ok {
			h.Write(via.Addr)
		}
		fmt.Fprint(h, nh.LinkIndex, nh.Hops)
		id.paths = id.paths*31 + h.Sum64()
	}
	return id, true
}

// addRoute and delRoute keep the mirror of route prefixes in step with
// one route announced or deleted.
func (st *runState) addRoute(id routeID) {
	st.routeIDs[id]++
	if st.routeIDs[id] == 1 {
		st.bounds.add(id.dst)
	}
}

func (st *runState) delRoute(id routeID) {
	switch st.routeIDs[id] {
	case 0:
	case 1:
		delete(st.routeIDs, id)
		st.bounds.remove(id.dst)
	default:
		st.routeIDs[id]--
	}
}

// onRoute keeps the route mirror current and records the changed prefix;
// applyRoutes acts on the batch.
func (st *runState) onRoute(u netlink.RouteUpdate) {
	st.r.stats.routeEvents.Add(1)
	id, ok := routeKey(&u.Route)
	if !ok {
		return // not IPv4 or IPv6: cannot change our answers
	}
	if st.prefix {
		switch u.Type {
		case unix.RTM_NEWROUTE:
			st.addRoute(id)
		case unix.RTM_DELROUTE:
			st.delRoute(id)
		}
	}
	if st.routeAll {
		return
	}
	if len(st.routeDirt) >= 64 {
		st.routeAll = true
		st.routeDirt = st.routeDirt[:0]
		return
	}
	st.routeDirt = append(st.routeDirt, id.dst)
}

// loadBoundaries rebuilds the mirror of route and rule prefixes from a
// dump of every routing table and the policy rules. On error the mirror is
// left as it was.
func (st *runState) loadBoundaries() error {
	oldBounds, oldIDs, oldRules := st.bounds, st.routeIDs, st.rules
	var err error
	for range 5 {
		st.bounds, st.routeIDs, st.rules = boundaries{}, make(map[routeID]int32, len(oldIDs)), make(map[netip.Prefix]struct{})
		err = st.h.RouteListFilteredIter(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_TABLE, func(rt netlink.Route) bool {
				if id, ok := routeKey(&rt); ok {
					st.addRoute(id)
				}
				return true
			})
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		st.bounds, st.routeIDs, st.rules = oldBounds, oldIDs, oldRules
		return err
	}
	if st.loadRules() != nil {
		// No rules read: keep the old ones rather than none.
		for p := range oldRules {
			st.bounds.add(p)
		}
		st.rules = oldRules
	}
	return nil
}

// loadRules brings the rule destinations in the mirror up to date (rules
// have no notifications we follow: this runs on every refresh). On error
// the mirror is left as it was.
func (st *runState) loadRules() error {
	rules, err := st.h.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		st.r.cfg.Logger.Debug("nexthop: rule dump", "err", err)
		return err
	}
	next := make(map[netip.Prefix]struct{})
	for i := range rules {
		if rules[i].Dst == nil {
			continue
		}
		if p, ok := ipnetPrefix(rules[i].Dst, rules[i].Family); ok && p.Bits() > 0 {
			next[p] = struct{}{}
		}
	}
	for p := range st.rules {
		if _, ok := next[p]; !ok {
			st.bounds.remove(p)
		}
	}
	for p := range next {
		if _, ok := st.rules[p]; !ok {
			st.bounds.add(p)
		}
	}
	st.rules = next
	return nil
}

// applyRoutes marks for resolution every entry overlapping a changed
// prefix, or whose gateway is inside one: a route for P can only change the
// lookup of addresses in P (for a prefix entry containing P, of part of
// it), and the reachability of gateways in P.
func (st *runState) applyRoutes() {
	if !st.routeAll && len(st.routeDirt) == 0 {
		return
	}
	for p, e := range st.cur {
		if st.routeAll {
			st.dirty[p] = struct{}{}
			continue
		}
		for _, rp := range st.routeDirt {
			if rp.Overlaps(p) || (e.hop.Gateway.IsValid() && rp.Contains(e.hop.Gateway)) {
				st.dirty[p] = struct{}{}
				break
			}
		}
	}
	st.routeAll, st.routeDirt = false, st.routeDirt[:0]
	st.flush()
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

// onTick retries unresolved neighbours, refreshes and sweeps idle entries.
func (st *runState) onTick(now time.Time) {
	cfg := &st.r.cfg
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

// resolve resolves entry p (a destination, or a prefix entry through its
// representative) from the FIB and the neighbour mirror. The answer may
// hold for another key than p: a destination behind a gateway route
// yields a prefix entry, and a prefix entry whose route changed yields
// another prefix or its representative's own entry. p's entry then gives
// way to it.
func (st *runState) resolve(p netip.Prefix) {
	old := st.cur[p]
	var dst netip.Addr
	if isDest(p) {
		dst = p.Addr()
		if old == nil {
			if _, ok := st.covered(dst); ok {
				st.r.stats.covered.Add(1)
				return
			}
		}
	} else {
		if old == nil {
			return // dropped since it was marked
		}
		dst = old.rep
	}
	st.r.stats.resolutions.Add(1)
	ne, q := st.route(dst)
	if ne.nh != (neighKey{}) {
		st.applyNeigh(ne)
	}
	used := old == nil || old.used.Load() // a new destination was just asked for
	if q != p {
		if old != nil {
			st.remove(p, old)
		}
		old = st.cur[q]
		if !isDest(q) {
			if old != nil {
				ne.rep = old.rep // the same answer from another destination is no change
			} else {
				st.overlapping(q)
			}
		}
	}
	if !isDest(q) && ne.rep == (netip.Addr{}) {
		ne.rep = dst
	}
	if used {
		ne.used.Store(true)
	}
	if isDest(q) && st.prefix {
		if c, ok := st.covered(dst); ok {
			// A prefix entry claims dst but the kernel answers for dst
			// alone: that entry is out of date.
			st.dirty[c] = struct{}{}
		}
	}
	st.set(q, old, ne)
	if ne.nh != (neighKey{}) {
		st.ensure(ne.nh, false)
	}
}

// overlapping marks for resolution the prefix entries overlapping q, a new
// prefix entry: the mirror they were carved with is out of date.
func (st *runState) overlapping(q netip.Prefix) {
	for p := range st.pkeys {
		if p.Overlaps(q) {
			st.dirty[p] = struct{}{}
		}
	}
}

// covered returns the longest prefix entry holding a, if any.
func (st *runState) covered(a netip.Addr) (netip.Prefix, bool) {
	f := family(a)
	for l := a.BitLen() - 1; l >= 0; l-- {
		if st.plen[f][l] == 0 {
			continue
		}
		q := netip.PrefixFrom(a, l).Masked()
		if _, ok := st.pkeys[q]; ok {
			return q, true
		}
	}
	return netip.Prefix{}, false
}

// route fills the route part of an entry for dst and returns the key it
// answers for: dst's own, or with prefix caching, for a destination behind
// a single-path gateway route, the largest prefix around dst inside that
// route's prefix that no other route or rule splits.
func (st *runState) route(dst netip.Addr) (*entry, netip.Prefix) {
	self := destKey(dst)
	routes, err := st.h.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		return &entry{state: stateFailed, err: ErrNoRoute}, self
	}
	rt := routes[0]
	if rt.Type != unix.RTN_UNICAST {
		return &entry{state: stateFailed, err: ErrNotUnicast}, self
	}
	li, ok := st.link(rt.LinkIndex)
	if !ok {
		return &entry{state: stateFailed, err: ErrNotEthernet, hop: Hop{IfIndex: rt.LinkIndex}}, self
	}
	e := &entry{hop: Hop{IfIndex: rt.LinkIndex, SrcMAC: li.mac}}
	if src, ok := netip.AddrFromSlice(rt.Src); ok {
		e.hop.Src = src.Unmap()
	}
	nh := dst
	if gw := gatewayOf(&rt); gw.IsValid() {
		nh = gw
		e.hop.Gateway = gw
	}
	e.nh = neighKey{int32(rt.LinkIndex), nh.As16()}
	if e.hop.Gateway.IsValid() && st.prefix {
		if q, ok := st.fibPrefix(dst, &rt); ok {
			return e, q
		}
	}
	return e, self
}

// gatewayOf returns a route's gateway (RTA_GATEWAY, or RTA_VIA for an IPv4
// route via an IPv6 gateway, RFC 5549), or the zero Addr.
func gatewayOf(rt *netlink.Route) netip.Addr {
	if gw, ok := netip.AddrFromSlice(rt.Gw); ok {
		return gw.Unmap()
	}
	if via, ok := rt.Via.(*netlink.Via); ok {
		if gw, ok := netip.AddrFromSlice(via.Addr); ok {
			return gw.Unmap()
		}
	}
	return netip.Addr{}
}

// fibPrefix asks the kernel which FIB entry dst matched (RTM_F_FIB_MATCH)
// and returns the prefix the answer rt holds for. It declines (false) when
// the entry is not the single-path route rt came from (a multipath route,
// on which the kernel picks a path per destination, or a route changed
// between the two requests), or when routes or rules inside it leave only
// dst itself.
func (st *runState) fibPrefix(dst netip.Addr, rt *netlink.Route) (netip.Prefix, bool) {
	st.r.stats.fibMatches.Add(1)
	fm, err := st.h.RouteGetWithOptions(dst.AsSlice(), &netlink.RouteGetOptions{FIBMatch: true})
	if err != nil || len(fm) != 1 {
		return netip.Prefix{}, false
	}
	f := &fm[0]
	if f.Type != unix.RTN_UNICAST || len(f.MultiPath) != 0 || f.LinkIndex != rt.LinkIndex ||
		gatewayOf(f) != gatewayOf(rt) {
		return netip.Prefix{}, false
	}
	p, ok := ipnetPrefix(f.Dst, f.Family)
	if !ok || !p.Contains(dst) {
		return netip.Prefix{}, false
	}
	bits := st.bounds.carve(dst, p.Bits())
	if bits >= dst.BitLen() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(dst, bits).Masked(), true
}

// applyNeigh completes e (whose route part is set) from the neighbour mirror.
func (st *runState) applyNeigh(e *entry) {
	n, ok := st.neigh[e.nh]
	switch {
	case ok && n.valid():
		e.hop.DstMAC, e.state, e.err = n.mac, stateResolved, nil
	case ok && n.state&netlink.NUD_FAILED != 0:
		e.hop.DstMAC, e.state, e.err = [6]byte{}, stateFailed, ErrNeighborFailed
	default:
		e.hop.DstMAC, e.state, e.err = [6]byte{}, statePending, nil
	}
}

// link returns the MAC of an Ethernet link, caching it until a link event.
func (st *runState) link(idx int) (linkInfo, bool) {
	if li, ok := st.links[idx]; ok {
		return li, li.ethernet
	}
	var li linkInfo
	if l, err := st.h.LinkByIndex(idx); err == nil {
		a := l.Attrs()
		if a.EncapType == "ether" && len(a.HardwareAddr) == 6 {
			li = linkInfo{mac: [6]byte(a.HardwareAddr), ethernet: true}
		}
	}
	st.links[idx] = li
	return li, li.ethernet
}

// set replaces entry p's old value (nil if none) with ne, keeping the
// neighbour index, the counts and the next snapshot's tables in step. An
// unchanged entry keeps its old pointer.
func (st *runState) set(p netip.Prefix, old, ne *entry) {
	if old != nil && old.same(ne) {
		return
	}
	if old != nil {
		if old.used.Load() {
			ne.used.Store(true)
		}
		if old.nh != ne.nh {
			st.unindex(p, old.nh)
		}
		st.counts[old.state]--
	} else if !isDest(p) {
		st.pkeys[p] = struct{}{}
		st.plen[family(p.Addr())][p.Bits()]++
		st.r.stats.prefixesLearned.Add(1)
	}
	if ne.nh != (neighKey{}) {
		s := st.byNeigh[ne.nh]
		if s == nil {
			s = make(map[netip.Prefix]struct{})
			st.byNeigh[ne.nh] = s
		}
		s[p] = struct{}{}
	}
	st.counts[ne.state]++
	st.cur[p] = ne
	if isDest(p) {
		st.dests.put(p.Addr().As16(), ne)
	} else {
		st.pfxDiff = true
	}
	st.changed = true
}

func (st *runState) unindex(p netip.Prefix, nk neighKey) {
	if nk == (neighKey{}) {
		return
	}
	s := st.byNeigh[nk]
	delete(s, p)
	if len(s) == 0 {
		delete(st.byNeigh, nk)
		delete(st.triggered, nk)
		if _, mine := st.ours[nk]; mine {
			st.unmanage(nk)
		}
	}
}

// remove deletes entry p (whose value is e).
func (st *runState) remove(p netip.Prefix, e *entry) {
	delete(st.cur, p)
	st.unindex(p, e.nh)
	st.counts[e.state]--
	if isDest(p) {
		st.dests.del(p.Addr().As16())
	} else {
		delete(st.pkeys, p)
		st.plen[family(p.Addr())][p.Bits()]--
		st.pfxDiff = true
	}
	st.changed = true
}

// evict forgets an idle entry.
func (st *runState) evict(p netip.Prefix, e *entry) {
	st.r.stats.evictions.Add(1)
	st.remove(p, e)
}

// ensure asks the kernel to resolve neighbour nk if it needs to, at most
// once per RetryInterval unless force is set (a deleted entry resets the
// interval).
//
// In managed mode every neighbour a destination uses is made managed, even
// one already resolved: the kernel then keeps it verified (and follows a
// changed MAC) although our traffic bypasses it. In NTF_USE mode only an
// unresolved neighbour is probed. Static entries (PERMANENT, NOARP) are
// left alone: a managed or NTF_USE update would strip NUD_PERMANENT.
func (st *runState) ensure(nk neighKey, force bool) {
	n, known := st.neigh[nk]
	switch {
	case known && n.state&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0:
		return
	case st.managed && known && n.managed:
		return
	case !st.managed && known && n.valid():
		return
	}
	now := time.Now()
	if t, ok := st.triggered[nk]; ok && !force && now.Sub(t) < st.r.cfg.RetryInterval {
		return
	}
	st.triggered[nk] = now
	st.ask(nk)
}

// ask sends the request: a managed entry (NTF_EXT_MANAGED) in managed mode,
// else an NTF_USE update. Managed mode creates or converts an entry that
// the kernel resolves at once and keeps re-probing, so it stays REACHABLE;
// NTF_USE is the equivalent of the kernel having a packet to send: one
// probe sequence, after which the entry ages to STALE (still usable) or
// ends FAILED.
func (st *runState) ask(nk neighKey) {
	st.r.stats.triggers.Add(1)
	n := &netlink.Neigh{LinkIndex: int(nk.ifindex), IP: netip.AddrFrom16(nk.addr).Unmap().AsSlice()}
	if st.managed {
		n.FlagsExt = netlink.NTF_EXT_MANAGED
		err := st.h.NeighSet(n)
		if err == nil {
			st.ours[nk] = struct{}{}
			return
		}
		st.r.cfg.Logger.Info("nexthop: managed neighbour refused; using NTF_USE", "err", err)
		st.managed = false
		n.FlagsExt = 0
	}
	n.Flags = netlink.NTF_USE
	if err := st.h.NeighSet(n); err != nil {
		st.r.cfg.Logger.Debug("nexthop: neighbour trigger", "neighbour", n.IP, "err", err)
	}
}

// unmanage turns a managed entry we made back into an ordinary one,
// keeping its state (an NTF_USE update clears the managed flag). It does
// nothing if the entry is gone or someone replaced it with an unmanaged
// one.
func (st *runState) unmanage(nk neighKey) {
	delete(st.ours, nk)
	n, ok := st.neigh[nk]
	if !ok || !n.managed || n.state&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0 {
		return
	}
	_ = st.h.NeighSet(&netlink.Neigh{LinkIndex: int(nk.ifindex), IP: netip.AddrFrom16(nk.addr).Unmap().AsSlice(), Flags: netlink.NTF_USE})
}

// releaseManaged unmanages every entry we made managed (on Run's exit).
func (st *runState) releaseManaged() {
	for nk := range st.ours {
		st.unmanage(nk)
	}
}
