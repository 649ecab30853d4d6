package nexthop

import (
	"context"
	"errors"
	"fmt"
	"maps"
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
		cur:       make(map[[16]byte]*entry),
		neigh:     make(map[neighKey]neighInfo),
		byNeigh:   make(map[neighKey]map[[16]byte]struct{}),
		links:     make(map[int]linkInfo),
		ours:      make(map[neighKey]struct{}),
		triggered: make(map[neighKey]time.Time),
		dirty:     make(map[[16]byte]struct{}),
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
type runState struct {
	r       *Resolver
	h       *netlink.Handle
	managed bool // trigger with managed entries (else NTF_USE)

	cur     map[[16]byte]*entry                // the next snapshot's contents
	neigh   map[neighKey]neighInfo             // mirror of the kernel's neighbour tables
	byNeigh map[neighKey]map[[16]byte]struct{} // destinations using each neighbour
	links   map[int]linkInfo                   // egress links seen, by index

	ours                   map[neighKey]struct{}  // neighbours we made managed
	triggered              map[neighKey]time.Time // last trigger per neighbour
	dirty                  map[[16]byte]struct{}  // destinations to resolve again
	routeDirt              []*net.IPNet           // changed route prefixes not yet applied
	routeAll               bool                   // too many route changes: recheck everything
	changed                bool                   // cur differs from the published snapshot
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
	if _, ok := st.cur[k]; ok {
		return // already cached (duplicate request)
	}
	st.dirty[k] = struct{}{}
}

// onNeigh updates the neighbour mirror and the destinations using it.
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
	for k := range st.byNeigh[nk] {
		st.reneigh(k)
	}
}

// reneigh re-evaluates destination k after its neighbour changed, without
// asking the FIB again.
func (st *runState) reneigh(k [16]byte) {
	old := st.cur[k]
	if old == nil || old.nh == (neighKey{}) {
		return
	}
	ne := &entry{hop: old.hop, nh: old.nh}
	st.applyNeigh(ne)
	st.set(k, old, ne)
	st.ensure(ne.nh, false)
}

// onRoute records a changed route prefix; applyRoutes acts on the batch.
func (st *runState) onRoute(u netlink.RouteUpdate) {
	st.r.stats.routeEvents.Add(1)
	if st.routeAll {
		return
	}
	if u.Dst == nil || len(st.routeDirt) >= 64 {
		st.routeAll = true
		st.routeDirt = st.routeDirt[:0]
		return
	}
	st.routeDirt = append(st.routeDirt, u.Dst)
}

// applyRoutes marks for resolution every destination, or gateway, inside a
// changed prefix: a route for P can only change the lookup of addresses in
// P, and the reachability of gateways in P.
func (st *runState) applyRoutes() {
	if !st.routeAll && len(st.routeDirt) == 0 {
		return
	}
	for k, e := range st.cur {
		if st.routeAll {
			st.dirty[k] = struct{}{}
			continue
		}
		dst := netip.AddrFrom16(k).Unmap()
		for _, p := range st.routeDirt {
			if p.Contains(dst.AsSlice()) || (e.hop.Gateway.IsValid() && p.Contains(e.hop.Gateway.AsSlice())) {
				st.dirty[k] = struct{}{}
				break
			}
		}
	}
	st.routeAll, st.routeDirt = false, st.routeDirt[:0]
	st.flush()
}

