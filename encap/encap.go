package encap

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/guard"
	"github.com/xdplb/xdplb/header"
)

// Bytes an encapsulation adds in front of the inner frame: outer Ethernet,
// outer IP, UDP and VXLAN headers.
const (
	OverheadIPv4 = header.EthernetSize + header.IPv4MinSize + header.UDPSize + header.VXLANSize // 50
	OverheadIPv6 = header.EthernetSize + header.IPv6Size + header.UDPSize + header.VXLANSize    // 70
)

// Port range of the outer UDP source port (RFC 7348 section 5 recommends
// the dynamic range 49152–65535).
const (
	SourcePortMin = 49152
	SourcePortMax = 65535
)

// Configuration limits and defaults of an Encap stage.
const (
	DefaultMTU       = 1500
	DefaultTTL       = 64
	DefaultICMPRate  = 100
	MinMTU           = 1280 + OverheadIPv6 - header.EthernetSize // 1350: a 1280-byte IPv6 packet fits over IPv6
	MaxMTU           = 65535
	icmpv4QuoteLimit = 576  // RFC 1812 4.3.2.3: the whole ICMPv4 error within 576 bytes
	icmpv6QuoteLimit = 1280 // RFC 4443 2.4(c): the whole ICMPv6 error within the minimum MTU
	icmpTTL          = 64
)

// Drop reasons of the Encap stage.
var (
	// DropMTUExceeded: the encapsulated packet would exceed the uplink
	// MTU and no ICMP error was sent for it (see EncapStats).
	DropMTUExceeded = engine.RegisterDropReason("mtu_exceeded")
	// DropNoTunnelSource: the backend's host address is not set, or is of
	// a family the stage has no source address for.
	DropNoTunnelSource = engine.RegisterDropReason("no_tunnel_source")
)

// EncapConfig is the plain configuration of an Encap stage. Zero values
// mean the documented defaults; Validate reports what cannot work.
type EncapConfig struct {
	// SourceV4 and SourceV6 are the outer source addresses — the Mux's
	// own addresses on the uplink — for backends whose Host is IPv4 or
	// IPv6. At least one must be set; a packet for a host of a family
	// without a source is dropped with no_tunnel_source.
	SourceV4, SourceV6 netip.Addr
	// Port is the outer UDP destination port (default 4789, RFC 7348).
	Port uint16
	// MTU is the uplink's IP MTU, the largest outer IP packet (default
	// 1500). It must be at least MinMTU (1350), so that the tunnel carries
	// the 1280-byte packets every IPv6 link must (RFC 8200 section 5) even
	// over an IPv6 outer header.
	MTU int
	// TTL is the outer IPv4 TTL and IPv6 hop limit (default 64).
	TTL uint8
	// InnerSrcMAC, when not zero, becomes the inner Ethernet source; the
	// zero value keeps the source of the received frame. The inner
	// destination is always the backend's MAC.
	InnerSrcMAC header.MAC
	// IPv6ZeroChecksum sends outer UDP over IPv6 with a zero checksum, as
	// RFC 6935 and RFC 6936 allow for tunnels, instead of computing it
	// over the whole packet. Over IPv4 the checksum is always zero
	// (RFC 7348 section 5).
	IPv6ZeroChecksum bool
	// ICMPRate is how many ICMP errors (fragmentation needed, packet too
	// big) per second the stage may send back to clients, over all its
	// workers (default 100; negative: never send one). ICMPBurst is how
	// many it may send at once (default max(1, ICMPRate/10)).
	ICMPRate  int
	ICMPBurst int
	// DecrementTTL makes the stage route the inner packet as a router
	// does: a packet whose TTL / hop limit is 1 or 0 is dropped
	// (ttl_exceeded, see package guard: no ICMP time exceeded is sent),
	// the others leave with it one less (the inner IPv4 header checksum
	// updated incrementally). The check comes before the MTU check and the
	// decrement after it, so a fragmentation needed / packet too big error
	// quotes the packet as it arrived. The Mux sets it.
	DecrementTTL bool
	// Clock returns monotonic nanoseconds for the ICMP rate limit; nil
	// means time since the stage was made. It is read only for packets
	// that exceed the MTU. Tests inject one.
	Clock func() int64 `json:"-" yaml:"-"`
}

