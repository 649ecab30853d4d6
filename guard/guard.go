package guard

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// Drop reasons of the package's stages.
var (
	// DropSrcVIP: the client address is a VIP's (any VNI, protocol, port).
	DropSrcVIP = engine.RegisterDropReason("src_vip")
	// DropSrcInfra: the client address is in an infrastructure prefix.
	DropSrcInfra = engine.RegisterDropReason("src_infra")
	// DropSrcNode: the client address is one of the node's own.
	DropSrcNode = engine.RegisterDropReason("src_node")
	// DropSrcMartian: the client address can be no sender's: 0.0.0.0/8,
	// 127.0.0.0/8, multicast, the limited broadcast; ::, ::1, ff00::/8,
	// IPv4-mapped.
	DropSrcMartian = engine.RegisterDropReason("src_martian")
	// DropLinkGroup: the frame was sent to a link-layer broadcast or
	// multicast address. A router must not forward it (RFC 1812 5.3.4;
	// Linux's ip_forward drops what is not PACKET_HOST): every node on
	// the segment receives it, and each would forward its own copy.
	DropLinkGroup = engine.RegisterDropReason("link_group")
	// DropTTLExceeded: a packet the node routes arrived with TTL or hop
	// limit 1 or 0.
	DropTTLExceeded = engine.RegisterDropReason("ttl_exceeded")
)

// IsMartian reports whether addr (a flow.Key address of family) can be
// no packet's source: IPv4 0.0.0.0/8 ("this network"), 127.0.0.0/8
// (loopback), 224.0.0.0/4 (multicast), 255.255.255.255 (limited
// broadcast); IPv6 :: (unspecified), ::1 (loopback), ff00::/8 (multicast)
// and ::ffff:0:0/96 (IPv4-mapped, never on the wire, RFC 4291 2.5.5.2).
// A family other than IPv4 or IPv6 is martian too.
func IsMartian(addr *[16]byte, family uint8) bool {
	switch family {
	case flow.FamilyIPv4:
		a := addr[0]
		return a == 0 || a == 127 || a&0xf0 == 0xe0 ||
			binary.BigEndian.Uint32(addr[:4]) == 0xffffffff
	case flow.FamilyIPv6:
		if addr[0] == 0xff {
			return true
		}
		hi := binary.BigEndian.Uint64(addr[:8])
		lo := binary.BigEndian.Uint64(addr[8:])
		return hi == 0 && (lo <= 1 || lo>>32 == 0xffff)
	}
	return true
}

// prefix is a compiled prefix: the address words of its family masked, and
// the mask.
type prefix struct {
	hi, lo         uint64 // as big-endian words of the 16-byte Key form
	maskHi, maskLo uint64
}

func compile(p netip.Prefix) prefix {
	p = p.Masked()
	var b [16]byte
	bitsLen := p.Bits()
	if p.Addr().Is4() {
		a := p.Addr().As4()
		copy(b[:], a[:])
	} else {
		b = p.Addr().As16()
	}
	var mh, ml uint64
	switch {
	case bitsLen >= 64:
		mh, ml = ^uint64(0), ^uint64(0)<<(128-bitsLen)
		if bitsLen == 64 {
			ml = 0
		}
	case bitsLen > 0:
		mh = ^uint64(0) << (64 - bitsLen)
	}
	return prefix{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:]), maskHi: mh, maskLo: ml}
}

// prefix4 is a compiled IPv4 prefix.
type prefix4 struct{ net, mask uint32 }

func compile4(p prefix) prefix4 {
	return prefix4{net: uint32(p.hi >> 32), mask: uint32(p.maskHi >> 32)}
}

func match4(ps []prefix4, a uint32) bool {
	for _, p := range ps {
		if a&p.mask == p.net {
			return true
		}
	}
	return false
}

// Prefixes is an immutable set of node addresses and infrastructure
// prefixes, per family, as Sources matches them.
type Prefixes struct {
	node4, infra4 []prefix4
	node6, infra6 []prefix
}

