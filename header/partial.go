package header

import "encoding/binary"

// PartialResult is what CompletePartialChecksum found and did.
type PartialResult uint8

const (
	// NotPartial: the checksum field is not the pseudo-header sum; the
	// segment was left as it is (a complete checksum, right or wrong).
	NotPartial PartialResult = iota
	// PartialCompleted: the field held only the pseudo-header sum and the
	// whole checksum did not verify; it now holds the complete checksum.
	PartialCompleted
	// PartialValid: the field equals the pseudo-header sum, but that is
	// also the right complete checksum (one segment in 65536); left alone.
	PartialValid
	// PartialUnsupported: not a TCP or UDP segment this function can
	// judge (unknown protocol, too short, longer than 65535 bytes).
	PartialUnsupported
)

// CompletePartialChecksum finishes a TCP or UDP checksum that a sender on
// the same machine left partial, and leaves every other segment alone.
//
// A sender that offloads its checksum (CHECKSUM_PARTIAL in Linux, see the
// kernel's Documentation/networking/checksum-offloads.rst) writes only the
// folded pseudo-header sum into the checksum field and expects the device
// to sum the segment on transmit. A veth or tap has no such device: the
// frame reaches the peer — and an XDP program or AF_XDP socket on it — with
// the checksum unfinished, and the kernel that receives it after a data
// plane forwarded it finds the checksum wrong. Such a frame is recognised
// by its checksum field equalling the folded pseudo-header sum while the
// whole checksum does not verify; it is then completed in one pass over
// the segment, as the device would have done. A frame whose checksum is
// wrong in any other way is not repaired: it stays wrong, and so do the
// data plane's incremental rewrites of it. The one frame in 65536 whose
// corrupted checksum happens to equal the pseudo-header sum cannot be told
// apart from a partial one (nor could a device).
//
// proto is 6 (TCP) or 17 (UDP); src and dst are the IP addresses (4 or 16
// bytes) the pseudo-header covers (for IPv6 with a Routing header the
// final destination would be needed; such a segment is not recognised and
// stays as it is); seg is the transport segment from its header to the end
// of the IP datagram (engine.Packet.L4Segment). An IPv4 UDP checksum of 0
// (none) is never partial. A completed UDP checksum of 0 is stored as
// 0xFFFF (RFC 768).
func CompletePartialChecksum(proto uint8, src, dst, seg []byte) PartialResult {
	var off int
	switch proto {
	case 6:
		off = tcpChecksum
		if len(seg) < TCPMinSize {
			return PartialUnsupported
		}
	case 17:
		off = udpChecksum
		if len(seg) < UDPSize {
			return PartialUnsupported
		}
	default:
		return PartialUnsupported
	}
	if len(seg) > 0xffff {
		return PartialUnsupported
	}
	pseudo := PseudoHeaderChecksum(proto, src, dst, uint16(len(seg)))
	if binary.BigEndian.Uint16(seg[off:]) != pseudo {
		return NotPartial
	}
	// The field holds pseudo, so the segment's own sum already counts the
	// pseudo-header once: whole = pseudo + sum(seg) verifies as 0xFFFF when
	// the field is a complete checksum that happens to equal pseudo.
	whole := Checksum(seg, pseudo)
	if whole == 0xffff {
		return PartialValid
	}
	// sum(seg) = whole - pseudo (one's complement), and the device would
	// store ^sum(seg).
	c := ^ChecksumCombine(whole, ^pseudo)
	if c == 0 && proto == 17 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(seg[off:], c)
	return PartialCompleted
}
