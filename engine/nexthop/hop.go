package nexthop

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"
)

// Hop is where to send a frame for one destination: out of which interface,
// from which MAC address, to which MAC address. It is a plain value, safe to
// copy and compare.
type Hop struct {
	IfIndex int        // egress interface index
	SrcMAC  [6]byte    // the egress interface's MAC
	DstMAC  [6]byte    // the next hop's MAC (the gateway's, or the destination's when on-link)
	Gateway netip.Addr // the route's gateway; invalid (zero) when the destination is on-link
	Src     netip.Addr // the route's preferred source address; may be invalid
}

// Errors returned by Resolve (and recorded for destinations that cannot be
// resolved). Lookup never returns an error: it reports a miss with false.
var (
	ErrNoRoute        = errors.New("nexthop: no route to destination")
	ErrNotUnicast     = errors.New("nexthop: destination is local, broadcast or multicast")
	ErrNotEthernet    = errors.New("nexthop: egress interface is not Ethernet")
	ErrNeighborFailed = errors.New("nexthop: neighbour resolution failed")
	ErrUnresolved     = errors.New("nexthop: not resolved")
	ErrInvalidAddr    = errors.New("nexthop: invalid destination address")
	ErrClosed         = errors.New("nexthop: resolver closed")
	ErrNotSupported   = errors.New("nexthop: next-hop resolution needs Linux")
)

// Config configures a Resolver. The zero value is valid and means: the
// caller's network namespace and the defaults below.
type Config struct {
	// NetNSPath is the network namespace to resolve in, as a path
	// ("/run/netns/NAME", "/proc/PID/ns/net"). Empty: the namespace of the
	// thread calling NewResolver (normally the process's).
	NetNSPath string

	// RefreshInterval is how often every cached destination is resolved
	// again from the FIB (a safety net behind the netlink events), and, in
	// NTF_USE mode, how often stale neighbours are re-probed. Default 30s.
	RefreshInterval time.Duration

	// RetryInterval is how often an unresolved neighbour is triggered again
	// and how long Run waits before resubscribing after losing events.
	// Default 1s.
	RetryInterval time.Duration

	// RouteSettle delays the processing of route changes to batch a burst
	// (a routing daemon installing many routes) into one pass. Default 20ms.
	RouteSettle time.Duration

	// IdleTimeout forgets destinations not looked up for between one and two
	// times this long. Default 5m; negative: never forget.
	IdleTimeout time.Duration

	// QueueLen is the capacity of the miss queue between Lookup and Run.
	// Misses beyond it are dropped and retried by the next Lookup.
	// Default 1024.
	QueueLen int

	// DisableManaged makes the resolver trigger neighbour resolution with
	// one-shot NTF_USE requests instead of creating "managed" neighbour
	// entries (NTF_EXT_MANAGED, Linux ≥ 5.16) that the kernel keeps
	// resolved by itself. Older kernels fall back to NTF_USE automatically.
	DisableManaged bool

	// DisablePrefixCache caches every destination on its own, as one FIB
	// lookup each, instead of caching the answer for a gateway route once
	// for the whole part of its prefix that no other route or rule splits
	// (see "Prefix entries" in the package documentation). Set it when the
	// kernel's answers depend on the destination in ways the resolver does
	// not see: ICMP redirects accepted into the routing cache, or on a host
	// with a full Internet routing table, to save the memory of mirroring
	// its route prefixes.
	DisablePrefixCache bool

	// Logger receives rare events (resubscriptions, fallbacks). Nil: none.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.RefreshInterval == 0 {
		c.RefreshInterval = 30 * time.Second
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = time.Second
	}
	if c.RouteSettle == 0 {
		c.RouteSettle = 20 * time.Millisecond
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 5 * time.Minute
	}
	if c.QueueLen == 0 {
		c.QueueLen = 1024
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	switch {
	case c.RefreshInterval < 0, c.RetryInterval < 0, c.RouteSettle < 0:
		return fmt.Errorf("nexthop: negative interval in %+v", c)
	case c.QueueLen < 0:
		return fmt.Errorf("nexthop: negative QueueLen %d", c.QueueLen)
	}
	return nil
}

