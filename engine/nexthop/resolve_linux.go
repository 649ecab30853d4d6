package nexthop

import (
	"errors"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

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
	ne, q, err := st.route(dst)
	if err != nil {
		// The query failed, not the destination: keep what is cached
		// (for a new destination nothing, so that the next Lookup asks
		// again) and ask again at the next tick.
		st.r.stats.routeErrors.Add(1)
		st.r.cfg.Logger.Debug("nexthop: route query failed; asking again", "dst", dst, "err", err)
		if len(st.retry) < st.r.cfg.QueueLen {
			st.retry[p] = struct{}{}
		}
		return
	}
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
// route's prefix that no other route or rule splits. An error means the
// route query itself failed (see noRouteAnswer): there is no answer.
func (st *runState) route(dst netip.Addr) (*entry, netip.Prefix, error) {
	self := destKey(dst)
	routes, err := st.routeGet(dst.AsSlice())
	if err != nil && !noRouteAnswer(err) {
		return nil, self, err
	}
	if err != nil || len(routes) == 0 {
		return &entry{state: stateFailed, err: ErrNoRoute}, self, nil
	}
	rt := routes[0]
	if rt.Type != unix.RTN_UNICAST {
		return &entry{state: stateFailed, err: ErrNotUnicast}, self, nil
	}
	li, ok := st.link(rt.LinkIndex)
	if !ok {
		return &entry{state: stateFailed, err: ErrNotEthernet, hop: Hop{IfIndex: rt.LinkIndex}}, self, nil
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
			return e, q, nil
		}
	}
	return e, self, nil
}

// noRouteAnswer reports whether a failed route query is the kernel's
// answer for the destination: no route matched it (ENETUNREACH, also for
// a "throw" route; ESRCH), or the route that matched refuses it
// (EHOSTUNREACH for "unreachable", EACCES for "prohibit", EINVAL for
// "blackhole"). Such an answer is cached like any other, until a route
// change or the next refresh. Any other error (EINTR, ENOBUFS, EAGAIN for
// a socket timeout, a malformed or mismatched reply) is a failure of the
// query that says nothing about the destination: it is not cached.
func noRouteAnswer(err error) bool {
	for _, e := range [...]unix.Errno{unix.ENETUNREACH, unix.EHOSTUNREACH, unix.ESRCH, unix.EACCES, unix.EINVAL} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
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

// link returns the MAC of an Ethernet link, caching the kernel's answer
// until a link event. A query that failed is not cached: the next resolve
// asks again (a refresh, at the latest), where a cached failure would
// have lasted until the link's next event.
func (st *runState) link(idx int) (linkInfo, bool) {
	if li, ok := st.links[idx]; ok {
		return li, li.ethernet
	}
	l, err := st.h.LinkByIndex(idx)
	if err != nil {
		return linkInfo{}, false
	}
	var li linkInfo
	if a := l.Attrs(); a.EncapType == "ether" && len(a.HardwareAddr) == 6 {
		li = linkInfo{mac: [6]byte(a.HardwareAddr), ethernet: true}
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
	delete(st.retry, p)
	st.remove(p, e)
}
