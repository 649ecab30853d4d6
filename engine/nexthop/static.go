package nexthop

import "net/netip"

// Static is a Source with fixed answers: Hops[dst] for a destination it
// lists, Default for every other one. A Hop whose IfIndex is 0 (the zero
// Hop) is a miss, so a zero Default resolves only the listed
// destinations, and a listed zero Hop leaves one destination unresolved
// beside a Default. Its answers never change, so it is a VersionedSource
// at version 1 whose answers a Stage caches per worker; Hops must not be
// modified while a Stage uses it.
//
// It serves tests, examples and benchmarks (a warm Resolver between route
// or neighbour changes answers the same way), and data paths whose next
// hops are fixed. A node that follows the kernel's routes uses a Resolver.
type Static struct {
	Hops    map[netip.Addr]Hop
	Default Hop
}

// Lookup implements Source.
func (s Static) Lookup(dst netip.Addr) (Hop, bool) {
	h, ok := s.Hops[dst]
	if !ok {
		h = s.Default
	}
	return h, h.IfIndex != 0
}

// Version implements VersionedSource: always 1.
func (s Static) Version() uint64 { return 1 }

var _ VersionedSource = Static{}
