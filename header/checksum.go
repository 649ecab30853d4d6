package header

import (
	"encoding/binary"
	"math/bits"
)

// Checksum returns the 16-bit one's-complement sum (RFC 1071) of b, added to
// initial, folded to 16 bits and NOT complemented. To fill in a checksum
// field, store ^Checksum(...) over the covered bytes with the field itself
// left out or zeroed; a region whose stored checksum is right sums to 0xFFFF.
//
// b may have any length and start at any address. An odd final byte is
// padded with a zero byte on the right, as RFC 1071 says. Partial sums
// compose: Checksum(b[n:], Checksum(b[:n], x)) == Checksum(b, x) for every
// even n.
//
// The loop adds 64-bit little-endian words with carry (plain loads on
// little-endian machines, no byte swaps; one ADC per 8 bytes on amd64),
// eight words per iteration. The
// one's-complement sum does not depend on byte order (RFC 1071 section
// 2(B)): summing in the swapped order gives the swapped result, so one swap of
// the folded 16-bit value at the end yields the network-order sum.
func Checksum(b []byte, initial uint16) uint16 {
	// Work in the byte-swapped domain: swap initial in, swap the result out.
	s := uint64(bits.ReverseBytes16(initial))
	var c uint64
	for len(b) >= 64 {
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[0:8]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[8:16]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[16:24]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[24:32]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[32:40]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[40:48]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[48:56]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[56:64]), c)
		b = b[64:]
	}
	if len(b) >= 32 {
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[0:8]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[8:16]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[16:24]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[24:32]), c)
		b = b[32:]
	}
	for len(b) >= 8 {
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[0:8]), c)
		b = b[8:]
	}
	if len(b) >= 4 {
		s, c = bits.Add64(s, uint64(binary.LittleEndian.Uint32(b[0:4])), c)
		b = b[4:]
	}
	if len(b) >= 2 {
		s, c = bits.Add64(s, uint64(binary.LittleEndian.Uint16(b[0:2])), c)
		b = b[2:]
	}
	if len(b) == 1 {
		// The lone byte is the high byte of a zero-padded big-endian
		// word, which is the low byte in the swapped domain.
		s, c = bits.Add64(s, uint64(b[0]), c)
	}
	// End-around carry. If the final carry is set, s has wrapped and is
	// small, so adding it cannot carry again.
	s, c = bits.Add64(s, 0, c)
	s += c
	return bits.ReverseBytes16(fold64(s))
}

// fold64 folds a 64-bit one's-complement accumulator to 16 bits with
// end-around carries. The result is 0 only when s is 0.
func fold64(s uint64) uint16 {
	s = (s >> 32) + (s & 0xffffffff) // < 1<<33
	s = (s >> 16) + (s & 0xffff)     // < 0x30000
	s = (s >> 16) + (s & 0xffff)     // <= 0x10001
	s = (s >> 16) + (s & 0xffff)     // <= 0xffff
	return uint16(s)
}

// fold32 folds a 32-bit one's-complement accumulator to 16 bits.
func fold32(s uint32) uint16 {
	s = (s >> 16) + (s & 0xffff)
	s = (s >> 16) + (s & 0xffff)
	return uint16(s)
}

// ChecksumCombine adds two folded one's-complement sums (end-around carry).
// Neither input nor the result is complemented.
func ChecksumCombine(a, b uint16) uint16 {
	return fold32(uint32(a) + uint32(b))
}

// PseudoHeaderChecksum returns the folded (not complemented) sum of the
// TCP/UDP/ICMPv6 pseudo-header: source and destination addresses (both 4
// bytes for IPv4, RFC 793/768, or both 16 bytes for IPv6, RFC 8200 section
// 8.1), the protocol number and the upper-layer length. For IPv6 the 32-bit
// length field is summed as its low 16 bits, which is exact for any payload
// that is not a jumbogram. Pass the result as the pseudo argument of
// UDP.CalculateChecksum, TCP.CalculateChecksum or ICMPv6.CalculateChecksum.
func PseudoHeaderChecksum(proto uint8, src, dst []byte, length uint16) uint16 {
	s := uint64(proto) + uint64(length)
	if len(src) == 4 && len(dst) == 4 {
		// IPv4, the common case: two 32-bit loads, whose halves the
		// fold adds.
		s += uint64(binary.BigEndian.Uint32(src)) + uint64(binary.BigEndian.Uint32(dst))
		return fold64(s)
	}
	for i := 0; i+1 < len(src); i += 2 {
		s += uint64(src[i])<<8 | uint64(src[i+1])
	}
	for i := 0; i+1 < len(dst); i += 2 {
		s += uint64(dst[i])<<8 | uint64(dst[i+1])
	}
	return fold64(s)
}

// ChecksumUpdate16 returns the checksum field that results when one aligned
// 16-bit word covered by it changes from old to new. check is the value
// stored in the field (already complemented), and so is the result.
//
// It implements RFC 1624, section 3, eqn. 3:
//
//	HC' = ~(~HC + ~m + m')
//
// where HC is the old checksum field, m the old value of the word and m' the
// new one. When the covered data is not all zero the result is exactly what a
// full recomputation would store; eqn. 2 (HC' = HC - ~m - m') can instead
// produce 0xFFFF (-0) where a recomputation gives 0x0000.
func ChecksumUpdate16(check, old, new uint16) uint16 {
	return ^fold32(uint32(^check) + uint32(^old) + uint32(new))
}

// ChecksumUpdate is ChecksumUpdate16 for a run of words: the covered bytes
// old (at an even offset in the checksummed data) become new. old and new
// must have the same even length (addresses: 4 or 16 bytes); it panics when
// new is shorter than old. Eqn. 3 of RFC 1624 (see ChecksumUpdate16) is
// applied to the whole run at once:
//
//	HC' = ~(~HC + ~m1 + ... + ~mk + m1' + ... + mk')
func ChecksumUpdate(check uint16, old, new []byte) uint16 {
	new = new[:len(old)]
	s := uint64(^check)
	for i := 0; i+1 < len(old); i += 2 {
		o := uint16(old[i])<<8 | uint16(old[i+1])
		n := uint16(new[i])<<8 | uint16(new[i+1])
		s += uint64(^o) + uint64(n)
	}
	return ^fold64(s)
}
