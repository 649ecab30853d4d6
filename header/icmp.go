package header

import "encoding/binary"

// ICMP header sizes: type, code, checksum and the 4-byte rest-of-header.
const (
	ICMPv4MinSize = 8
	ICMPv6MinSize = 8
)

// ICMPv4 types and codes (RFC 792, RFC 1191).
const (
	ICMPv4EchoReply       = 0
	ICMPv4DestUnreachable = 3
	ICMPv4EchoRequest     = 8
	ICMPv4TimeExceeded    = 11
	ICMPv4CodeFragNeeded  = 4 // code of ICMPv4DestUnreachable: DF set, MTU too small
	ICMPv4CodePortUnreach = 3 // code of ICMPv4DestUnreachable
)

// ICMPv6 types (RFC 4443).
const (
	ICMPv6DestUnreachable = 1
	ICMPv6PacketTooBig    = 2
	ICMPv6TimeExceeded    = 3
	ICMPv6EchoRequest     = 128
	ICMPv6EchoReply       = 129
)

// Offsets shared by ICMPv4 and ICMPv6.
const (
	icmpType     = 0
	icmpCode     = 1
	icmpChecksum = 2
	icmpIdent    = 4 // echo
	icmpSequence = 6 // echo
	icmpv4MTU    = 6 // fragmentation needed: next-hop MTU (RFC 1191)
	icmpv6MTU    = 4 // packet too big
)

// ICMPv4 is a view of an ICMP message for IPv4; slice it to the IP payload.
// After Check returns nil every accessor stays within bounds. Its checksum
// covers only the message, so an IP address rewrite leaves it unchanged.
type ICMPv4 []byte

// Check validates that len(m) >= 8 (ErrTruncated). It never panics.
func (m ICMPv4) Check() error {
	if len(m) < ICMPv4MinSize {
		return ErrTruncated
	}
	return nil
}

// Type returns the message type.
func (m ICMPv4) Type() uint8 { return m[icmpType] }

// Code returns the message code.
func (m ICMPv4) Code() uint8 { return m[icmpCode] }

// SetType sets the message type; the checksum is not updated.
func (m ICMPv4) SetType(v uint8) { m[icmpType] = v }

// SetCode sets the message code; the checksum is not updated.
func (m ICMPv4) SetCode(v uint8) { m[icmpCode] = v }

// Checksum returns the stored checksum.
func (m ICMPv4) Checksum() uint16 { return binary.BigEndian.Uint16(m[icmpChecksum:]) }

// SetChecksum stores the checksum.
func (m ICMPv4) SetChecksum(v uint16) { binary.BigEndian.PutUint16(m[icmpChecksum:], v) }

// Ident returns the echo identifier (meaningful for echo request/reply).
func (m ICMPv4) Ident() uint16 { return binary.BigEndian.Uint16(m[icmpIdent:]) }

// Sequence returns the echo sequence number.
func (m ICMPv4) Sequence() uint16 { return binary.BigEndian.Uint16(m[icmpSequence:]) }

// MTU returns the next-hop MTU of a "fragmentation needed" message (type 3
// code 4, RFC 1191).
func (m ICMPv4) MTU() uint16 { return binary.BigEndian.Uint16(m[icmpv4MTU:]) }

// Payload returns the bytes after the 8-byte header in place (echo data, or
// the start of the offending packet in an error message).
func (m ICMPv4) Payload() []byte { return m[ICMPv4MinSize:] }

// CalculateChecksum returns the checksum to store for the whole of m,
// skipping the checksum field.
func (m ICMPv4) CalculateChecksum() uint16 {
	return ^Checksum(m[icmpChecksum+2:], Checksum(m[:icmpChecksum], 0))
}

// IsChecksumValid reports whether the stored checksum verifies over m.
func (m ICMPv4) IsChecksumValid() bool { return Checksum(m, 0) == 0xffff }

// ICMPv6 is a view of an ICMPv6 message; slice it to the upper-layer
// packet. After Check returns nil every accessor stays within bounds. Its
// checksum covers the IPv6 pseudo-header (RFC 4443 section 2.3).
type ICMPv6 []byte

// Check validates that len(m) >= 8 (ErrTruncated). It never panics.
func (m ICMPv6) Check() error {
	if len(m) < ICMPv6MinSize {
		return ErrTruncated
	}
	return nil
}

// Type returns the message type.
func (m ICMPv6) Type() uint8 { return m[icmpType] }

// Code returns the message code.
func (m ICMPv6) Code() uint8 { return m[icmpCode] }

// SetType sets the message type; the checksum is not updated.
func (m ICMPv6) SetType(v uint8) { m[icmpType] = v }

// SetCode sets the message code; the checksum is not updated.
func (m ICMPv6) SetCode(v uint8) { m[icmpCode] = v }

// Checksum returns the stored checksum.
func (m ICMPv6) Checksum() uint16 { return binary.BigEndian.Uint16(m[icmpChecksum:]) }

// SetChecksum stores the checksum.
func (m ICMPv6) SetChecksum(v uint16) { binary.BigEndian.PutUint16(m[icmpChecksum:], v) }

// Ident returns the echo identifier (meaningful for echo request/reply).
func (m ICMPv6) Ident() uint16 { return binary.BigEndian.Uint16(m[icmpIdent:]) }

// Sequence returns the echo sequence number.
func (m ICMPv6) Sequence() uint16 { return binary.BigEndian.Uint16(m[icmpSequence:]) }

// MTU returns the MTU of a Packet Too Big message (type 2).
func (m ICMPv6) MTU() uint32 { return binary.BigEndian.Uint32(m[icmpv6MTU:]) }

// Payload returns the bytes after the 8-byte header in place.
func (m ICMPv6) Payload() []byte { return m[ICMPv6MinSize:] }

// CalculateChecksum returns the checksum to store for the whole of m,
// skipping the checksum field. pseudo is
// PseudoHeaderChecksum(ProtoICMPv6, src, dst, uint16(len(m))).
func (m ICMPv6) CalculateChecksum(pseudo uint16) uint16 {
	return ^Checksum(m[icmpChecksum+2:], Checksum(m[:icmpChecksum], pseudo))
}

// IsChecksumValid reports whether the stored checksum verifies over m with
// the given pseudo-header sum.
func (m ICMPv6) IsChecksumValid(pseudo uint16) bool { return Checksum(m, pseudo) == 0xffff }

// UpdateChecksumPseudoHeaderAddress updates the checksum for an address in
// the pseudo-header changing from old to new (16 bytes each).
func (m ICMPv6) UpdateChecksumPseudoHeaderAddress(old, new []byte) {
	m.SetChecksum(ChecksumUpdate(m.Checksum(), old, new))
}
