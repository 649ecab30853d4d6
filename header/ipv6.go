package header

import "encoding/binary"

// IPv6Size is the size of the fixed IPv6 header.
const IPv6Size = 40

// Offsets of the IPv6 header fields (RFC 8200 section 3).
const (
	ipv6VersTCFlow  = 0
	ipv6PayloadLen  = 4
	ipv6NextHeader  = 6
	ipv6HopLimit    = 7
	ipv6Src         = 8
	ipv6Dst         = 24
	ipv6AddressSize = 16
)

// IPv6 extension header walking limits and sizes.
const (
	// IPv6MaxExtensionHeaders is how many extension headers
	// TransportHeader walks before it gives up with ErrExtension.
	IPv6MaxExtensionHeaders = 8
	// IPv6FragmentHeaderSize is the size of the Fragment header.
	IPv6FragmentHeaderSize = 8
)

// IPv6 is a view of an IPv6 packet, fixed header first. After Check
// returns nil every accessor stays within bounds; on an unchecked slice
// accessors may panic.
type IPv6 []byte

// Check validates the framing the accessors rely on: len(ip) >= 40 else
// ErrTruncated; version 6 else ErrVersion; 40 + Payload Length <= len(ip)
// else ErrTruncated (bytes past it, such as Ethernet padding, are allowed
// and ignored by Payload). Jumbograms (Payload Length 0 with a Jumbo
// Payload option) are not supported: they look like an empty payload.
// It never panics.
func (ip IPv6) Check() error {
	if len(ip) < IPv6Size {
		return ErrTruncated
	}
	if ip[ipv6VersTCFlow]>>4 != 6 {
		return ErrVersion
	}
	if IPv6Size+int(binary.BigEndian.Uint16(ip[ipv6PayloadLen:])) > len(ip) {
		return ErrTruncated
	}
	return nil
}

// TrafficClass returns the 8-bit traffic class (DSCP and ECN).
func (ip IPv6) TrafficClass() uint8 {
	return uint8(binary.BigEndian.Uint16(ip[ipv6VersTCFlow:]) >> 4)
}

// FlowLabel returns the 20-bit flow label.
func (ip IPv6) FlowLabel() uint32 {
	return binary.BigEndian.Uint32(ip[ipv6VersTCFlow:]) & 0xfffff
}

// PayloadLength returns the Payload Length field: bytes after the fixed
// header, extension headers included.
func (ip IPv6) PayloadLength() uint16 { return binary.BigEndian.Uint16(ip[ipv6PayloadLen:]) }

// SetPayloadLength sets the Payload Length field.
func (ip IPv6) SetPayloadLength(v uint16) { binary.BigEndian.PutUint16(ip[ipv6PayloadLen:], v) }

// NextHeader returns the Next Header field of the fixed header.
func (ip IPv6) NextHeader() uint8 { return ip[ipv6NextHeader] }

// HopLimit returns the Hop Limit field.
func (ip IPv6) HopLimit() uint8 { return ip[ipv6HopLimit] }

// SetHopLimit sets the Hop Limit field.
func (ip IPv6) SetHopLimit(v uint8) { ip[ipv6HopLimit] = v }

// Src returns the source address.
func (ip IPv6) Src() [16]byte { return [16]byte(ip[ipv6Src : ipv6Src+16]) }

// Dst returns the destination address.
func (ip IPv6) Dst() [16]byte { return [16]byte(ip[ipv6Dst : ipv6Dst+16]) }

// SrcSlice returns the 16 bytes of the source address in place.
func (ip IPv6) SrcSlice() []byte { return ip[ipv6Src : ipv6Src+16 : ipv6Src+16] }

// DstSlice returns the 16 bytes of the destination address in place.
func (ip IPv6) DstSlice() []byte { return ip[ipv6Dst : ipv6Dst+16 : ipv6Dst+16] }

// SetSrc sets the source address. IPv6 has no header checksum; transport
// checksums are not touched (see RewriteIPv6).
func (ip IPv6) SetSrc(a [16]byte) { copy(ip[ipv6Src:ipv6Src+16], a[:]) }

// SetDst sets the destination address; transport checksums are not touched.
func (ip IPv6) SetDst(a [16]byte) { copy(ip[ipv6Dst:ipv6Dst+16], a[:]) }

// Payload returns ip[40:40+PayloadLength()] in place: extension headers and
// the upper-layer packet.
func (ip IPv6) Payload() []byte { return ip[IPv6Size : IPv6Size+int(ip.PayloadLength())] }

// IPv6Frag describes the Fragment header TransportHeader met, if any.
type IPv6Frag struct {
	Present bool   // a Fragment header was found
	Offset  uint16 // fragment offset in bytes
	More    bool   // M flag: more fragments follow
	ID      uint32 // Identification
}

// NonFirst reports whether the packet is a fragment other than the first,
// whose payload does not start with the transport header.
func (f IPv6Frag) NonFirst() bool { return f.Present && f.Offset != 0 }

// IsFragment reports whether the packet is part of a fragmented datagram
// (an atomic fragment, offset 0 with M clear, is not).
func (f IPv6Frag) IsFragment() bool { return f.Present && (f.Offset != 0 || f.More) }

