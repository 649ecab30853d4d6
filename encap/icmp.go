package encap

import (
	"encoding/binary"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/header"
)

// Room an ICMP error needs in front of the quoted packet: the new IP header
// and the 8-byte ICMP header.
const (
	icmpv4Room = header.IPv4MinSize + header.ICMPv4MinSize // 28
	icmpv6Room = header.IPv6Size + header.ICMPv6MinSize    // 48
)

// tooBig handles a packet whose encapsulation would exceed the MTU: it
// turns the packet into an ICMP error for the client and emits it, or
// returns DropMTUExceeded. l3 and l3len locate the packet's IP datagram
// (header and payload, Ethernet padding excluded); hdr is the
// encapsulation overhead for the backend's host family.
func (e *Encap) tooBig(b *engine.Batch, p *engine.Packet, hdr, l3, l3len int) engine.DropReason {
	v4 := p.Flags&engine.FlagIPv4 != 0
	room := icmpv6Room
	if v4 {
		room = icmpv4Room
	}
	if e.icmpOff || p.Headroom() < room || !mayReply(p, l3, v4) {
		e.stats.noReply.Add(1)
		return DropMTUExceeded
	}
	if !e.limit.allow(e.cfg.Clock()) {
		e.stats.rateLimited.Add(1)
		return DropMTUExceeded
	}
	// The largest inner IP packet that fits: outer IP + UDP + VXLAN +
	// inner Ethernet is exactly hdr bytes. MinMTU keeps this at 1280 or
	// more for IPv6, so a Packet Too Big never asks for less than the
	// IPv6 minimum MTU (which senders would ignore, RFC 8201 section 4).
	mtu := e.cfg.MTU - hdr
	if v4 {
		fragNeeded(p, l3, l3len, mtu)
	} else {
		packetTooBig(p, l3, l3len, mtu)
	}
	e.stats.icmpSent.Add(1)
	b.Emit(p)
	return 0
}

// mayReply applies the rules for sending an ICMP error about a packet
// (RFC 1122 3.2.2, RFC 1812 4.3.2.7, RFC 4443 2.4(e)): never about an ICMP
// error, a non-first fragment, a frame sent to a link-layer group address
// or a packet whose source is not a unicast address; and for IPv4 only when DF is set — without DF the sender lets
// the network fragment, which a VXLAN tunnel endpoint must not do
// (RFC 7348 section 4.3), so the packet is dropped without a reply.
func mayReply(p *engine.Packet, l3 int, v4 bool) bool {
	data := p.Data()
	if header.Ethernet(data).Dst().IsMulticast() {
		// Sent as a link-layer broadcast or multicast (RFC 1122 3.2.2);
		// the error would also leave with that group address as its
		// Ethernet source, which no receiver accepts.
		return false
	}
	icmp := p.Flags&engine.FlagL4 != 0
	if v4 {
		ip := header.IPv4(data[l3:])
		if !ip.DontFragment() || ip.IsNonFirstFragment() {
			return false
		}
		if s := ip.Src()[0]; s == 0 || s == 127 || s >= 224 { // this-network, loopback, multicast, class E, broadcast
			return false
		}
		if icmp && p.L4Proto == header.ProtoICMP {
			switch data[p.L4Off] {
			case header.ICMPv4DestUnreachable, 4 /* source quench */, 5 /* redirect */, header.ICMPv4TimeExceeded, 12 /* parameter problem */ :
				return false
			}
		}
		return true
	}
	ip := header.IPv6(data[l3:])
	src := ip.Src()
	if src[0] == 0xff || src == [16]byte{} || src == [16]byte{15: 1} { // multicast, unspecified, loopback
		return false
	}
	if p.Flags&engine.FlagNonFirstFrag != 0 {
		return false
	}
	// ICMPv6 types below 128 are errors.
	return !(icmp && p.L4Proto == header.ProtoICMPv6 && data[p.L4Off] < 128)
}

