package nexthop

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

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
