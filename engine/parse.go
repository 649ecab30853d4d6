package engine

import (
	"encoding/binary"

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
	if parseCommon(p, data, vni) {
		return 0
	}
	return parseGeneral(p, data, vni)
}

// parseGeneral is ParsePacket for any frame: tags, options, extension
// headers, fragments, every protocol and every malformed frame.
func parseGeneral(p *Packet, data []byte, vni uint32) DropReason {
	et, l3, err := header.ParseEthernet(data)
	if err != nil {
		if err == header.ErrTruncated {
			return DropTruncated
		}
		return DropBadL2
	}
	p.EtherType = et
	p.L3Off = uint16(l3)
	p.Flags, p.TCPFlags = 0, 0
	switch et {
	case header.EtherTypeIPv4:
		return parseIPv4(p, data, l3, vni)
	case header.EtherTypeIPv6:
		return parseIPv6(p, data, l3, vni)
	}
	return DropNotIP
}

// parseCommon parses the frames most traffic is made of — untagged IPv4
// without options, or IPv6 without extension headers, carrying a whole
// TCP segment or UDP datagram — in one straight run, with the checks the
// general path below makes for them, and reports whether it did. Any
// other frame (tags, options, extension headers, fragments, other
// protocols, and every frame the general path would drop) is left to the
// general path, which then parses it from the start. Both fill the same
// fields with the same values: TestParseCommonAgrees and FuzzParseCommon
// compare them.
func parseCommon(p *Packet, data []byte, vni uint32) bool {
	const (
		l3   = header.EthernetSize
		l4v4 = l3 + header.IPv4MinSize
		l4v6 = l3 + header.IPv6Size
	)
	if len(data) < l4v4+header.UDPSize {
		return false
	}
	var (
		end, l4  int
		proto    uint8
		flags    uint16
		src, dst []byte
	)
	et := binary.BigEndian.Uint16(data[12:])
	switch {
	case et == header.EtherTypeIPv4 && data[l3] == 0x45: // version 4, no options
		// The total length covers the header; not a fragment.
		ip := header.IPv4(data[l3:])
		end, l4, proto, flags = l3+int(ip.TotalLength()), l4v4, ip.Protocol(), FlagIPv4
		if end < l4v4 || end > len(data) || ip.IsFragment() {
			return false
		}
		src, dst = ip.SrcSlice(), ip.DstSlice()
	case et == header.EtherTypeIPv6 && data[l3]>>4 == 6 && len(data) >= l4v6:
		ip := header.IPv6(data[l3:])
		end, l4, proto, flags = l4v6+int(ip.PayloadLength()), l4v6, ip.NextHeader(), FlagIPv6
		if end > len(data) {
			return false
		}
		src, dst = ip.SrcSlice(), ip.DstSlice()
	default:
		return false
	}
	seg := data[l4:end]
	var tcpFlags uint8
	switch proto {
	case flow.ProtoTCP:
		t := header.TCP(seg)
		if len(t) < header.TCPMinSize || t.DataOffset() < header.TCPMinSize || t.DataOffset() > len(t) {
			return false
		}
		tcpFlags = t.Flags()
	case flow.ProtoUDP:
		if u := header.UDP(seg); len(u) < header.UDPSize || u.Length() < header.UDPSize || int(u.Length()) > len(u) {
			return false
		}
	default:
		return false
	}
	// TCP's ports lie where UDP's do.
	sport, dport := header.UDP(seg).SrcPort(), header.UDP(seg).DstPort()
	p.EtherType = et
	p.L3Off, p.L4Off = l3, uint16(l4)
	p.Flags = flags | FlagL4
	p.L4Proto, p.TCPFlags = proto, tcpFlags
	if flags == FlagIPv4 {
		p.Key.SetIPv4(vni, proto, src, dst, sport, dport)
	} else {
		p.Key.SetIPv6(vni, proto, src, dst, sport, dport)
	}
	return true
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
		p.TCPFlags = t.Flags()
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
