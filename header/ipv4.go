package header

import "encoding/binary"

// IPv4 header sizes.
const (
	IPv4MinSize = 20 // header without options (IHL 5)
	IPv4MaxSize = 60 // header with 40 bytes of options (IHL 15)
)

// Offsets of the IPv4 header fields (RFC 791).
const (
	ipv4VersIHL     = 0
	ipv4TOS         = 1
	ipv4TotalLen    = 2
	ipv4ID          = 4
	ipv4FlagsFrag   = 6
	ipv4TTL         = 8
	ipv4Protocol    = 9
	ipv4Checksum    = 10
	ipv4Src         = 12
	ipv4Dst         = 16
	ipv4AddressSize = 4
)

// IPv4 flag bits as returned by Flags (the top three bits of the
// flags/fragment-offset word).
const (
	IPv4FlagMoreFragments = 1 << 0
	IPv4FlagDontFragment  = 1 << 1
	IPv4FlagReserved      = 1 << 2
)

const ipv4FragOffsetMask = 0x1fff

// IPv4 is a view of an IPv4 packet, header first. After Check returns nil
// every accessor stays within bounds; on an unchecked slice accessors may
// panic.
type IPv4 []byte

// Check validates the framing the accessors rely on: len(ip) >= 20 else
// ErrTruncated; version 4 else ErrVersion; IHL >= 5 else ErrHeaderLength;
// IHL*4 <= len(ip) else ErrTruncated; Total Length >= IHL*4 else
// ErrTotalLength; Total Length <= len(ip) else ErrTruncated (the frame was
// cut short; bytes past Total Length, such as Ethernet padding, are allowed
// and ignored by Payload). It does not verify the header checksum (see
// IsChecksumValid), the flags or the options. It never panics.
func (ip IPv4) Check() error {
	if len(ip) < IPv4MinSize {
		return ErrTruncated
	}
	if ip[ipv4VersIHL]>>4 != 4 {
		return ErrVersion
	}
	hl := int(ip[ipv4VersIHL]&0xf) * 4
	if hl < IPv4MinSize {
		return ErrHeaderLength
	}
	if hl > len(ip) {
		return ErrTruncated
	}
	tl := int(binary.BigEndian.Uint16(ip[ipv4TotalLen:]))
	if tl < hl {
		return ErrTotalLength
	}
	if tl > len(ip) {
		return ErrTruncated
	}
	return nil
}

// HeaderLength returns the header length in bytes (IHL*4), options
// included.
func (ip IPv4) HeaderLength() int { return int(ip[ipv4VersIHL]&0xf) * 4 }

// TOS returns the type-of-service byte (DSCP and ECN).
func (ip IPv4) TOS() uint8 { return ip[ipv4TOS] }

// TotalLength returns the Total Length field: header plus payload.
func (ip IPv4) TotalLength() uint16 { return binary.BigEndian.Uint16(ip[ipv4TotalLen:]) }

// SetTotalLength sets the Total Length field; the checksum is not updated.
func (ip IPv4) SetTotalLength(v uint16) { binary.BigEndian.PutUint16(ip[ipv4TotalLen:], v) }

// ID returns the Identification field.
func (ip IPv4) ID() uint16 { return binary.BigEndian.Uint16(ip[ipv4ID:]) }

// Flags returns the three flag bits (IPv4FlagMoreFragments,
// IPv4FlagDontFragment, IPv4FlagReserved).
func (ip IPv4) Flags() uint8 { return ip[ipv4FlagsFrag] >> 5 }

// FragmentOffset returns the fragment offset in bytes (the field times 8).
func (ip IPv4) FragmentOffset() uint16 {
	return (binary.BigEndian.Uint16(ip[ipv4FlagsFrag:]) & ipv4FragOffsetMask) << 3
}

// MoreFragments reports whether the MF flag is set.
func (ip IPv4) MoreFragments() bool { return ip.Flags()&IPv4FlagMoreFragments != 0 }

// DontFragment reports whether the DF flag is set.
func (ip IPv4) DontFragment() bool { return ip.Flags()&IPv4FlagDontFragment != 0 }

// IsFragment reports whether ip is part of a fragmented datagram: MF is set
// or the fragment offset is not zero.
func (ip IPv4) IsFragment() bool {
	return binary.BigEndian.Uint16(ip[ipv4FlagsFrag:])&(IPv4FlagMoreFragments<<13|ipv4FragOffsetMask) != 0
}

// IsNonFirstFragment reports whether the fragment offset is not zero, that
// is, the payload does not start with the transport header.
func (ip IPv4) IsNonFirstFragment() bool {
	return binary.BigEndian.Uint16(ip[ipv4FlagsFrag:])&ipv4FragOffsetMask != 0
}

// TTL returns the time-to-live field.
func (ip IPv4) TTL() uint8 { return ip[ipv4TTL] }

// SetTTL sets the TTL field; the checksum is not updated.
func (ip IPv4) SetTTL(v uint8) { ip[ipv4TTL] = v }

// SetTTLWithChecksumUpdate sets the TTL field and updates the header
// checksum incrementally (RFC 1624).
func (ip IPv4) SetTTLWithChecksumUpdate(v uint8) {
	old := binary.BigEndian.Uint16(ip[ipv4TTL:])
	// The new word from the old one in a register: reading it back after
	// the byte store would wait for the store (a wider load than the
	// store cannot be forwarded from it).
	ip[ipv4TTL] = v
	ip.SetChecksum(ChecksumUpdate16(ip.Checksum(), old, uint16(v)<<8|old&0xff))
}