// Validate reports a configuration that cannot work.
func (c EncapConfig) Validate() error {
	switch {
	case !c.SourceV4.IsValid() && !c.SourceV6.IsValid():
		return errors.New("encap: no outer source address (SourceV4 or SourceV6)")
	case c.SourceV4.IsValid() && !c.SourceV4.Unmap().Is4():
		return fmt.Errorf("encap: SourceV4 %v is not an IPv4 address", c.SourceV4)
	case c.SourceV6.IsValid() && (!c.SourceV6.Is6() || c.SourceV6.Is4In6()):
		return fmt.Errorf("encap: SourceV6 %v is not an IPv6 address", c.SourceV6)
	case c.SourceV6.Zone() != "":
		return fmt.Errorf("encap: SourceV6 %v has a zone", c.SourceV6)
	case c.MTU != 0 && (c.MTU < MinMTU || c.MTU > MaxMTU):
		return fmt.Errorf("encap: MTU %d outside [%d, %d]", c.MTU, MinMTU, MaxMTU)
	case c.ICMPBurst < 0:
		return fmt.Errorf("encap: negative ICMPBurst %d", c.ICMPBurst)
	case c.InnerSrcMAC.IsMulticast():
		return fmt.Errorf("encap: InnerSrcMAC %v is a group address", c.InnerSrcMAC)
	}
	return nil
}