// onLink forgets what is known about a link and re-resolves destinations
// leaving through it (its MAC, state or routes may have changed).
func (st *runState) onLink(u netlink.LinkUpdate) {
	st.r.stats.linkEvents.Add(1)
	idx := int(u.Index)
	delete(st.links, idx)
	for k, e := range st.cur {
		if e.hop.IfIndex == idx {
			st.dirty[k] = struct{}{}
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
		for k := range st.cur {
			st.dirty[k] = struct{}{}
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
		for k, e := range st.cur {
			if !e.used.Swap(false) {
				st.evict(k, e)
			}
		}
	}
	st.flush()
}

// flush resolves the dirty destinations and publishes a new snapshot if
// anything changed.
func (st *runState) flush() {
	for k := range st.dirty {
		st.resolve(k)
	}
	clear(st.dirty)
	if !st.changed {
		return
	}
	st.changed = false
	s := &Snapshot{m: maps.Clone(st.cur), req: st.r.req, changed: make(chan struct{}),
		version: st.r.tab.Load().version + 1} // Run is the only publisher
	for _, e := range s.m {
		s.counts[e.state]++
	}
	old := st.r.tab.Swap(s)
	close(old.changed)
}

// resolve looks destination k up in the FIB and the neighbour mirror.
func (st *runState) resolve(k [16]byte) {
	st.r.stats.resolutions.Add(1)
	dst := netip.AddrFrom16(k).Unmap()
	old := st.cur[k]
	ne := st.route(dst)
	if ne.nh != (neighKey{}) {
		st.applyNeigh(ne)
	}
	if old == nil {
		ne.used.Store(true) // it was just asked for
	}
	st.set(k, old, ne)
	if ne.nh != (neighKey{}) {
		st.ensure(ne.nh, false)
	}
}

// route fills the route part of an entry for dst.
func (st *runState) route(dst netip.Addr) *entry {
	routes, err := st.h.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		return &entry{state: stateFailed, err: ErrNoRoute}
	}
	rt := routes[0]
	if rt.Type != unix.RTN_UNICAST {
		return &entry{state: stateFailed, err: ErrNotUnicast}
	}
	li, ok := st.link(rt.LinkIndex)
	if !ok {
		return &entry{state: stateFailed, err: ErrNotEthernet, hop: Hop{IfIndex: rt.LinkIndex}}
	}
	e := &entry{hop: Hop{IfIndex: rt.LinkIndex, SrcMAC: li.mac}}
	if src, ok := netip.AddrFromSlice(rt.Src); ok {
		e.hop.Src = src.Unmap()
	}
	nh := dst
	if gw, ok := netip.AddrFromSlice(rt.Gw); ok {
		nh = gw.Unmap()
		e.hop.Gateway = nh
	} else if via, ok := rt.Via.(*netlink.Via); ok {
		if gw, ok := netip.AddrFromSlice(via.Addr); ok { // RFC 5549: IPv4 via an IPv6 gateway
			nh = gw.Unmap()
			e.hop.Gateway = nh
		}
	}
	e.nh = neighKey{int32(rt.LinkIndex), nh.As16()}
	return e
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

// set replaces destination k's entry old (nil if none) with ne, keeping the
// neighbour index in step. An unchanged entry keeps its old pointer.
func (st *runState) set(k [16]byte, old, ne *entry) {
	if old != nil && old.same(ne) {
		return
	}
	if old != nil {
		if old.used.Load() {
			ne.used.Store(true)
		}
		if old.nh != ne.nh {
			st.unindex(k, old.nh)
		}
	}
	if ne.nh != (neighKey{}) {
		s := st.byNeigh[ne.nh]
		if s == nil {
			s = make(map[[16]byte]struct{})
			st.byNeigh[ne.nh] = s
		}
		s[k] = struct{}{}
	}
	st.cur[k] = ne
	st.changed = true
}

func (st *runState) unindex(k [16]byte, nk neighKey) {
	if nk == (neighKey{}) {
		return
	}
	s := st.byNeigh[nk]
	delete(s, k)
	if len(s) == 0 {
		delete(st.byNeigh, nk)
		delete(st.triggered, nk)
		if _, mine := st.ours[nk]; mine {
			st.unmanage(nk)
		}
	}
}

func (st *runState) evict(k [16]byte, e *entry) {
	st.r.stats.evictions.Add(1)
	delete(st.cur, k)
	st.unindex(k, e.nh)
	st.changed = true
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