// Protocol returns the Protocol field (ProtoTCP, ProtoUDP, ...).
func (ip IPv4) Protocol() uint8 { return ip[ipv4Protocol] }

// Checksum returns the stored header checksum.
func (ip IPv4) Checksum() uint16 { return binary.BigEndian.Uint16(ip[ipv4Checksum:]) }

// SetChecksum stores the header checksum.
func (ip IPv4) SetChecksum(v uint16) { binary.BigEndian.PutUint16(ip[ipv4Checksum:], v) }

// CalculateChecksum computes the header checksum over IHL*4 bytes, skipping
// the checksum field, and returns the value to store.
func (ip IPv4) CalculateChecksum() uint16 {
	hl := ip.HeaderLength()
	return ^Checksum(ip[ipv4Checksum+2:hl], Checksum(ip[:ipv4Checksum], 0))
}

// IsChecksumValid reports whether the stored header checksum is right.
func (ip IPv4) IsChecksumValid() bool {
	return Checksum(ip[:ip.HeaderLength()], 0) == 0xffff
}

// Src returns the source address.
func (ip IPv4) Src() [4]byte { return [4]byte(ip[ipv4Src : ipv4Src+4]) }

// Dst returns the destination address.
func (ip IPv4) Dst() [4]byte { return [4]byte(ip[ipv4Dst : ipv4Dst+4]) }

// SrcSlice returns the 4 bytes of the source address in place (a view, not
// a copy).
func (ip IPv4) SrcSlice() []byte { return ip[ipv4Src : ipv4Src+4 : ipv4Src+4] }

// DstSlice returns the 4 bytes of the destination address in place.
func (ip IPv4) DstSlice() []byte { return ip[ipv4Dst : ipv4Dst+4 : ipv4Dst+4] }

// SetSrc sets the source address; no checksum is changed.
func (ip IPv4) SetSrc(a [4]byte) { copy(ip[ipv4Src:ipv4Src+4], a[:]) }

// SetDst sets the destination address; no checksum is changed.
func (ip IPv4) SetDst(a [4]byte) { copy(ip[ipv4Dst:ipv4Dst+4], a[:]) }

// SetSrcWithChecksumUpdate sets the source address and updates the IP header
// checksum incrementally (RFC 1624). Transport checksums, whose
// pseudo-header covers the address, are not touched: see
// TCP.UpdateChecksumPseudoHeaderAddress, UDP.UpdateChecksumPseudoHeaderAddress
// or RewriteIPv4.
func (ip IPv4) SetSrcWithChecksumUpdate(a [4]byte) { ip.setAddrWithChecksumUpdate(ipv4Src, a) }

// SetDstWithChecksumUpdate sets the destination address and updates the IP
// header checksum incrementally (RFC 1624). Transport checksums are not
// touched; see SetSrcWithChecksumUpdate.
func (ip IPv4) SetDstWithChecksumUpdate(a [4]byte) { ip.setAddrWithChecksumUpdate(ipv4Dst, a) }

func (ip IPv4) setAddrWithChecksumUpdate(off int, a [4]byte) {
	f := ip[off : off+4]
	ip.SetChecksum(ChecksumUpdate(ip.Checksum(), f, a[:]))
	copy(f, a[:])
}

// Options returns the option bytes in place (empty when IHL is 5).
func (ip IPv4) Options() []byte { return ip[IPv4MinSize:ip.HeaderLength()] }

// Payload returns ip[HeaderLength():TotalLength()] in place: the transport
// header and data, or the fragment's data. Bytes after Total Length are
// excluded.
func (ip IPv4) Payload() []byte { return ip[ip.HeaderLength():ip.TotalLength()] }

// IPv4Fields holds the values IPv4.Encode writes.
type IPv4Fields struct {
	TOS            uint8
	TotalLength    uint16
	ID             uint16
	Flags          uint8  // IPv4Flag* bits
	FragmentOffset uint16 // in bytes; must be a multiple of 8
	TTL            uint8
	Protocol       uint8
	Src, Dst       [4]byte
}

// Encode writes a 20-byte header (version 4, IHL 5, no options) from f,
// including the correct header checksum. The payload is not touched.
// It panics when len(ip) < 20.
func (ip IPv4) Encode(f *IPv4Fields) {
	_ = ip[IPv4MinSize-1]
	ip[ipv4VersIHL] = 4<<4 | IPv4MinSize/4
	ip[ipv4TOS] = f.TOS
	binary.BigEndian.PutUint16(ip[ipv4TotalLen:], f.TotalLength)
	binary.BigEndian.PutUint16(ip[ipv4ID:], f.ID)
	binary.BigEndian.PutUint16(ip[ipv4FlagsFrag:], uint16(f.Flags&7)<<13|(f.FragmentOffset>>3)&ipv4FragOffsetMask)
	ip[ipv4TTL] = f.TTL
	ip[ipv4Protocol] = f.Protocol
	copy(ip[ipv4Src:], f.Src[:])
	copy(ip[ipv4Dst:], f.Dst[:])
	binary.BigEndian.PutUint16(ip[ipv4Checksum:], 0)
	ip.SetChecksum(^Checksum(ip[:IPv4MinSize], 0))
}
