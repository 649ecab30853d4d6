// Package gpkt builds and checks packets for tests with gopacket, the
// library's independent oracle: frames serialised with every length and
// checksum computed by gopacket, and a plain RFC 1071 checksum that shares
// no code with package header's optimised one.
package gpkt

import (
	"fmt"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Serialize serialises ls with gopacket, lengths and checksums computed
// (FixLengths, ComputeChecksums), and returns a copy of the bytes. A TCP,
// UDP or ICMPv6 layer takes the IPv4 or IPv6 layer before it for its
// pseudo-header checksum. A failure fails the test.
func Serialize(tb testing.TB, ls ...gopacket.SerializableLayer) []byte {
	tb.Helper()
	b, err := serialize(ls)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// MustSerialize is Serialize for frame builders that have no testing.TB
// (table entries, benchmark fixtures): it panics on a failure.
func MustSerialize(ls ...gopacket.SerializableLayer) []byte {
	b, err := serialize(ls)
	if err != nil {
		panic(err)
	}
	return b
}

func serialize(ls []gopacket.SerializableLayer) ([]byte, error) {
	var nl gopacket.NetworkLayer
	for _, l := range ls {
		var err error
		switch l := l.(type) {
		case *layers.IPv4:
			nl = l
		case *layers.IPv6:
			nl = l
		case *layers.TCP:
			err = setNetworkLayer(l, nl)
		case *layers.UDP:
			err = setNetworkLayer(l, nl)
		case *layers.ICMPv6:
			err = setNetworkLayer(l, nl)
		}
		if err != nil {
			return nil, err
		}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil, fmt.Errorf("gpkt: serialising %d layers: %w", len(ls), err)
	}
	return append([]byte(nil), buf.Bytes()...), nil
}

// checksummer is a layer whose checksum covers a pseudo-header.
type checksummer interface {
	SetNetworkLayerForChecksum(gopacket.NetworkLayer) error
}

func setNetworkLayer(l checksummer, nl gopacket.NetworkLayer) error {
	if nl == nil {
		return nil // no IP layer before it: the caller set one, or gopacket says so
	}
	if err := l.SetNetworkLayerForChecksum(nl); err != nil {
		return fmt.Errorf("gpkt: %w", err)
	}
	return nil
}

// Sum is the one's-complement sum of b (RFC 1071) added to initial, folded
// to 16 bits and not complemented: 16-bit big-endian words one at a time,
// an odd last byte padded with zero on the right.
func Sum(b []byte, initial uint16) uint16 {
	s := uint64(initial)
	for i := 0; i+1 < len(b); i += 2 {
		s += uint64(b[i])<<8 | uint64(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint64(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

// Checksum is the Internet checksum of b: the value to store in a zeroed
// checksum field, and 0 over data that includes a right checksum.
func Checksum(b []byte) uint16 { return ^Sum(b, 0) }
