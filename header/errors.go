package header

import "errors"

// Sentinel errors returned by the Check methods, ParseEthernet,
// IPv6.TransportHeader and the Rewrite functions. They are package values,
// so returning one never allocates; compare with == or errors.Is.
var (
	// ErrTruncated: the bytes end before a header or a length field says
	// they should.
	ErrTruncated = errors.New("header: truncated")
	// ErrVersion: the IP version nibble is not the expected one.
	ErrVersion = errors.New("header: wrong IP version")
	// ErrHeaderLength: a header length field is below its minimum (IPv4
	// IHL < 5, TCP data offset < 5).
	ErrHeaderLength = errors.New("header: bad header length")
	// ErrTotalLength: a length field is below the header it covers (IPv4
	// Total Length < IHL*4, UDP Length < 8).
	ErrTotalLength = errors.New("header: bad total length")
	// ErrChecksum: a checksum does not verify. Check methods never return
	// it; it is for callers that verify checksums and want a sentinel.
	ErrChecksum = errors.New("header: bad checksum")
	// ErrFlags: required flag bits are missing (VXLAN I flag).
	ErrFlags = errors.New("header: bad flags")
	// ErrExtension: a malformed, misplaced or excessive IPv6 extension
	// header chain, or more than two VLAN tags.
	ErrExtension = errors.New("header: bad extension header chain")
	// ErrOffset: RewriteIPv6 was given a transport offset that is
	// not inside the packet.
	ErrOffset = errors.New("header: transport offset outside packet")
)

// IP protocol numbers (IPv4 Protocol, IPv6 Next Header). The transport ones
// have the same names and values as in package flow.
const (
	ProtoHopByHop = 0  // IPv6 Hop-by-Hop Options
	ProtoICMP     = 1  // ICMP for IPv4
	ProtoTCP      = 6  // TCP
	ProtoUDP      = 17 // UDP
	ProtoRouting  = 43 // IPv6 Routing header
	ProtoFragment = 44 // IPv6 Fragment header
	ProtoESP      = 50 // IPsec Encapsulating Security Payload
	ProtoAH       = 51 // IPsec Authentication Header
	ProtoICMPv6   = 58 // ICMP for IPv6
	ProtoNoNext   = 59 // IPv6 No Next Header
	ProtoDestOpts = 60 // IPv6 Destination Options
)
