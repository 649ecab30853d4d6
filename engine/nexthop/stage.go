package nexthop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/header"
)

// Source finds the next hop for a destination without blocking: a miss
// returns false (and the source queues the destination for resolution
// itself). *Resolver implements it.
type Source interface {
	Lookup(dst netip.Addr) (Hop, bool)
}

// Mode says which address of a packet the Stage resolves.
type Mode uint8

const (
	// OuterDst resolves the destination of the outermost IP header, which
	// directly follows an untagged Ethernet header: the backend's host
	// address the Encap stage wrote. For the Mux.
	OuterDst Mode = iota
	// L3Dst resolves the destination of the IP header the parser found
	// (Packet.L3Off): the client, on the Host Agent's DSR return path.
	L3Dst
)

// String returns "outer-dst" or "l3-dst".
func (m Mode) String() string {
	switch m {
	case OuterDst:
		return "outer-dst"
	case L3Dst:
		return "l3-dst"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// MarshalText implements encoding.TextMarshaler.
func (m Mode) MarshalText() ([]byte, error) {
	if m > L3Dst {
		return nil, fmt.Errorf("nexthop: unknown next-hop mode %d", uint8(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler; the empty string
// means OuterDst.
func (m *Mode) UnmarshalText(b []byte) error {
	switch string(b) {
	case "", "outer-dst":
		*m = OuterDst
	case "l3-dst":
		*m = L3Dst
	default:
		return fmt.Errorf(`nexthop: unknown next-hop mode %q (want "outer-dst" or "l3-dst")`, b)
	}
	return nil
}

// StageConfig is the plain configuration of a Stage.
type StageConfig struct {
	// Mode says which address to resolve.
	Mode Mode
	// Ports maps an egress interface index (Hop.IfIndex) to the
	// index of the worker port that transmits on that interface
	// (Packet.OutPort). A hop through an interface not listed is dropped
	// with no_out_port.
	Ports map[int]uint16
	// SlowPath sends what the stage cannot address itself — a destination
	// not resolved yet (the resolver has been asked), or a hop through an
	// interface without a port — out of the worker port SlowPort instead
	// of dropping it: an engine/rawip.Port there hands it to the kernel,
	// which routes it and resolves the neighbour itself. The packets are
	// counted there (rawip.Port.Stats), and the frame's Ethernet header is
	// left as it was.
	SlowPath bool
	SlowPort uint16
}

// Validate reports a configuration that cannot work.
func (c StageConfig) Validate() error {
	if c.Mode > L3Dst {
		return fmt.Errorf("nexthop: unknown next-hop mode %d", uint8(c.Mode))
	}
	if len(c.Ports) == 0 {
		return errors.New("nexthop: StageConfig.Ports is empty")
	}
	for ifi := range c.Ports {
		if ifi <= 0 {
			return fmt.Errorf("nexthop: StageConfig.Ports: invalid interface index %d", ifi)
		}
	}
	return nil
}

// Stage is the stage that addresses frames to their next hop: for each
// packet it resolves an address (StageConfig.Mode), writes the hop's
// MACs as the frame's Ethernet source and destination and sets
// Packet.OutPort to the port of the hop's interface. An unresolved
// destination is dropped with nexthop_unresolved (the resolver is already
// resolving it), or with StageConfig.SlowPath sent through the kernel;
// a non-IP frame is dropped with unsupported.
//
// Answers are cached per worker (engine.PerWorker, keyed by Batch.Worker)
// in a direct-mapped table of 1024 destinations (40 KiB). With a
// VersionedSource (*Resolver is one) the cache is emptied — by
// moving to a new generation, not by clearing it — when the resolver's
// version changes, and every hopCacheRefresh batches so that destinations
// in use are looked up now and then (the resolver forgets idle ones); with
// any other Source, every batch. A miss is remembered for
// the rest of the batch only, so a destination that becomes resolvable is
// used from the next batch on.
//
// It is safe for concurrent use by the workers of one engine.Engine
// (distinct Batch.Worker indices).
type Stage struct {
	cfg    StageConfig
	r      Source
	vr     VersionedSource // r, when it is one; nil otherwise
	ports  []ifPort        // few entries: a linear scan, behind the cache
	caches engine.PerWorker[hopCache]
}

// VersionedSource is a Source that numbers its states: Version changes
// whenever any answer of Lookup may have changed. Stage caches its
// answers per worker while the version holds.
type VersionedSource interface {
	Source
	Version() uint64
}

const (
	hopCacheBits = 10
	hopCacheSize = 1 << hopCacheBits
	// hopCacheRefresh is how many batches a cached answer lives at most.
	hopCacheRefresh = 1024
)

// hopCache is one worker's cache of resolved next hops, direct-mapped by
// destination.
type hopCache struct {
	version uint64 // the resolver's version the entries are from
	batches uint32 // batches since gen last changed
	gen     uint32 // entries of this generation are valid; a new one empties the cache
	answers uint32 // changes with the answers: the version, or every batch (Pass.Answers)
	e       [hopCacheSize]hopEntry
}

// hopEntry is a cached answer: a destination (two words and its family)
// and what to write for it, valid in the cache's generation gen.
type hopEntry struct {
	a0, a1 uint64
	gen    uint32
	family uint8
	out    uint16
	src    header.MAC
	dst    header.MAC
}

// holds reports whether h is destination a0, a1 of family's entry of
// generation gen.
func (h *hopEntry) holds(gen uint32, a0, a1 uint64, family uint8) bool {
	return h.gen == gen && h.family == family && h.a0 == a0 && h.a1 == a1
}

// hopIndex places a destination in a hopCache.
func hopIndex(a0, a1 uint64, family uint8) uint64 {
	return ((a0 ^ a1 ^ uint64(family)) * 0x9e3779b97f4a7c15) >> (64 - hopCacheBits)
}

type ifPort struct {
	ifindex int
	port    uint16
}

// NewStage validates cfg and returns a Stage resolving through r.
func NewStage(cfg StageConfig, r Source) (*Stage, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if r == nil {
		return nil, errors.New("nexthop: NewStage: nil Source")
	}
	s := &Stage{cfg: cfg, r: r}
	s.vr, _ = r.(VersionedSource)
	for ifi, port := range cfg.Ports {
		s.ports = append(s.ports, ifPort{ifi, port})
	}
	slices.SortFunc(s.ports, func(a, b ifPort) int { return a.ifindex - b.ifindex })
	return s, nil
}

// Config returns the stage's configuration.
func (s *Stage) Config() StageConfig { return s.cfg }

// Process implements engine.Stage: Begin, then Packet for every packet.
func (s *Stage) Process(b *engine.Batch) {
	var ps Pass
	s.Begin(b, &ps)
	for _, p := range b.Packets() {
		if r := ps.Packet(p); r != 0 {
			b.Drop(p, r)
		}
	}
}

// generation starts a batch on worker cache c and returns the generation
// whose entries are valid in it.
func (s *Stage) generation(c *hopCache) uint32 {
	c.batches++
	if s.vr == nil {
		c.gen++ // answers live for this batch only
		c.answers++
	} else if v := s.vr.Version(); v != c.version || c.batches >= hopCacheRefresh {
		if v != c.version {
			c.answers++
		}
		c.gen++
		c.version, c.batches = v, 0
	}
	if c.gen == 0 {
		// The generation wrapped (after 2^32 batches): forget everything
		// once, so that no entry of an old generation 1.. matches.
		clear(c.e[:])
		c.gen = 1
	}
	return c.gen
}

// Pass is the stage's state for one batch — the worker's cache of answers
// and the batch's last miss — for a caller that runs the stage packet by
// packet among other stages' work (the Mux's fused stage): Begin, then
// Packet for every packet in order, does what Process does.
type Pass struct {
	s    *Stage
	e    []hopEntry // the worker's cache (a power of two in length); nil: last
	mask uint64
	gen  uint32 // entries of this generation are valid
	// answers is the worker's hopCache.answers (Answers).
	answers uint32
	// The last miss of this batch, so that a burst to an unresolved
	// destination costs one lookup.
	missA0, missA1 uint64
	missFamily     uint8
	missReason     engine.DropReason
	last           [1]hopEntry // the cache of a batch without a worker index
}

// Begin readies ps for batch b.
func (s *Stage) Begin(b *engine.Batch, ps *Pass) {
	*ps = Pass{s: s}
	c := s.caches.Get(b.Worker)
	if c == nil {
		// A worker index past engine.MaxWorkers: remember the last
		// answer only (ps.last: pointing e at it would move the pass
		// to the heap).
		ps.gen = 1
		return
	}
	ps.e, ps.mask, ps.gen = c.e[:], hopCacheSize-1, s.generation(c)
	ps.answers = c.answers
}

// Generation identifies the answers the pass writes: within one
// generation of a worker (ok: a batch with a worker index, whose answers
// are cached), Packet writes the same addresses and port for a
// destination every time. A new generation starts when the resolver's
// version changes, every hopCacheRefresh batches (so that destinations
// in use are looked up now and then), and, with a Source that is not a
// VersionedSource, every batch. A caller that keeps what Packet wrote
// (the Mux's fast path) keeps it while Answers holds, across
// generations, and Touch4s each destination it keeps using once per
// generation.
func (ps *Pass) Generation() (gen uint32, ok bool) { return ps.gen, ps.e != nil }

// Answers identifies the answers themselves, where Generation identifies
// the cached copies of them: with a VersionedSource it changes only with
// the resolver's version (a VersionedSource's answers change only then),
// not every hopCacheRefresh batches; with any other Source, every batch.
// Within one, Packet writes the same addresses and port for a destination
// every time (ok as for Generation). A caller that keeps what Packet wrote
// across generations must show the Source the destinations it keeps
// using, as Packet would have: Touch4 each of them once per generation.
func (ps *Pass) Answers() (id uint32, ok bool) { return ps.answers, ps.e != nil }

// Touch4 looks IPv4 destination dst up as Packet would for a packet to
// it, without a packet: from the worker's cache, or, once per generation,
// from the Source, which so sees the destination in use (the Resolver
// forgets destinations idle for its IdleTimeout). It writes nothing and
// reports nothing; a destination that does not resolve is the Source's
// to resolve, as for Packet.
func (ps *Pass) Touch4(dst [4]byte) {
	if ps.e == nil {
		return
	}
	a1 := uint64(binary.LittleEndian.Uint32(dst[:]))
	h := &ps.e[hopIndex(0, a1, 4)&ps.mask]
	if !h.holds(ps.gen, 0, a1, 4) {
		ps.s.fill(h, 0, a1, 4, ps.gen)
	}
}

// Packet addresses p to its next hop (Ethernet addresses, OutPort), or
// sends it to the slow path, or returns why it must be dropped, which the
// caller does (Batch.Drop).
func (ps *Pass) Packet(p *engine.Packet) engine.DropReason {
	s := ps.s
	a0, a1, family := s.dest(p)
	if family == 0 {
		return engine.DropUnsupported
	}
	h := &ps.last[0]
	if ps.e != nil {
		h = &ps.e[hopIndex(a0, a1, family)&ps.mask]
	}
	if !h.holds(ps.gen, a0, a1, family) {
		if ps.missReason != 0 && ps.missFamily == family && ps.missA0 == a0 && ps.missA1 == a1 {
			return s.miss(p, ps.missReason)
		}
		if r := s.fill(h, a0, a1, family, ps.gen); r != 0 {
			ps.missA0, ps.missA1, ps.missFamily, ps.missReason = a0, a1, family, r
			return s.miss(p, r)
		}
	}
	eth := header.Ethernet(p.Data())
	eth.SetDst(h.dst)
	eth.SetSrc(h.src)
	p.OutPort = h.out
	return 0
}

// miss handles a packet the stage cannot address: the slow path (0), or
// the drop reason r.
func (s *Stage) miss(p *engine.Packet, r engine.DropReason) engine.DropReason {
	if s.cfg.SlowPath {
		p.OutPort = s.cfg.SlowPort
		return 0
	}
	return r
}

// fill asks the resolver for a destination and caches the answer in e, or
// returns why the packet cannot be sent (e is then left as it was).
func (s *Stage) fill(e *hopEntry, a0, a1 uint64, family uint8, gen uint32) engine.DropReason {
	var a netip.Addr
	if family == 4 {
		a = netip.AddrFrom4([4]byte{byte(a1), byte(a1 >> 8), byte(a1 >> 16), byte(a1 >> 24)})
	} else {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], a0)
		binary.LittleEndian.PutUint64(b[8:], a1)
		a = netip.AddrFrom16(b)
	}
	h, ok := s.r.Lookup(a)
	if !ok {
		return engine.DropNextHopUnres
	}
	o, ok := s.port(h.IfIndex)
	if !ok {
		return engine.DropNoOutPort
	}
	*e = hopEntry{a0: a0, a1: a1, family: family, gen: gen, out: o, src: h.SrcMAC, dst: h.DstMAC}
	return 0
}

// port returns the engine port of an interface.
func (s *Stage) port(ifindex int) (uint16, bool) {
	for _, e := range s.ports {
		if e.ifindex == ifindex {
			return e.port, true
		}
	}
	return 0, false
}

// dest returns the address to resolve for p as two little-endian words
// (an IPv4 address in the low half of a1) and its family (4 or 6), or
// family 0 when the frame has no address for the mode.
func (s *Stage) dest(p *engine.Packet) (a0, a1 uint64, family uint8) {
	data := p.Data()
	if s.cfg.Mode == OuterDst {
		if len(data) < header.EthernetSize {
			return 0, 0, 0
		}
		switch binary.BigEndian.Uint16(data[12:]) {
		case header.EtherTypeIPv4:
			return dst4(data, header.EthernetSize)
		case header.EtherTypeIPv6:
			return dst6(data, header.EthernetSize)
		}
		return 0, 0, 0
	}
	switch {
	case p.Flags&engine.FlagIPv4 != 0:
		return dst4(data, int(p.L3Off))
	case p.Flags&engine.FlagIPv6 != 0:
		return dst6(data, int(p.L3Off))
	}
	return 0, 0, 0
}

func dst4(data []byte, l3 int) (uint64, uint64, uint8) {
	if len(data) < l3+header.IPv4MinSize {
		return 0, 0, 0
	}
	return 0, uint64(binary.LittleEndian.Uint32(data[l3+16:])), 4
}

func dst6(data []byte, l3 int) (uint64, uint64, uint8) {
	if len(data) < l3+header.IPv6Size {
		return 0, 0, 0
	}
	return binary.LittleEndian.Uint64(data[l3+24:]), binary.LittleEndian.Uint64(data[l3+32:]), 6
}

var _ VersionedSource = (*Resolver)(nil)
var _ engine.Stage = (*Stage)(nil)