func (c EncapConfig) withDefaults() EncapConfig {
	if c.Port == 0 {
		c.Port = header.VXLANPort
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.ICMPRate == 0 {
		c.ICMPRate = DefaultICMPRate
	}
	if c.ICMPBurst == 0 {
		c.ICMPBurst = max(1, c.ICMPRate/10)
	}
	if c.Clock == nil {
		start := time.Now()
		c.Clock = func() int64 { return int64(time.Since(start)) }
	}
	return c
}

// EncapStats counts what the stage did with packets that exceed the MTU.
// Every such packet is either answered (ICMPSent: it leaves as the ICMP
// error and is not a drop) or dropped with mtu_exceeded (ICMPRateLimited +
// NoReply, which the worker's drop counters show too).
type EncapStats struct {
	// ICMPSent: turned into an ICMPv4 "fragmentation needed" or ICMPv6
	// "packet too big" and sent back to the client.
	ICMPSent uint64
	// ICMPRateLimited: dropped without a reply because the rate limit
	// refused one.
	ICMPRateLimited uint64
	// NoReply: dropped without a reply because none may be sent: an IPv4
	// packet without DF, an ICMP error, a non-first fragment, a frame
	// sent to a link-layer group address, a source that is not unicast,
	// too little headroom, or ICMPRate < 0.
	NoReply uint64
}

// Encap is the Mux's VXLAN encapsulation stage. For each packet, after
// the balancing stage has set Packet.Rule, Packet.Backend and Packet.Hash,
// it rewrites the inner Ethernet header (destination: the backend's MAC)
// and prepends an outer Ethernet, IPv4 or IPv6 (the backend Host's family),
// UDP and VXLAN header. The outer Ethernet addresses are left zero for the
// next-hop stage (nexthop.Stage). See the package documentation for the header fields.
//
// It is safe for concurrent use by several workers: its configuration is
// immutable and its only shared state (the ICMP rate limit and EncapStats)
// is touched only by packets that exceed the MTU.
type Encap struct {
	cfg       EncapConfig
	src4      [4]byte
	ip4       [header.IPv4MinSize]byte // outer IPv4 header; TOS, length, destination and checksum zero
	ip4Sum    uint16                   // its one's-complement sum
	src6      [16]byte
	has4      bool
	has6      bool
	setSrcMAC bool
	icmpOff   bool
	limit     limiter

	_     [64]byte // keep the counters off the configuration's cache lines
	stats struct {
		icmpSent, rateLimited, noReply atomic.Uint64
	}
}

// NewEncap validates cfg and returns an Encap stage.
func NewEncap(cfg EncapConfig) (*Encap, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	e := &Encap{cfg: cfg, setSrcMAC: cfg.InnerSrcMAC != header.MAC{}, icmpOff: cfg.ICMPRate < 0}
	if cfg.SourceV4.IsValid() {
		e.src4, e.has4 = cfg.SourceV4.Unmap().As4(), true
		header.IPv4(e.ip4[:]).Encode(&header.IPv4Fields{
			Flags:    header.IPv4FlagDontFragment,
			TTL:      cfg.TTL,
			Protocol: header.ProtoUDP,
			Src:      e.src4,
		})
		header.IPv4(e.ip4[:]).SetChecksum(0)
		e.ip4Sum = header.Checksum(e.ip4[:], 0)
	}
	if cfg.SourceV6.IsValid() {
		e.src6, e.has6 = cfg.SourceV6.As16(), true
	}
	if !e.icmpOff {
		e.limit.init(cfg.ICMPRate, cfg.ICMPBurst)
	}
	return e, nil
}

// Config returns the stage's configuration, defaults filled in.
func (e *Encap) Config() EncapConfig { return e.cfg }

// Stats returns the stage's counters.
func (e *Encap) Stats() EncapStats {
	return EncapStats{
		ICMPSent:        e.stats.icmpSent.Load(),
		ICMPRateLimited: e.stats.rateLimited.Load(),
		NoReply:         e.stats.noReply.Load(),
	}
}

// SourcePort returns the outer UDP source port for a flow hash: the top
// 14 bits of the hash placed in the dynamic range 49152–65535 (RFC 7348
// section 5), so routers hashing the outer 5-tuple spread flows over ECMP
// paths. The low bits are left to the Maglev lookup.
func SourcePort(hash uint64) uint16 { return SourcePortMin | uint16(hash>>50) }

// FlowLabel returns the outer IPv6 flow label for a flow hash (RFC 6438):
// 20 bits of the hash, never zero.
func FlowLabel(hash uint64) uint32 {
	if l := uint32(hash>>20) & 0xfffff; l != 0 {
		return l
	}
	return 1
}

// Process implements engine.Stage.
func (e *Encap) Process(b *engine.Batch) {
	for _, p := range b.Packets() {
		if r := e.encap(b, p); r != 0 {
			b.Drop(p, r)
		}
	}
}

// Packet is Process's work on one packet, for a caller that runs the
// stage packet by packet among other stages' work (the Mux's fused
// stage): it encapsulates p, or answers it with an ICMP error
// (Batch.Emit: p is then finished, the later stages must skip it), or
// returns why p must be dropped, which the caller does (Batch.Drop).
func (e *Encap) Packet(b *engine.Batch, p *engine.Packet) engine.DropReason { return e.encap(b, p) }

// encap encapsulates p, or answers it with an ICMP error (Emit), or
// returns why it must be dropped.
func (e *Encap) encap(b *engine.Batch, p *engine.Packet) engine.DropReason {
	r := p.Rule
	if r == nil || uint32(p.Backend) >= uint32(len(r.Backends)) {
		return engine.DropNoBackend
	}
	be := &r.Backends[p.Backend]
	host := be.Host.Unmap()
	var hdr int
	switch {
	case host.Is4() && e.has4:
		hdr = OverheadIPv4
	case host.Is6() && e.has6:
		hdr = OverheadIPv6
	default:
		return DropNoTunnelSource
	}

	// The parser validated the IP header at L3Off; the bounds checks only
	// keep a packet some other stage mangled from panicking.
	data := p.Data()
	l3 := int(p.L3Off)
	var l3len int
	var tc uint8 // inner DSCP and ECN, copied to the outer header
	var ip4 header.IPv4
	var ip6 header.IPv6
	var ttl uint8 // inner TTL or hop limit
	switch {
	case p.Flags&engine.FlagIPv4 != 0 && l3+header.IPv4MinSize <= len(data):
		ip4 = header.IPv4(data[l3:])
		l3len, tc, ttl = int(ip4.TotalLength()), ip4.TOS(), ip4.TTL()
	case p.Flags&engine.FlagIPv6 != 0 && l3+header.IPv6Size <= len(data):
		ip6 = header.IPv6(data[l3:])
		l3len, tc, ttl = header.IPv6Size+int(ip6.PayloadLength()), ip6.TrafficClass(), ip6.HopLimit()
	default:
		return engine.DropUnsupported
	}
	if l3 < header.EthernetSize || l3+l3len > len(data) {
		return engine.DropUnsupported
	}
	// guard.Expired and guard.Decrement, on the views at hand.
	if e.cfg.DecrementTTL && ttl <= 1 {
		return guard.DropTTLExceeded
	}
	inner := header.EthernetSize + l3len // VLAN tags and Ethernet padding go
	if hdr-header.EthernetSize+inner > e.cfg.MTU {
		return e.tooBig(b, p, hdr, l3, l3len)
	}
	start := l3 - header.EthernetSize // where the untagged inner frame starts
	if p.Headroom()+start < hdr {
		return engine.DropNoHeadroom
	}
	if e.cfg.DecrementTTL {
		if ip4 != nil {
			ip4.SetTTLWithChecksumUpdate(ttl - 1)
		} else {
			ip6.SetHopLimit(ttl - 1)
		}
	}

	src := e.cfg.InnerSrcMAC
	if !e.setSrcMAC {
		src = header.Ethernet(data).Src()
	}
	header.Ethernet(data[start:]).Encode(be.MAC, src, p.EtherType)
	p.TrimFront(start)
	p.SetLen(inner)
	f, _ := p.Prepend(hdr)

	vni := r.VIP.VNI
	sport := SourcePort(p.Hash)
	udpLen := uint16(header.UDPSize + header.VXLANSize + inner)
	if hdr == OverheadIPv4 {
		clear(f[:12]) // MACs: the next-hop stage's
		header.Ethernet(f).SetType(header.EtherTypeIPv4)
		// The header is the stage's template with the per-packet fields
		// filled in; its checksum is the template's sum plus theirs
		// (partial sums compose, RFC 1071), not a pass over 20 bytes.
		ip := header.IPv4(f[header.EthernetSize : header.EthernetSize+header.IPv4MinSize])
		*(*[header.IPv4MinSize]byte)(ip) = e.ip4 // moves of a known size, not a memmove call
		total := uint16(header.IPv4MinSize) + udpLen
		dst := host.As4()
		ip[1] = tc
		ip.SetTotalLength(total)
		ip.SetDst(dst)
		// Five 16-bit terms: the 32-bit sum cannot overflow, and one
		// end-around fold (two steps) finishes it.
		sum := uint32(e.ip4Sum) + uint32(tc) + uint32(total) +
			(uint32(dst[0])<<8 | uint32(dst[1])) + (uint32(dst[2])<<8 | uint32(dst[3]))
		ip.SetChecksum(^header.ChecksumCombine(uint16(sum>>16), uint16(sum)))
		u := header.UDP(f[header.EthernetSize+header.IPv4MinSize:])
		u.Encode(sport, e.cfg.Port, udpLen)
		header.VXLAN(u[header.UDPSize:]).Encode(vni)
		return 0
	}
	clear(f[:12])
	header.Ethernet(f).SetType(header.EtherTypeIPv6)
	dst := host.As16()
	ip := header.IPv6(f[header.EthernetSize:])
	ip.Encode(&header.IPv6Fields{
		TrafficClass:  tc,
		FlowLabel:     FlowLabel(p.Hash),
		PayloadLength: udpLen,
		NextHeader:    header.ProtoUDP,
		HopLimit:      e.cfg.TTL,
		Src:           e.src6,
		Dst:           dst,
	})
	u := header.UDP(f[header.EthernetSize+header.IPv6Size:])
	u.Encode(sport, e.cfg.Port, udpLen)
	header.VXLAN(u[header.UDPSize:]).Encode(vni)
	if !e.cfg.IPv6ZeroChecksum {
		u.SetChecksum(u.CalculateChecksum(header.PseudoHeaderChecksum(header.ProtoUDP, e.src6[:], dst[:], udpLen)))
	}
	return 0
}

// limiter is a lock-free token bucket in its GCRA form: one atomic word,
// the theoretical arrival time (TAT) of the next conforming event. An event
// at time now conforms when TAT − now ≤ tolerance, and then moves TAT to
// max(TAT, now) + interval. interval is 1/rate; tolerance, (burst−1)
// intervals, lets burst events through at once.
type limiter struct {
	tat       atomic.Int64
	interval  int64
	tolerance int64
}

func (l *limiter) init(rate, burst int) {
	l.interval = int64(time.Second) / int64(rate)
	l.tolerance = int64(burst-1) * l.interval
	l.tat.Store(math.MinInt64)
}

// allow reports whether an event at time now (nanoseconds) conforms, and
// counts it if so.
func (l *limiter) allow(now int64) bool {
	for {
		old := l.tat.Load()
		t := max(old, now)
		if t-now > l.tolerance {
			return false
		}
		if l.tat.CompareAndSwap(old, t+l.interval) {
			return true
		}
	}
}

var _ engine.Stage = (*Encap)(nil)