// fragNeeded turns p, an IPv4 packet with DF set, into an ICMPv4
// "fragmentation needed" (type 3 code 4, RFC 792 and RFC 1191) from the
// VIP (the packet's destination) to the client, quoting the packet's IP
// header and as much of its payload as keeps the error within 576 bytes.
// The error is built in place: the quoted bytes stay where they are and
// the new headers are prepended (Ethernet and any VLAN tags copied, MACs
// swapped), so nothing is moved but the L2 header.
func fragNeeded(p *engine.Packet, l3, l3len, mtu int) {
	data := p.Data()
	eth := header.Ethernet(data)
	peer, self := eth.Src(), eth.Dst()
	ip := header.IPv4(data[l3:])
	client, vip := ip.Src(), ip.Dst()
	q := min(l3len, icmpv4QuoteLimit-icmpv4Room)

	f, _ := p.Prepend(icmpv4Room)
	copy(f[:l3], f[icmpv4Room:icmpv4Room+l3])
	eth = header.Ethernet(f)
	eth.SetDst(peer)
	eth.SetSrc(self)
	header.IPv4(f[l3:]).Encode(&header.IPv4Fields{
		TotalLength: uint16(icmpv4Room + q),
		Flags:       header.IPv4FlagDontFragment, // with ID 0: an atomic datagram (RFC 6864)
		TTL:         icmpTTL,
		Protocol:    header.ProtoICMP,
		Src:         vip,
		Dst:         client,
	})
	m := header.ICMPv4(f[l3+header.IPv4MinSize : l3+icmpv4Room+q])
	m[0], m[1] = header.ICMPv4DestUnreachable, header.ICMPv4CodeFragNeeded
	binary.BigEndian.PutUint32(m[4:], uint32(mtu)) // 16 unused bits, then the next-hop MTU
	m.SetChecksum(m.CalculateChecksum())
	p.SetLen(l3 + icmpv4Room + q)
	turnAround(p, l3, engine.FlagIPv4, header.ProtoICMP, header.IPv4MinSize)
	p.Key.SetIPv4(p.Key.VNI, header.ProtoICMP, vip[:], client[:], 0, 0)
}

// packetTooBig turns p, an IPv6 packet, into an ICMPv6 Packet Too Big
// (type 2, RFC 4443 section 3.2) from the VIP to the client, quoting as
// much of the packet as keeps the error within 1280 bytes; built in place
// like fragNeeded.
func packetTooBig(p *engine.Packet, l3, l3len, mtu int) {
	data := p.Data()
	eth := header.Ethernet(data)
	peer, self := eth.Src(), eth.Dst()
	ip := header.IPv6(data[l3:])
	client, vip := ip.Src(), ip.Dst()
	q := min(l3len, icmpv6QuoteLimit-icmpv6Room)
	plen := uint16(header.ICMPv6MinSize + q)

	f, _ := p.Prepend(icmpv6Room)
	copy(f[:l3], f[icmpv6Room:icmpv6Room+l3])
	eth = header.Ethernet(f)
	eth.SetDst(peer)
	eth.SetSrc(self)
	header.IPv6(f[l3:]).Encode(&header.IPv6Fields{
		PayloadLength: plen,
		NextHeader:    header.ProtoICMPv6,
		HopLimit:      icmpTTL,
		Src:           vip,
		Dst:           client,
	})
	m := header.ICMPv6(f[l3+header.IPv6Size : l3+icmpv6Room+q])
	m[0], m[1] = header.ICMPv6PacketTooBig, 0
	binary.BigEndian.PutUint32(m[4:], uint32(mtu))
	m.SetChecksum(m.CalculateChecksum(header.PseudoHeaderChecksum(header.ProtoICMPv6, vip[:], client[:], plen)))
	p.SetLen(l3 + icmpv6Room + q)
	turnAround(p, l3, engine.FlagIPv6, header.ProtoICMPv6, header.IPv6Size)
	p.Key.SetIPv6(p.Key.VNI, header.ProtoICMPv6, vip[:], client[:], 0, 0)
}

// turnAround sets p's metadata for the ICMP error it now holds: sent back
// out of the port it came in on, no balancing decision, the parser's
// fields (flags, offsets, protocol, no TCP flags) describing the new
// frame.
func turnAround(p *engine.Packet, l3 int, family uint16, proto uint8, iphdr int) {
	p.OutPort = p.InPort
	p.Rule = nil
	p.Backend = -1
	p.Hash = 0
	p.Flags = family | engine.FlagL4
	p.L3Off = uint16(l3)
	p.L4Off = uint16(l3 + iphdr)
	p.L4Proto = proto
	p.TCPFlags = 0 // the error is ICMP, whatever the packet it quotes was
}
