// Package header provides zero-copy views over the bytes of a frame:
// Ethernet (with up to two VLAN tags), IPv4, IPv6 (with its extension
// header chain), UDP, TCP, ICMPv4, ICMPv6 and VXLAN, plus one's-complement
// checksums, full (RFC 1071) and incremental (RFC 1624), and the NAT
// rewrites built on them.
//
// A header is a named byte slice, type IPv4 []byte, laid over the frame
// buffer without copying. It is validated once and then read and written
// through small accessors; nothing allocates, and errors are the package's
// sentinel values (ErrTruncated, ErrVersion, ...), so a data path can count
// a drop reason per packet without building an error.
//
// # Validation and panics
//
// Check methods and ParseEthernet never panic, whatever the bytes. They
// verify only what the accessors need to stay in bounds, plus the version:
//
//   - IPv4.Check: at least 20 bytes, version 4, IHL >= 5, and
//     IHL*4 <= Total Length <= len. It does not verify the header checksum
//     (IsChecksumValid does), flags or options.
//   - IPv6.Check: at least 40 bytes, version 6, 40+Payload Length <= len.
//   - UDP.Check: at least 8 bytes and 8 <= Length <= len.
//   - TCP.Check: at least 20 bytes and 20 <= data offset <= len.
//   - ICMPv4.Check, ICMPv6.Check: at least 8 bytes.
//   - VXLAN.Check: at least 8 bytes and the I flag set; reserved bits are
//     ignored on receive (RFC 7348).
//
// Accessors assume the matching Check passed and may panic on a slice that
// did not. No Check verifies a checksum.
//
// # IPv6 extension headers
//
// IPv6.TransportHeader walks Hop-by-Hop Options (0, only right after the
// fixed header), Routing (43), Destination Options (60) and Fragment (44,
// at most once), up to IPv6MaxExtensionHeaders of them; a malformed,
// misplaced or excessive chain gives ErrExtension. Every other Next Header
// value ends the walk and is returned as the protocol: the transport
// protocols, but also AH (51), ESP (50) and No Next Header (59), which are
// not walked. A non-first fragment also ends the walk.
// IPv6.QuotedTransportHeader walks the same chain in the packet an ICMPv6
// error quotes, which may stop short of its Payload Length: as far as the
// quote goes, a header that runs past its end being ErrExtension.
//
// # Checksums
//
// Checksum returns the folded, uncomplemented sum, as gVisor's does; a
// checksum field stores its complement, and CalculateChecksum methods
// return the value to store. The incremental updates implement RFC 1624
// eqn. 3 and agree exactly with a full recomputation (for data that is not
// all zero, which a header never is).
//
// UDP zero checksum: over IPv4 a stored 0 means "no checksum" (RFC 768).
// UDP's update methods leave a 0 alone and never store a computed 0 (they
// store 0xFFFF); they follow these IPv4 semantics. Over IPv6 a zero UDP
// checksum is invalid (RFC 8200 section 8.1), so RewriteIPv6 computes a full
// checksum for a whole datagram that arrives with 0.
//
// # NAT
//
// RewriteIPv4, RewriteIPv6 and RewriteIPv6Packet change an address and
// port on one side of a packet and fix every checksum that covers them, so
// NAT code never re-derives a checksum rule.
package header