// TransportHeader walks the extension headers and returns the upper-layer
// protocol, the offset of its header from the start of ip, and what the
// Fragment header said.
//
// Walked: Hop-by-Hop Options (0, only directly after the fixed header),
// Routing (43), Destination Options (60) and Fragment (44, at most one).
// Hop-by-Hop, Routing and Destination Options are (Hdr Ext Len+1)*8 bytes
// long; Fragment is 8. Any other value, including AH (51), ESP (50) and No
// Next Header (59), is returned as proto with off pointing at it; so is the
// Next Header of a non-first fragment, whose off points at fragment data
// rather than a header (check frag.NonFirst()).
//
// It returns ErrTruncated when ip fails Check's length tests, and
// ErrExtension when an extension header runs past 40+PayloadLength, when
// Hop-by-Hop is not first, on a second Fragment header, or after
// IPv6MaxExtensionHeaders headers. The version is not checked. It never
// panics, whatever ip holds, and never allocates.
func (ip IPv6) TransportHeader() (proto uint8, off int, frag IPv6Frag, err error) {
	proto, off, frag, _, err = ip.walk(false)
	return proto, off, frag, err
}

// QuotedTransportHeader is TransportHeader for the packet an ICMPv6 error
// quotes, which holds only the packet's first bytes: the chain is walked
// within ip or within 40+PayloadLength, whichever ends first, instead of
// failing when ip is shorter than its Payload Length says. An extension
// header that runs past that end, like one that is malformed, misplaced
// or one too many, gives ErrExtension; ErrTruncated means ip is shorter
// than the fixed header. The offset returned may equal len(ip) (nothing
// of the transport header quoted). routed reports a Routing header with
// Segments Left > 0 in the chain: the quoted transport checksum's
// pseudo-header then holds the final destination, from that header, not
// Dst (a translator that rewrites Dst cannot follow it). The version is
// not checked. It never panics and never allocates.
func (ip IPv6) QuotedTransportHeader() (proto uint8, off int, frag IPv6Frag, routed bool, err error) {
	return ip.walk(true)
}

// walk is TransportHeader that also reports whether a Routing header with
// Segments Left > 0 was seen: then the final destination, which the
// transport pseudo-header uses, is in the Routing header, not in Dst.
// With quoted it is QuotedTransportHeader: a packet cut short is walked
// as far as it goes.
func (ip IPv6) walk(quoted bool) (proto uint8, off int, frag IPv6Frag, routed bool, err error) {
	if len(ip) < IPv6Size {
		return 0, 0, frag, false, ErrTruncated
	}
	end := IPv6Size + int(binary.BigEndian.Uint16(ip[ipv6PayloadLen:]))
	if end > len(ip) {
		if !quoted {
			return 0, 0, frag, false, ErrTruncated
		}
		end = len(ip)
	}
	b := ip[:end]
	proto = b[ipv6NextHeader]
	off = IPv6Size
	for n := 0; ; n++ {
		switch proto {
		case ProtoHopByHop, ProtoRouting, ProtoDestOpts, ProtoFragment:
		default:
			return proto, off, frag, routed, nil
		}
		if n == IPv6MaxExtensionHeaders {
			return 0, 0, IPv6Frag{}, false, ErrExtension
		}
		if len(b)-off < 8 {
			return 0, 0, IPv6Frag{}, false, ErrExtension
		}
		h := b[off:]
		next := h[0]
		var size int
		switch proto {
		case ProtoHopByHop:
			if off != IPv6Size {
				return 0, 0, IPv6Frag{}, false, ErrExtension
			}
			size = (int(h[1]) + 1) * 8
		case ProtoRouting:
			size = (int(h[1]) + 1) * 8
			if h[3] != 0 { // Segments Left
				routed = true
			}
		case ProtoDestOpts:
			size = (int(h[1]) + 1) * 8
		case ProtoFragment:
			if frag.Present {
				return 0, 0, IPv6Frag{}, false, ErrExtension
			}
			fo := binary.BigEndian.Uint16(h[2:])
			frag = IPv6Frag{
				Present: true,
				Offset:  fo &^ 7,
				More:    fo&1 != 0,
				ID:      binary.BigEndian.Uint32(h[4:]),
			}
			size = IPv6FragmentHeaderSize
		}
		if size > len(b)-off {
			return 0, 0, IPv6Frag{}, false, ErrExtension
		}
		off += size
		proto = next
		if frag.NonFirst() {
			// What follows is fragment data, not headers.
			return proto, off, frag, routed, nil
		}
	}
}

// IPv6Fields holds the values IPv6.Encode writes.
type IPv6Fields struct {
	TrafficClass  uint8
	FlowLabel     uint32 // low 20 bits used
	PayloadLength uint16
	NextHeader    uint8
	HopLimit      uint8
	Src, Dst      [16]byte
}

// Encode writes the 40-byte fixed header from f. It panics when
// len(ip) < 40.
func (ip IPv6) Encode(f *IPv6Fields) {
	_ = ip[IPv6Size-1]
	binary.BigEndian.PutUint32(ip[ipv6VersTCFlow:], 6<<28|uint32(f.TrafficClass)<<20|f.FlowLabel&0xfffff)
	binary.BigEndian.PutUint16(ip[ipv6PayloadLen:], f.PayloadLength)
	ip[ipv6NextHeader] = f.NextHeader
	ip[ipv6HopLimit] = f.HopLimit
	copy(ip[ipv6Src:], f.Src[:])
	copy(ip[ipv6Dst:], f.Dst[:])
}
