package header

// Side selects which endpoint of a packet a rewrite changes. Any value
// other than SideDst means SideSrc.
type Side uint8

// The two endpoints of a packet.
const (
	SideSrc Side = iota // source address and port
	SideDst             // destination address and port
)

// RewriteIPv4 rewrites the source or destination address of ip, and for TCP
// and UDP the port on the same side, keeping every checksum right by
// incremental update (RFC 1624): the IP header checksum, and the TCP or UDP
// checksum, whose pseudo-header covers the address.
//
//   - The transport header is found through Protocol at HeaderLength().
//   - UDP with a zero checksum ("none", RFC 768) keeps it zero; an updated
//     UDP checksum is never stored as 0 (0xFFFF instead).
//   - A non-first fragment (offset != 0) has no transport header: only the
//     address and the IP checksum change, port is ignored. A first fragment
//     is rewritten like a whole packet: the incremental update stays right
//     for the checksum of the reassembled datagram.
//   - ICMP and any other protocol: only the address changes (the ICMPv4
//     checksum does not cover addresses); port is ignored, and the echo
//     identifier is never touched.
//
// It returns ip.Check()'s error, or ErrTruncated when the payload is shorter
// than the TCP (20) or UDP (8) header. On error ip is left unchanged.
func RewriteIPv4(ip IPv4, side Side, addr [4]byte, port uint16) error {
	if err := ip.Check(); err != nil {
		return err
	}
	l4 := ip.Payload()
	proto := uint8(0) // no transport header to rewrite
	if !ip.IsNonFirstFragment() {
		proto = ip.Protocol()
		switch proto {
		case ProtoTCP:
			if len(l4) < TCPMinSize {
				return ErrTruncated
			}
		case ProtoUDP:
			if len(l4) < UDPSize {
				return ErrTruncated
			}
		}
	}
	off := ipv4Src
	if side == SideDst {
		off = ipv4Dst
	}
	old := [4]byte(ip[off : off+ipv4AddressSize])
	ip.setAddrWithChecksumUpdate(off, addr)
	switch proto {
	case ProtoTCP:
		t := TCP(l4)
		t.UpdateChecksumPseudoHeaderAddress(old[:], addr[:])
		if side == SideDst {
			t.SetDstPortWithChecksumUpdate(port)
		} else {
			t.SetSrcPortWithChecksumUpdate(port)
		}
	case ProtoUDP:
		u := UDP(l4)
		u.UpdateChecksumPseudoHeaderAddress(old[:], addr[:])
		if side == SideDst {
			u.SetDstPortWithChecksumUpdate(port)
		} else {
			u.SetSrcPortWithChecksumUpdate(port)
		}
	}
	return nil
}

// RewriteIPv6 rewrites the source or destination address of ip, and for TCP
// and UDP the port on the same side, keeping the transport checksum right:
// TCP, UDP and ICMPv6 checksums cover the address through the pseudo-header
// and are updated incrementally (RFC 1624); IPv6 has no header checksum.
// proto and l4Off are what ip.TransportHeader returned.
//
//   - For a non-first fragment (frag.NonFirst()) pass l4Off < 0: only the
//     address changes.
//   - UDP with a zero checksum, which IPv6 forbids (RFC 8200 section 8.1):
//     when the datagram is whole (UDP Length equals the bytes from l4Off to
//     the end of the payload) a full checksum is computed and stored;
//     otherwise (a first fragment) it stays 0. A checksum is never stored
//     as 0.
//   - ICMPv6: only the address changes, and its checksum is updated; port
//     is ignored and the echo identifier is never touched. Other protocols:
//     only the address changes.
//   - A Routing header with Segments Left > 0 puts the final destination,
//     which the pseudo-header uses, inside the Routing header; RewriteIPv6
//     cannot see that and would update the checksum for a destination
//     change. Use RewriteIPv6Packet, which handles it.
//
// It returns ip.Check()'s error, ErrOffset when l4Off is not within
// [40, 40+PayloadLength], or ErrTruncated when the rest of the payload is
// shorter than the TCP (20), UDP (8) or ICMPv6 (8) header. On error ip is
// left unchanged.
func RewriteIPv6(ip IPv6, l4Off int, proto uint8, side Side, addr [16]byte, port uint16) error {
	return rewriteIPv6(ip, l4Off, proto, side, addr, port, false)
}

