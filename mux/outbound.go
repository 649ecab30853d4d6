package mux

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
)

// Returning traffic. A VM's outbound connection leaves its host
// source-NATed to VIP:port, the port from a range allocated to the VM
// (static in the document's outbound section, or dynamic: claimed by its
// Host Agent in the fleet's store and handed to SetPortAllocations). The
// replies reach a Mux; the Controller publishes, with the rules of each
// version, a range table (balance.Returns) of every allocation, by which
// the balancing stage sends a reply to its owner's host instead of
// balancing it.

// ErrAllocationRefused wraps the reason an allocation was refused
// (SetPortAllocations, Apply).
var ErrAllocationRefused = errors.New("mux: outbound allocation refused")

// SetPortAllocations replaces the dynamic outbound allocations (those
// not in the document: claimed by Host Agents, e.g. through etcd) and
// publishes the range table they make with the document's static ones,
// in one snapshot with the running rules: a batch sees the old set or
// the new one.
//
// An owner needs only its DIP: a zero VNI is the outbound section's, and
// a missing host or MAC is the DIP's in the document's hosts[] (a caller
// that sets them must agree with the section's VNI). An allocation is
// refused — left out of the table, counted
// (xdplb_outbound_allocations_refused_total) and logged — when its
// address has no outbound section in the running document, its DIP is
// not one of the section's, it is not within the section's pool, it holds
// one of the address's inbound ports, or it overlaps a static allocation
// or an allocation before it in allocs; the others are applied, and the
// error returned names every refusal (each wraps ErrAllocationRefused).
// The set is kept: each new document is applied with it, and refuses
// what it no longer allows. Before the first document the set is only
// kept. Safe for concurrent use.
func (c *Controller) SetPortAllocations(allocs []flow.PortAllocation) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dynamic = slices.Clone(allocs)
	if c.plan == nil {
		return nil
	}
	returns, refusals := c.buildReturns(c.plan, c.dynamic)
	if returns == nil {
		return errors.Join(refusals...) // cannot happen: the table was checked
	}
	c.returns = returns
	c.logRefusals(c.plan.Version, refusals)
	if c.snap != nil {
		c.store(c.snap)
	}
	c.log.Info("mux: outbound allocations", "dynamic", len(allocs), "refused", len(refusals), "allocations", returns.Len())
	return errors.Join(refusals...)
}

// PortAllocations returns every allocation of the running range table:
// the document's static ones, then the dynamic ones accepted.
func (c *Controller) PortAllocations() []flow.PortAllocation {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []flow.PortAllocation
	if c.plan != nil {
		for i := range c.plan.Outbound {
			out = append(out, c.plan.Outbound[i].Static...)
		}
		accepted, _ := acceptAllocations(c.plan, c.dynamic)
		out = append(out, accepted...)
	}
	return out
}

// buildReturns builds the range table of plan's outbound sections with
// the dynamic allocations they allow, and returns it with the refusals;
// nil when the table cannot be built (then the refusals say why). Called
// with c.mu held.
func (c *Controller) buildReturns(plan *Plan, dynamic []flow.PortAllocation) (*balance.Returns, []error) {
	accepted, refusals := acceptAllocations(plan, dynamic)
	var cfg balance.ReturnsConfig
	for i := range plan.Outbound {
		o := &plan.Outbound[i]
		c.outboundIndex(o.Address)
		for _, r := range o.Pool {
			cfg.Pools = append(cfg.Pools, flow.PortAllocation{VIP: o.Address, First: r.First, Last: r.Last})
		}
		cfg.Allocations = append(cfg.Allocations, o.Static...)
	}
	cfg.Allocations = append(cfg.Allocations, accepted...)
	idx := c.outIndex
	cfg.Counter = func(a netip.Addr) uint32 { return idx[a] }
	t, err := balance.NewReturns(cfg)
	if err != nil {
		return nil, append(refusals, err)
	}
	return t, refusals
}

