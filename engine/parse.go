package engine

import (
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// Parse is the stage that validates a frame's headers and fills the
// packet's parse metadata: Flags, EtherType, L3Off, L4Off, L4Proto and the
// flow Key (with the stage's VNI). Malformed frames are dropped with a
// reason; well-formed frames of any kind pass, and later stages decide.
//
// Ports in the key: TCP and UDP ports; for ICMP and ICMPv6 and other
// protocols both ports are 0. Fragments: a first fragment is parsed as
// usual and flagged FlagFragment; a non-first fragment has no L4 header, is
// flagged FlagNonFirstFrag and keyed with ports 0. An IPv6 atomic fragment
// (offset 0, M clear) is not a fragment.
//
// Checksums are not verified (header lengths and versions are): stages
// that rewrite a packet update its checksums incrementally (RFC 1624), so
// a wrong checksum stays wrong and the receiver drops the packet, as it
// would have without us.
type Parse struct {
	// VNI is stored in every key; 0 on an uplink before decapsulation.
	VNI uint32
}

// Process implements Stage.
func (ps Parse) Process(b *Batch) {
	for _, p := range b.Packets() {
		if r := ParsePacket(p, ps.VNI); r != 0 {
			b.Drop(p, r)
		}
	}
}

// ParsePacket parses p's frame as Parse does, and returns a drop reason, or
// 0 when the frame is well formed. Decapsulation calls it on the inner frame.
func ParsePacket(p *Packet, vni uint32) DropReason {
	data := p.Data()
	et, l3, err := header.ParseEthernet(data)
	if err != nil {
		if err == header.ErrTruncated {
			return DropTruncated
		}
		return DropBadL2
	}
	p.EtherType = et
	p.L3Off = uint16(l3)
	p.Flags = 0
	switch et {
	case header.EtherTypeIPv4:
		return parseIPv4(p, data, l3, vni)
	case header.EtherTypeIPv6:
		return parseIPv6(p, data, l3, vni)
	}
	return DropNotIP
}

func parseIPv4(p *Packet, data []byte, l3 int, vni uint32) DropReason {
	ip := header.IPv4(data[l3:])
	if err := ip.Check(); err != nil {
		if err == header.ErrTruncated {
			return DropTruncated
		}
		return DropBadIPv4
	}
	p.Flags = FlagIPv4
	proto := ip.Protocol()
	p.L4Proto = proto
	if ip.IsFragment() {
		p.Flags |= FlagFragment
		if ip.IsNonFirstFragment() {
			p.Flags |= FlagNonFirstFrag
			p.Key.SetIPv4(vni, proto, ip.SrcSlice(), ip.DstSlice(), 0, 0)
			return 0
		}
	}
	l4 := l3 + ip.HeaderLength()
	sport, dport, r := parseL4(p, data[l3+ip.HeaderLength():l3+int(ip.TotalLength())], proto, l4)
	if r != 0 {
		return r
	}
	p.Key.SetIPv4(vni, proto, ip.SrcSlice(), ip.DstSlice(), sport, dport)
	return 0
}

func parseIPv6(p *Packet, data []byte, l3 int, vni uint32) DropReason {
	ip := header.IPv6(data[l3:])
	if err := ip.Check(); err != nil {
		if err == header.ErrTruncated {
			return DropTruncated
		}
		return DropBadIPv6
	}
	p.Flags = FlagIPv6
	proto, off, frag, err := ip.TransportHeader()
	if err != nil {
		if err == header.ErrTruncated {
			return DropTruncated
		}
		return DropBadIPv6
	}
	p.L4Proto = proto
	// An atomic fragment (a Fragment header with offset 0 and M clear) is
	// a whole datagram, processed as if it had no Fragment header (RFC
	// 6946): not flagged, so it keys and places like its flow's other
	// packets, and its UDP Length is checked.
	if frag.IsFragment() {
		p.Flags |= FlagFragment
		if frag.NonFirst() {
			p.Flags |= FlagNonFirstFrag
			p.Key.SetIPv6(vni, proto, ip.SrcSlice(), ip.DstSlice(), 0, 0)
			return 0
		}
	}
	end := l3 + header.IPv6Size + int(ip.PayloadLength())
	sport, dport, r := parseL4(p, data[l3+off:end], proto, l3+off)
	if r != 0 {
		return r
	}
	p.Key.SetIPv6(vni, proto, ip.SrcSlice(), ip.DstSlice(), sport, dport)
	return 0
}

// parseL4 validates the transport header in seg (which starts at offset
// off of the frame) and returns its ports.
func parseL4(p *Packet, seg []byte, proto uint8, off int) (sport, dport uint16, r DropReason) {
	switch proto {
	case flow.ProtoTCP:
		t := header.TCP(seg)
		if t.Check() != nil {
			return 0, 0, DropBadL4
		}
		sport, dport = t.SrcPort(), t.DstPort()
	case flow.ProtoUDP:
		u := header.UDP(seg)
		if p.Flags&FlagFragment != 0 {
			// A first fragment holds the UDP header but not all the
			// datagram its Length counts.
			if len(seg) < header.UDPSize {
				return 0, 0, DropBadL4
			}
		} else if u.Check() != nil {
			return 0, 0, DropBadL4
		}
		sport, dport = u.SrcPort(), u.DstPort()
	case flow.ProtoICMP:
		if header.ICMPv4(seg).Check() != nil {
			return 0, 0, DropBadL4
		}
	case flow.ProtoICMPv6:
		if header.ICMPv6(seg).Check() != nil {
			return 0, 0, DropBadL4
		}
	default:
		return 0, 0, 0
	}
	p.L4Off = uint16(off)
	p.Flags |= FlagL4
	return sport, dport, 0
}
