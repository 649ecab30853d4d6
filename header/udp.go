package header

import "encoding/binary"

// UDPSize is the size of the UDP header.
const UDPSize = 8

// Offsets of the UDP header fields (RFC 768).
const (
	udpSrcPort  = 0
	udpDstPort  = 2
	udpLength   = 4
	udpChecksum = 6
)

// UDP is a view of a UDP datagram, header first; slice it to the IP
// payload. After Check returns nil every accessor stays within bounds.
//
// Zero checksum rule: over IPv4 a stored checksum of 0 means "not computed"
// (RFC 768), so the incremental updates here leave 0 alone, and whenever
// they or CalculateChecksum would produce 0 they store 0xFFFF instead (the
// other one's-complement zero). Over IPv6 a zero UDP checksum is invalid
// (RFC 8200 section 8.1); RewriteIPv6 computes a full one in that case.
type UDP []byte

// Check validates the framing: len(u) >= 8 else ErrTruncated; Length >= 8
// else ErrTotalLength; Length <= len(u) else ErrTruncated. The checksum is
// not verified. It never panics.
func (u UDP) Check() error {
	if len(u) < UDPSize {
		return ErrTruncated
	}
	l := int(binary.BigEndian.Uint16(u[udpLength:]))
	if l < UDPSize {
		return ErrTotalLength
	}
	if l > len(u) {
		return ErrTruncated
	}
	return nil
}

// SrcPort returns the source port.
func (u UDP) SrcPort() uint16 { return binary.BigEndian.Uint16(u[udpSrcPort:]) }

// DstPort returns the destination port.
func (u UDP) DstPort() uint16 { return binary.BigEndian.Uint16(u[udpDstPort:]) }

// SetSrcPort sets the source port; the checksum is not updated.
func (u UDP) SetSrcPort(p uint16) { binary.BigEndian.PutUint16(u[udpSrcPort:], p) }

// SetDstPort sets the destination port; the checksum is not updated.
func (u UDP) SetDstPort(p uint16) { binary.BigEndian.PutUint16(u[udpDstPort:], p) }

// Length returns the Length field: header plus data.
func (u UDP) Length() uint16 { return binary.BigEndian.Uint16(u[udpLength:]) }

// SetLength sets the Length field.
func (u UDP) SetLength(v uint16) { binary.BigEndian.PutUint16(u[udpLength:], v) }

// Checksum returns the stored checksum.
func (u UDP) Checksum() uint16 { return binary.BigEndian.Uint16(u[udpChecksum:]) }

// SetChecksum stores the checksum.
func (u UDP) SetChecksum(v uint16) { binary.BigEndian.PutUint16(u[udpChecksum:], v) }

// Payload returns u[8:Length()] in place.
func (u UDP) Payload() []byte { return u[UDPSize:u.Length()] }

// Encode writes a UDP header with the given ports and length and a zero
// checksum (set it afterwards with SetChecksum(CalculateChecksum(...)) or
// leave it 0 over IPv4).
func (u UDP) Encode(src, dst, length uint16) {
	_ = u[UDPSize-1]
	binary.BigEndian.PutUint16(u[udpSrcPort:], src)
	binary.BigEndian.PutUint16(u[udpDstPort:], dst)
	binary.BigEndian.PutUint16(u[udpLength:], length)
	binary.BigEndian.PutUint16(u[udpChecksum:], 0)
}

// CalculateChecksum returns the checksum to store for the whole of u
// (header and data; slice u to Length first), skipping the checksum field.
// pseudo is PseudoHeaderChecksum(ProtoUDP, src, dst, uint16(len(u))).
// A computed 0 is returned as 0xFFFF.
func (u UDP) CalculateChecksum(pseudo uint16) uint16 {
	c := ^Checksum(u[udpChecksum+2:], Checksum(u[:udpChecksum], pseudo))
	if c == 0 {
		return 0xffff
	}
	return c
}

// IsChecksumValid reports whether the stored checksum verifies over u with
// the given pseudo-header sum. A stored 0 ("no checksum") reports true:
// IPv6 callers must reject it themselves.
func (u UDP) IsChecksumValid(pseudo uint16) bool {
	return u.Checksum() == 0 || Checksum(u, pseudo) == 0xffff
}

// UpdateChecksumPseudoHeaderAddress updates the checksum for an address in
// the pseudo-header changing from old to new (4 or 16 bytes each). A stored
// 0 is left alone (IPv4 "no checksum" semantics); a result of 0 is stored
// as 0xFFFF. For IPv6 with a stored 0, use RewriteIPv6 instead.
func (u UDP) UpdateChecksumPseudoHeaderAddress(old, new []byte) {
	c := u.Checksum()
	if c == 0 {
		return
	}
	u.SetChecksum(nonZero(ChecksumUpdate(c, old, new)))
}

// SetSrcPortWithChecksumUpdate sets the source port and updates the
// checksum incrementally, with the zero rule of
// UpdateChecksumPseudoHeaderAddress.
func (u UDP) SetSrcPortWithChecksumUpdate(p uint16) { u.setPortWithChecksumUpdate(udpSrcPort, p) }

// SetDstPortWithChecksumUpdate sets the destination port and updates the
// checksum incrementally, with the zero rule of
// UpdateChecksumPseudoHeaderAddress.
func (u UDP) SetDstPortWithChecksumUpdate(p uint16) { u.setPortWithChecksumUpdate(udpDstPort, p) }

func (u UDP) setPortWithChecksumUpdate(off int, p uint16) {
	old := binary.BigEndian.Uint16(u[off:])
	binary.BigEndian.PutUint16(u[off:], p)
	if c := u.Checksum(); c != 0 {
		u.SetChecksum(nonZero(ChecksumUpdate16(c, old, p)))
	}
}

// nonZero maps a computed UDP checksum of 0 to 0xFFFF (RFC 768).
func nonZero(c uint16) uint16 {
	if c == 0 {
		return 0xffff
	}
	return c
}