// NewPrefixes compiles a set: the node's own addresses and the
// infrastructure prefixes. IPv4-mapped addresses are unmapped.
func NewPrefixes(node []netip.Addr, infra []netip.Prefix) (*Prefixes, error) {
	s := &Prefixes{}
	for _, a := range node {
		if !a.IsValid() {
			return nil, fmt.Errorf("guard: invalid node address %v", a)
		}
		a = a.Unmap().WithZone("")
		pf := compile(netip.PrefixFrom(a, a.BitLen()))
		if a.Is4() {
			s.node4 = append(s.node4, compile4(pf))
		} else {
			s.node6 = append(s.node6, pf)
		}
	}
	for _, p := range infra {
		if !p.IsValid() {
			return nil, fmt.Errorf("guard: invalid infrastructure prefix %v", p)
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		if p.Addr().Is4() {
			s.infra4 = append(s.infra4, compile4(compile(p)))
		} else {
			s.infra6 = append(s.infra6, compile(p))
		}
	}
	return s, nil
}

func match(ps []prefix, hi, lo uint64) bool {
	for i := range ps {
		p := &ps[i]
		if hi&p.maskHi == p.hi && lo&p.maskLo == p.lo {
			return true
		}
	}
	return false
}

// classify reports whether a client address is one of the node's or in
// an infrastructure prefix.
func (s *Prefixes) classify(addr *[16]byte, family uint8) (node, infra bool) {
	if family == flow.FamilyIPv4 {
		a := binary.BigEndian.Uint32(addr[:4])
		return match4(s.node4, a), match4(s.infra4, a)
	}
	if len(s.node6) == 0 && len(s.infra6) == 0 {
		return false, false
	}
	hi, lo := binary.BigEndian.Uint64(addr[:8]), binary.BigEndian.Uint64(addr[8:])
	return match(s.node6, hi, lo), match(s.infra6, hi, lo)
}

// SourcesConfig configures a Sources stage.
type SourcesConfig struct {
	// Rules are the published rules: a client address that is any rule's
	// VIP address is refused (src_vip). Nil: no VIP check.
	Rules *flow.Rules
	// Node are the node's own addresses (src_node) and Infra the
	// infrastructure prefixes (src_infra): the first set; SetPrefixes
	// replaces it.
	Node  []netip.Addr
	Infra []netip.Prefix
	// Destination checks the packet's destination instead of its source:
	// on the Host Agent's return path the client is a reply's destination.
	Destination bool
}

// Sources is the source filter stage (see the package documentation).
type Sources struct {
	rules *flow.Rules
	dst   bool
	set   atomic.Pointer[Prefixes]
}

// NewSources returns a Sources stage for cfg.
func NewSources(cfg SourcesConfig) (*Sources, error) {
	s := &Sources{rules: cfg.Rules, dst: cfg.Destination}
	if err := s.SetPrefixes(cfg.Node, cfg.Infra); err != nil {
		return nil, err
	}
	return s, nil
}

// SetPrefixes replaces the node addresses and infrastructure prefixes,
// whole: a batch sees the old set or the new one. On error the set in use
// stays.
func (s *Sources) SetPrefixes(node []netip.Addr, infra []netip.Prefix) error {
	set, err := NewPrefixes(node, infra)
	if err != nil {
		return err
	}
	s.set.Store(set)
	return nil
}

// Store replaces the set with one built by NewPrefixes (nil: the empty
// set), whole.
func (s *Sources) Store(set *Prefixes) {
	if set == nil {
		set = &Prefixes{}
	}
	s.set.Store(set)
}

// Prefixes returns the set in use.
func (s *Sources) Prefixes() *Prefixes { return s.set.Load() }

// PrefixSource is what a node's data-path snapshot (engine.Batch.Snapshot)
// implements to carry the source filter's prefix set in the same version
// as its rules: Sources then uses the batch's set, not its own.
type PrefixSource interface {
	SourcePrefixes() *Prefixes
}

// Process implements engine.Stage. The prefix set is the batch
// snapshot's when it carries one (PrefixSource), else the stage's own
// (Store, SetPrefixes).
func (s *Sources) Process(b *engine.Batch) {
	c := s.Begin(b)
	for _, p := range b.Packets() {
		if r := c.Check(p); r != 0 {
			b.Drop(p, r)
		}
	}
}

// SourcesPass is the source filter's configuration for one batch (the
// batch's rules and prefix set), for a caller that runs the filter packet
// by packet among other stages' work (the Mux's fused stage): Begin, then
// Check for every packet, does what Process does.
type SourcesPass struct {
	s    *Sources
	snap *flow.Snapshot
	set  *Prefixes
}

// Begin loads what the filter checks b's packets against.
func (s *Sources) Begin(b *engine.Batch) SourcesPass {
	var snap *flow.Snapshot
	if s.rules != nil {
		snap = b.Rules(s.rules)
	}
	set := s.set.Load()
	if ps, ok := b.Snapshot.(PrefixSource); ok {
		if p := ps.SourcePrefixes(); p != nil {
			set = p
		}
	}
	return SourcesPass{s: s, snap: snap, set: set}
}

// Prefixes returns the prefix set the pass checks against: with the
// batch's rule snapshot, what a packet's source is judged by (besides its
// Ethernet destination).
func (c *SourcesPass) Prefixes() *Prefixes { return c.set }

// Check returns why p is refused (the reason Process drops it with), or 0.
func (c *SourcesPass) Check(p *engine.Packet) engine.DropReason {
	return c.s.check(c.snap, c.set, p)
}

// check returns why p is refused, or 0.
func (s *Sources) check(snap *flow.Snapshot, set *Prefixes, p *engine.Packet) engine.DropReason {
	addr := &p.Key.Src
	if s.dst {
		addr = &p.Key.Dst
	}
	fam := p.Key.Family
	if IsMartian(addr, fam) {
		return DropSrcMartian
	}
	if snap != nil && snap.HasVIPAddr(addr, fam) {
		return DropSrcVIP
	}
	node, infra := set.classify(addr, fam)
	switch {
	case node:
		return DropSrcNode
	case infra && !isICMPError(p):
		return DropSrcInfra
	}
	if data := p.Data(); len(data) >= header.EthernetSize && data[0]&1 != 0 {
		// The Ethernet destination is a group address (the I/G bit).
		return DropLinkGroup
	}
	return 0
}

// isICMPError reports whether p is an ICMP or ICMPv6 error message (the
// first byte of a parsed ICMP header: its type).
func isICMPError(p *engine.Packet) bool {
	if p.Flags&engine.FlagL4 == 0 || p.Flags&engine.FlagNonFirstFrag != 0 {
		return false
	}
	data := p.Data()
	if int(p.L4Off) >= len(data) {
		return false
	}
	t := data[p.L4Off]
	switch {
	case p.L4Proto == flow.ProtoICMP && p.Flags&engine.FlagIPv4 != 0:
		// Destination unreachable, source quench, redirect, time
		// exceeded, parameter problem.
		return t == 3 || t == 4 || t == 5 || t == 11 || t == 12
	case p.L4Proto == flow.ProtoICMPv6 && p.Flags&engine.FlagIPv6 != 0:
		return t < 128 // RFC 4443 2.1: error messages have types 0 to 127
	}
	return false
}

// TTL is the stage that decrements the TTL or hop limit of every packet
// of the batch, dropping with ttl_exceeded those that arrive with 1 or 0
// (see the package documentation). It keeps no state.
type TTL struct{}

// Process implements engine.Stage.
func (TTL) Process(b *engine.Batch) {
	for _, p := range b.Packets() {
		if !step(p) {
			b.Drop(p, DropTTLExceeded)
		}
	}
}

// step is Expired and Decrement in one pass over the header: it reports
// false for an expired packet and decrements the others.
func step(p *engine.Packet) bool {
	data := p.Data()
	l3 := int(p.L3Off)
	switch {
	case p.Flags&engine.FlagIPv4 != 0 && l3+header.IPv4MinSize <= len(data):
		ip := header.IPv4(data[l3 : l3+header.IPv4MinSize])
		t := ip.TTL()
		if t <= 1 {
			return false
		}
		old := uint16(t)<<8 | uint16(ip.Protocol())
		ip.SetTTL(t - 1)
		ip.SetChecksum(header.ChecksumUpdate16(ip.Checksum(), old, old-0x100))
	case p.Flags&engine.FlagIPv6 != 0 && l3+header.IPv6Size <= len(data):
		ip := header.IPv6(data[l3 : l3+header.IPv6Size])
		h := ip.HopLimit()
		if h <= 1 {
			return false
		}
		ip.SetHopLimit(h - 1)
	}
	return true
}

// Expired reports whether p's TTL or hop limit is 1 or 0: the node that
// routes it must not forward it. A packet the parser did not find IP in
// is not expired.
func Expired(p *engine.Packet) bool {
	data := p.Data()
	l3 := int(p.L3Off)
	switch {
	case p.Flags&engine.FlagIPv4 != 0 && l3+header.IPv4MinSize <= len(data):
		return header.IPv4(data[l3:]).TTL() <= 1
	case p.Flags&engine.FlagIPv6 != 0 && l3+header.IPv6Size <= len(data):
		return header.IPv6(data[l3:]).HopLimit() <= 1
	}
	return false
}

// Decrement takes one from p's TTL (updating the IPv4 header checksum
// incrementally, RFC 1624: a wrong checksum stays exactly as wrong) or hop
// limit. Call it only for a packet that is not Expired.
func Decrement(p *engine.Packet) {
	data := p.Data()
	l3 := int(p.L3Off)
	switch {
	case p.Flags&engine.FlagIPv4 != 0 && l3+header.IPv4MinSize <= len(data):
		ip := header.IPv4(data[l3:])
		if t := ip.TTL(); t > 0 {
			ip.SetTTLWithChecksumUpdate(t - 1)
		}
	case p.Flags&engine.FlagIPv6 != 0 && l3+header.IPv6Size <= len(data):
		ip := header.IPv6(data[l3:])
		if h := ip.HopLimit(); h > 0 {
			ip.SetHopLimit(h - 1)
		}
	}
}

var (
	_ engine.Stage = (*Sources)(nil)
	_ engine.Stage = TTL{}
)