// outboundIndex returns the counter index of address a (Account counts
// its returning traffic under it), giving it the next one the first time.
// Indexes are never reused, so a reload keeps an address's counts.
// Called with c.mu held.
func (c *Controller) outboundIndex(a netip.Addr) uint32 {
	if c.outIndex == nil {
		c.outIndex = map[netip.Addr]uint32{}
	}
	i, ok := c.outIndex[a]
	if !ok {
		// A new map: a range table built before keeps reading its own.
		next := make(map[netip.Addr]uint32, len(c.outIndex)+1)
		for k, v := range c.outIndex {
			next[k] = v
		}
		i = uint32(len(c.outIndex))
		next[a] = i
		c.outIndex = next
	}
	return i
}

// outboundIndexes returns every outbound address's counter index, for
// the metrics.
func (c *Controller) outboundIndexes() map[netip.Addr]uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.outIndex // never changed in place
}

// logRefusals counts and logs refused allocations. Called with c.mu held.
func (c *Controller) logRefusals(version uint64, refusals []error) {
	if len(refusals) == 0 {
		return
	}
	c.refused.Add(uint64(len(refusals)))
	for _, err := range refusals {
		c.log.Warn("mux: outbound allocation refused", "version", version, "err", err)
	}
}

// acceptAllocations completes the owners of dynamic allocations from
// plan and returns those plan allows, and an error for each other.
func acceptAllocations(plan *Plan, dynamic []flow.PortAllocation) (accepted []flow.PortAllocation, refusals []error) {
	for _, a := range dynamic {
		full, err := checkAllocation(plan, a, accepted)
		if err != nil {
			refusals = append(refusals, err)
			continue
		}
		accepted = append(accepted, full)
	}
	return accepted, refusals
}

// checkAllocation checks a dynamic allocation against plan and the
// allocations accepted before it, and returns it with its owner
// completed.
func checkAllocation(plan *Plan, a flow.PortAllocation, before []flow.PortAllocation) (flow.PortAllocation, error) {
	refuse := func(format string, args ...any) (flow.PortAllocation, error) {
		return a, fmt.Errorf("%w: %v:%d-%d (DIP %v): %s", ErrAllocationRefused, a.VIP, a.First, a.Last, a.Owner.DIP, fmt.Sprintf(format, args...))
	}
	a.VIP = a.VIP.Unmap()
	var o *OutboundPlan
	for i := range plan.Outbound {
		if plan.Outbound[i].Address == a.VIP {
			o = &plan.Outbound[i]
		}
	}
	overlaps := func(b flow.PortAllocation) bool { return b.VIP == a.VIP && b.First <= a.Last && a.First <= b.Last }
	switch {
	case o == nil:
		return refuse("the address has no outbound section")
	case a.Last < a.First:
		return refuse("an empty range")
	case slices.ContainsFunc(o.Inbound, func(p uint16) bool { return p >= a.First && p <= a.Last }):
		return refuse("it holds an inbound port of the address (%v)", o.Inbound)
	case !slices.ContainsFunc(o.Pool, func(r control.PortRange) bool { return r.First <= a.First && a.Last <= r.Last }):
		return refuse("not within the pool %v", o.Pool)
	case slices.ContainsFunc(o.Static, overlaps):
		return refuse("it overlaps a static allocation")
	case slices.ContainsFunc(before, overlaps):
		return refuse("it overlaps another dynamic allocation")
	}
	site, ok := o.Owners[a.Owner.DIP]
	if !ok {
		return refuse("the DIP is not one of the outbound section's")
	}
	own := &a.Owner
	switch {
	case own.VNI != 0 && own.VNI != o.VNI:
		return refuse("VNI %d, the section's is %d", own.VNI, o.VNI)
	case own.Host.IsValid() && own.MAC == [6]byte{} && own.Host != site.Host:
		return refuse("host %v, hosts[] puts the DIP on %v", own.Host, site.Host)
	}
	own.VNI = o.VNI
	if !own.Host.IsValid() {
		own.Host = site.Host
	}
	if own.MAC == [6]byte{} {
		own.MAC = site.MAC
	}
	return a, nil
}
