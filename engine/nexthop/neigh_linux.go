package nexthop

import (
	"errors"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

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
		// A request can fail for reasons of its own (the link is gone,
		// the table is full). Managed entries are given up only when the
		// kernel refuses them but takes the same request without the flag.
		n.FlagsExt, n.Flags = 0, netlink.NTF_USE
		if uerr := st.h.NeighSet(n); uerr != nil {
			st.r.cfg.Logger.Debug("nexthop: neighbour trigger", "neighbour", n.IP, "err", err, "ntf_use_err", uerr)
			return
		}
		st.r.cfg.Logger.Info("nexthop: managed neighbour refused; using NTF_USE", "err", err)
		st.managed = false
		return
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