// state of a cached destination.
type state uint8

const (
	statePending  state = iota // route known, neighbour not (yet) resolved
	stateResolved              // hop complete
	stateFailed                // err says why
)

// neighKey names a neighbour entry: interface and next-hop address (an IPv4
// address in its 16-byte mapped form).
type neighKey struct {
	ifindex int32
	addr    [16]byte
}

// entry is one cached answer, for a destination or for a prefix.
// Everything but used is immutable once published; a change makes a new
// entry.
type entry struct {
	hop   Hop
	nh    neighKey // zero when the route could not be resolved
	state state
	err   error       // for stateFailed
	rep   netip.Addr  // a prefix entry's representative: the destination it is resolved for
	used  atomic.Bool // set by lookups, cleared by the idle sweep
}

func (e *entry) same(o *entry) bool {
	return e.hop == o.hop && e.nh == o.nh && e.state == o.state && e.err == o.err && e.rep == o.rep
}

// Snapshot is an immutable view of the resolver's cache. A data-path stage
// loads one per batch (Resolver.Snapshot) and looks up every packet of the
// batch in it.
type Snapshot struct {
	dests    *destTable // per-destination entries
	v4, v6   *lpmTable  // prefix entries by family; nil when none
	prefixes []netip.Prefix
	req      chan<- [16]byte
	changed  chan struct{} // closed when a newer snapshot is published
	counts   [3]int        // entries (destinations and prefixes) by state
	version  uint64        // 1 + the number of snapshots published before
}

// Version numbers the snapshots a Resolver publishes: a newer snapshot
// has a larger version. A data-path cache of Lookup answers (such as
// Stage's) stays valid while the version is unchanged.
func (s *Snapshot) Version() uint64 { return s.version }

// Lookup returns the next hop for dst. It is the hot path: it does not
// lock, block or allocate. On a miss it returns false and, if dst is not
// cached at all, queues it for resolution without waiting (a full queue
// drops the request; a later Lookup queues it again). Destinations that are
// cached but not resolved (waiting for the neighbour, or failed) also
// return false; Run retries those by itself.
//
// dst is answered by the longest cached prefix holding it, else by its own
// entry.
func (s *Snapshot) Lookup(dst netip.Addr) (Hop, bool) {
	if !dst.IsValid() {
		return Hop{}, false
	}
	k := dst.As16()
	e := s.find(&k)
	if e == nil {
		select {
		case s.req <- k:
		default:
		}
		return Hop{}, false
	}
	if !e.used.Load() {
		e.used.Store(true)
	}
	if e.state != stateResolved {
		return Hop{}, false
	}
	return e.hop, true
}

// find returns the entry answering for the destination k (16-byte form),
// or nil. Prefix entries come first: by construction no destination entry
// lies inside a prefix entry once Run has settled, and clients behind a
// gateway, the many, are answered without a second probe.
func (s *Snapshot) find(k *[16]byte) *entry {
	a0, a1 := words(k)
	if is4(a0, a1) {
		if s.v4 != nil {
			if e := s.v4.lookup4(uint32(a1)); e != nil {
				return e
			}
		}
	} else if s.v6 != nil {
		if e := s.v6.lookup6(a0, a1); e != nil {
			return e
		}
	}
	return s.dests.get(a0, a1)
}

// Len returns the number of cache entries: destinations, resolved or not,
// and prefixes.
func (s *Snapshot) Len() int { return s.dests.n + len(s.prefixes) }

// Prefixes returns the prefixes the snapshot answers for as a whole, in
// address order. It allocates; it is for tests and diagnostics.
func (s *Snapshot) Prefixes() []netip.Prefix { return slices.Clone(s.prefixes) }
