package balance

import (
	"encoding/binary"
	"errors"
	"sync"
	"time"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// Drop reasons of the ICMP stage.
var (
	// DropICMPRate counts echo requests to a VIP refused by the rate limit.
	DropICMPRate = engine.RegisterDropReason("icmp_rate_limited")
	// DropICMPEchoInvalid counts echo requests to a VIP the Mux does not
	// answer: a wrong IPv4 header or ICMP checksum (a host silently
	// discards those, RFC 1122 3.2.1.2 and RFC 4443 2.4), a fragment
	// (the reply would need the whole datagram), or one sent to a
	// link-layer broadcast or multicast address (RFC 1122 3.3.6).
	DropICMPEchoInvalid = engine.RegisterDropReason("icmp_echo_invalid")
)

// ICMPConfig configures the ICMP stage.
type ICMPConfig struct {
	// Rules is the published configuration (the VIP addresses).
	Rules *flow.Rules
	// EchoRate is how many echo requests per second the Mux answers, over
	// all VIPs (default 1000); EchoBurst how many at once (default
	// EchoRate). Past it requests are dropped (icmp_rate_limited).
	EchoRate  float64
	EchoBurst float64
	// Now is the clock (default time.Now); tests inject one.
	Now func() time.Time
}

// ICMP is the Mux's ICMP stage; it runs before the balancing stage.
//
//   - An echo request (ping) to a VIP address is answered by the Mux
//     itself, rate-limited: the reply proves this Mux is alive and
//     forwarding for the VIP, independent of the DIPs' health.
//   - An ICMP error about a VIP flow — fragmentation needed or packet too
//     big from a router on the return path (DSR: the VIP is the source of
//     the replies), destination unreachable, time exceeded — quotes a
//     packet from VIP to client. The stage sets the packet's Key to the
//     quoted flow reversed (client → VIP) and flags it FlagICMPError, so
//     the balancing stage sends the error to the same DIP as that flow
//     (without creating a connection-table entry), where the DIP's stack
//     learns the path MTU. Only the quote's bytes within the IP datagram
//     are read; the quoted ports are found behind IPv6 extension headers
//     as in the packet itself. A quote whose extension chain is
//     malformed, too long or cut short names no flow, like one too short
//     for its IP header: the error is neither keyed nor flagged, and the
//     balancing stage finds no rule for it. An error addressed to a VIP
//     address that quotes no VIP flow but a packet from that address's
//     outbound pool — a VM's source-NATed connection, or its ping, by the
//     echo identifier — is keyed and flagged the same way, and the
//     balancing stage sends it to the port's owner (Returns).
//   - An echo reply is keyed by its identifier as the destination port: a
//     reply to a VM's source-NATed ping goes to the identifier's owner
//     (Returns).
//
// ICMPv4 is handled in IPv4 packets only and ICMPv6 in IPv6 packets only;
// other packets pass untouched.
type ICMP struct {
	cfg ICMPConfig

	mu     sync.Mutex // taken only for echo requests to a VIP
	tokens float64
	last   time.Time
}

// NewICMP returns the ICMP stage.
func NewICMP(cfg ICMPConfig) (*ICMP, error) {
	if cfg.Rules == nil {
		return nil, errors.New("balance: ICMPConfig.Rules is nil")
	}
	if cfg.EchoRate < 0 || cfg.EchoBurst < 0 {
		return nil, errors.New("balance: ICMP echo rate and burst must not be negative")
	}
	if cfg.EchoRate == 0 {
		cfg.EchoRate = 1000
	}
	if cfg.EchoBurst == 0 {
		cfg.EchoBurst = cfg.EchoRate
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &ICMP{cfg: cfg, tokens: cfg.EchoBurst}, nil
}

// ICMPHandles reports whether the ICMP stage looks at p: an ICMPv4
// message in IPv4 or an ICMPv6 message in IPv6, its header parsed. The
// stage leaves every other packet as it is, so a batch without such a
// packet may skip it (the Mux's fused stage does).
func ICMPHandles(p *engine.Packet) bool {
	if p.Flags&engine.FlagL4 == 0 {
		return false
	}
	if p.Flags&engine.FlagIPv4 != 0 {
		return p.L4Proto == flow.ProtoICMP
	}
	return p.L4Proto == flow.ProtoICMPv6
}

// Process implements engine.Stage.
func (s *ICMP) Process(b *engine.Batch) {
	var snap *flow.Snapshot
	var ret batchReturns
	for _, p := range b.Packets() {
		if !ICMPHandles(p) {
			continue
		}
		if snap == nil {
			snap = b.Rules(s.cfg.Rules)
		}
		s.handle(b, snap, &ret, p)
	}
}

func (s *ICMP) handle(b *engine.Batch, snap *flow.Snapshot, ret *batchReturns, p *engine.Packet) {
	l4 := p.L4Segment()
	if len(l4) < header.ICMPv4MinSize { // the same 8 bytes for ICMPv6
		return
	}
	typ := l4[0]
	v4 := p.Flags&engine.FlagIPv4 != 0
	switch {
	case v4 && typ == header.ICMPv4EchoRequest, !v4 && typ == header.ICMPv6EchoRequest:
		if !snap.IsVIPAddr(&p.Key) {
			return // not ours: the balancing stage drops it (no rule)
		}
		if !echoValid(p, l4, v4) {
			b.Drop(p, DropICMPEchoInvalid)
			return
		}
		if !s.allow() {
			b.Drop(p, DropICMPRate)
			return
		}
		echoReply(p, v4)
		b.Emit(p)
	case v4 && typ == header.ICMPv4EchoReply, !v4 && typ == header.ICMPv6EchoReply:
		// The reply to a VM's ping, source-NATed with its identifier as
		// the port: the balancing stage finds its owner by it.
		echoReplyID(p, l4)
	case v4 && (typ == header.ICMPv4DestUnreachable || typ == header.ICMPv4TimeExceeded),
		!v4 && (typ == header.ICMPv6DestUnreachable || typ == header.ICMPv6PacketTooBig || typ == header.ICMPv6TimeExceeded):
		var k flow.Key
		if !quotedKey(l4[header.ICMPv4MinSize:], v4, p.Key.VNI, &k) {
			return
		}
		if snap.Lookup(&k) == nil {
			// No VIP flow: an error about an outbound connection of a VM
			// is addressed to the VIP and quotes VIP:port of the address's
			// pool (or the identifier of a ping); it goes to the port's
			// owner (Returns).
			if k.Dst != p.Key.Dst {
				return
			}
			if k.Proto == flow.ProtoICMP || k.Proto == flow.ProtoICMPv6 {
				if id, ok := quotedEchoID(l4[header.ICMPv4MinSize:], v4); ok {
					k.DstPort = id
				}
			}
			if !ret.get(b).inPool(&k) {
				return
			}
		}
		p.Key = k
		p.Flags |= engine.FlagICMPError
	}
}

// allow takes a token from the echo bucket.
func (s *ICMP) allow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	if !s.last.IsZero() {
		s.tokens += now.Sub(s.last).Seconds() * s.cfg.EchoRate
		if s.tokens > s.cfg.EchoBurst {
			s.tokens = s.cfg.EchoBurst
		}
	}
	s.last = now
	if s.tokens < 1 {
		return false
	}
	s.tokens--
	return true
}

// echoValid reports whether the echo request p, whose ICMP message is m,
// may be answered: not a fragment, not sent to a link-layer group
// address, and its checksums right (the reply's
// are updated incrementally, so a wrong one would be answered wrong).
func echoValid(p *engine.Packet, m []byte, v4 bool) bool {
	if p.Flags&engine.FlagFragment != 0 {
		return false
	}
	if header.Ethernet(p.Data()).Dst().IsMulticast() {
		// A unicast datagram received as a link-layer broadcast or
		// multicast is discarded (RFC 1122 3.3.6); the reply would
		// leave with that group address as its Ethernet source.
		return false
	}
	if v4 {
		return header.IPv4(p.L3()).IsChecksumValid() && header.ICMPv4(m).IsChecksumValid()
	}
	ip := header.IPv6(p.L3())
	return header.ICMPv6(m).IsChecksumValid(header.PseudoHeaderChecksum(flow.ProtoICMPv6, ip.SrcSlice(), ip.DstSlice(), uint16(len(m))))
}

// echoReply turns an echo request into its reply in place: addresses and
// MACs swapped, type changed with an RFC 1624 checksum update (swapping
// the addresses changes neither the IPv4 header sum nor the ICMPv6
// pseudo-header sum), TTL / hop limit reset to 64, sent back out of the
// port it came in on.
func echoReply(p *engine.Packet, v4 bool) {
	eth := header.Ethernet(p.Data())
	src, dst := eth.Src(), eth.Dst()
	eth.SetSrc(dst)
	eth.SetDst(src)
	l4 := p.L4Segment()
	oldWord := binary.BigEndian.Uint16(l4)
	if v4 {
		ip := header.IPv4(p.L3())
		a, d := ip.Src(), ip.Dst()
		ip.SetSrc(d)
		ip.SetDst(a)
		ip.SetTTLWithChecksumUpdate(64)
		m := header.ICMPv4(l4)
		m.SetType(header.ICMPv4EchoReply)
		m.SetChecksum(header.ChecksumUpdate16(m.Checksum(), oldWord, binary.BigEndian.Uint16(l4)))
	} else {
		ip := header.IPv6(p.L3())
		a, d := ip.Src(), ip.Dst()
		ip.SetSrc(d)
		ip.SetDst(a)
		ip.SetHopLimit(64)
		m := header.ICMPv6(l4)
		m.SetType(header.ICMPv6EchoReply)
		m.SetChecksum(header.ChecksumUpdate16(m.Checksum(), oldWord, binary.BigEndian.Uint16(l4)))
	}
	p.OutPort = p.InPort
}

// quotedKey reads the packet an ICMP error quotes (q starts at its IP
// header) and fills k with that flow reversed. The ports are those of the
// quoted TCP or UDP header, found behind the IPv6 extension headers as in
// the packet itself (quotedTransport); a quote that ends before them, or
// a non-first fragment, is keyed without ports. It reports false when
// the quote cannot name a flow: too short for the IP header, or an IPv6
// extension chain that is malformed, too long or cut by the end of the
// quote.
func quotedKey(q []byte, v4 bool, vni uint32, k *flow.Key) bool {
	proto, l4, ok := quotedTransport(q, v4)
	if !ok {
		return false
	}
	var sport, dport uint16
	if (proto == flow.ProtoTCP || proto == flow.ProtoUDP) && len(l4) >= 4 {
		sport, dport = binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
	}
	if v4 {
		ip := header.IPv4(q)
		k.SetIPv4(vni, proto, ip.DstSlice(), ip.SrcSlice(), dport, sport)
	} else {
		ip := header.IPv6(q)
		k.SetIPv6(vni, proto, ip.DstSlice(), ip.SrcSlice(), dport, sport)
	}
	return true
}

// quotedTransport finds the transport header of the packet an ICMP error
// quotes (q starts at its IP header): its protocol and the quote's bytes
// from it on, nil for a non-first fragment (fragment data, not a header).
// For IPv6 it walks the extension headers with
// header.IPv6.QuotedTransportHeader, bounded by the quote and by
// header.IPv6MaxExtensionHeaders. It reports false when the quote is too
// short for the IP header, has the wrong version or (IPv4) header length,
// or (IPv6) a malformed, too long or cut extension chain.
func quotedTransport(q []byte, v4 bool) (proto uint8, l4 []byte, ok bool) {
	if v4 {
		if len(q) < header.IPv4MinSize || q[0]>>4 != 4 {
			return 0, nil, false
		}
		ihl := int(q[0]&0x0f) * 4
		if ihl < header.IPv4MinSize || len(q) < ihl {
			return 0, nil, false
		}
		ip := header.IPv4(q)
		if ip.FragmentOffset() == 0 {
			l4 = q[ihl:]
		}
		return ip.Protocol(), l4, true
	}
	if len(q) < header.IPv6Size || q[0]>>4 != 6 {
		return 0, nil, false
	}
	proto, off, frag, _, err := header.IPv6(q).QuotedTransportHeader()
	if err != nil {
		return 0, nil, false
	}
	if !frag.NonFirst() {
		l4 = q[off:]
	}
	return proto, l4, true
}
