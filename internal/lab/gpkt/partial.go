package gpkt

import (
	"encoding/binary"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// transport finds, with gopacket, the innermost IP packet's transport
// segment in an Ethernet frame (inside VXLAN too): the segment's bytes,
// the offset of its checksum field in them and its pseudo-header sum.
// ok is false when the frame has no TCP or UDP segment.
func transport(frame []byte) (seg []byte, csum int, pseudo uint16, ok bool) {
	return transportFrom(frame, layers.LayerTypeEthernet)
}

// transportFrom is transport for data that starts with a layer of type
// first. A fragment (IPv4 MF or offset, an IPv6 Fragment header other than
// an atomic one, RFC 6946) has no segment to judge.
func transportFrom(data []byte, first gopacket.LayerType) (seg []byte, csum int, pseudo uint16, ok bool) {
	pkt := gopacket.NewPacket(data, first, gopacket.DecodeOptions{NoCopy: true})
	var proto uint8
	var addrs []byte
	for _, l := range pkt.Layers() {
		switch l := l.(type) {
		case *layers.IPv4:
			if l.Flags&layers.IPv4MoreFragments != 0 || l.FragOffset != 0 {
				return nil, 0, 0, false
			}
			proto, addrs, seg = uint8(l.Protocol), append(append([]byte{}, l.SrcIP.To4()...), l.DstIP.To4()...), l.Payload
		case *layers.IPv6:
			proto, addrs, seg = uint8(l.NextHeader), append(append([]byte{}, l.SrcIP.To16()...), l.DstIP.To16()...), l.Payload
		case *layers.IPv6HopByHop:
			proto, seg = uint8(l.NextHeader), l.Payload
		case *layers.IPv6Destination:
			proto, seg = uint8(l.NextHeader), l.Payload
		case *layers.IPv6Routing:
			proto, seg = uint8(l.NextHeader), l.Payload
		case *layers.IPv6Fragment:
			if l.FragmentOffset != 0 || l.MoreFragments {
				return nil, 0, 0, false
			}
			// An atomic fragment is a whole datagram (gopacket stops
			// decoding here); its payload is the segment.
			proto, seg = uint8(l.NextHeader), l.Payload
		}
	}
	switch proto {
	case 6:
		csum = 16
	case 17:
		csum = 6
	default:
		return nil, 0, 0, false
	}
	if len(seg) < csum+2 || addrs == nil {
		return nil, 0, 0, false
	}
	n := len(seg)
	var ph []byte
	if len(addrs) == 8 {
		ph = append(addrs, 0, proto, byte(n>>8), byte(n))
	} else {
		ph = append(addrs, 0, 0, byte(n>>8), byte(n), 0, 0, 0, proto)
	}
	return seg, csum, Sum(ph, 0), true
}

// MakePartial returns a copy of frame whose innermost TCP or UDP checksum
// is left partial, as a sender with checksum offload hands it to a veth:
// the field holds the folded pseudo-header sum. The segment must lie in
// frame (it is decoded in place).
func MakePartial(tb testing.TB, frame []byte) []byte {
	tb.Helper()
	out := append([]byte(nil), frame...)
	seg, csum, pseudo, ok := transport(out)
	if !ok {
		tb.Fatalf("gpkt: MakePartial: no TCP or UDP segment in %x", frame)
	}
	binary.BigEndian.PutUint16(seg[csum:], pseudo)
	return out
}

// TransportValid reports whether the innermost TCP or UDP checksum of
// frame verifies (ok false: the frame has no TCP or UDP segment).
func TransportValid(frame []byte) (valid, ok bool) {
	seg, _, pseudo, ok := transport(frame)
	if !ok {
		return false, false
	}
	return Sum(seg, pseudo) == 0xffff, true
}

// CompletePartialIP is the oracle of the data path's partial-checksum
// completion (header.CompletePartialChecksum) for a raw IPv4 or IPv6
// packet: a copy of ip whose TCP or UDP checksum is completed when its
// field holds the folded pseudo-header sum and the whole checksum does not
// verify, and an unchanged copy otherwise. It shares no code with the
// header package: gopacket finds the segment, Sum sums it.
func CompletePartialIP(ip []byte) []byte {
	out := append([]byte(nil), ip...)
	if len(out) == 0 {
		return out
	}
	first := layers.LayerTypeIPv4
	if out[0]>>4 == 6 {
		first = layers.LayerTypeIPv6
	}
	seg, csum, pseudo, ok := transportFrom(out, first)
	if !ok || len(seg) > 0xffff || binary.BigEndian.Uint16(seg[csum:]) != pseudo || Sum(seg, pseudo) == 0xffff {
		return out
	}
	binary.BigEndian.PutUint16(seg[csum:], 0)
	c := ^Sum(seg, pseudo)
	if c == 0 && csum == 6 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(seg[csum:], c)
	return out
}