// RewriteIPv6Packet is RewriteIPv6 for callers that have not walked the
// extension headers: it calls TransportHeader, skips the transport header
// of non-first fragments, and when a Routing header with Segments Left > 0
// is present and side is SideDst, changes the destination without touching
// the transport checksum (the pseudo-header's final destination has not
// changed); a zero UDP checksum then stays zero. It returns ip.Check()'s
// error, TransportHeader's, or RewriteIPv6's.
func RewriteIPv6Packet(ip IPv6, side Side, addr [16]byte, port uint16) error {
	if err := ip.Check(); err != nil {
		return err
	}
	proto, off, frag, routed, err := ip.walk(false)
	if err != nil {
		return err
	}
	if frag.NonFirst() {
		off = -1
	}
	return rewriteIPv6(ip, off, proto, side, addr, port, routed)
}

// rewriteIPv6 implements RewriteIPv6. routed says a Routing header with
// Segments Left > 0 holds the final destination used by the pseudo-header.
func rewriteIPv6(ip IPv6, l4Off int, proto uint8, side Side, addr [16]byte, port uint16, routed bool) error {
	if err := ip.Check(); err != nil {
		return err
	}
	var l4 []byte
	if l4Off < 0 {
		proto = ProtoNoNext // nothing to rewrite past the address
	} else {
		end := IPv6Size + int(ip.PayloadLength())
		if l4Off < IPv6Size || l4Off > end {
			return ErrOffset
		}
		l4 = ip[l4Off:end]
		min := 0
		switch proto {
		case ProtoTCP:
			min = TCPMinSize
		case ProtoUDP:
			min = UDPSize
		case ProtoICMPv6:
			min = ICMPv6MinSize
		}
		if len(l4) < min {
			return ErrTruncated
		}
	}
	off := ipv6Src
	if side == SideDst {
		off = ipv6Dst
	}
	f := ip[off : off+ipv6AddressSize]
	old := [16]byte(f)
	copy(f, addr[:])
	if routed && side == SideDst {
		// The pseudo-header's destination did not change: only ports.
		old = addr
	}
	switch proto {
	case ProtoTCP:
		t := TCP(l4)
		t.UpdateChecksumPseudoHeaderAddress(old[:], addr[:])
		if side == SideDst {
			t.SetDstPortWithChecksumUpdate(port)
		} else {
			t.SetSrcPortWithChecksumUpdate(port)
		}
	case ProtoUDP:
		u := UDP(l4)
		if u.Checksum() == 0 {
			if side == SideDst {
				u.SetDstPort(port)
			} else {
				u.SetSrcPort(port)
			}
			// Invalid over IPv6: compute one if the datagram is whole
			// and the pseudo-header's destination is ip.Dst.
			if int(u.Length()) == len(l4) && !routed {
				u.SetChecksum(u.CalculateChecksum(PseudoHeaderChecksum(ProtoUDP, ip.SrcSlice(), ip.DstSlice(), uint16(len(l4)))))
			}
			break
		}
		u.UpdateChecksumPseudoHeaderAddress(old[:], addr[:])
		if side == SideDst {
			u.SetDstPortWithChecksumUpdate(port)
		} else {
			u.SetSrcPortWithChecksumUpdate(port)
		}
	case ProtoICMPv6:
		ICMPv6(l4).UpdateChecksumPseudoHeaderAddress(old[:], addr[:])
	}
	return nil
}
