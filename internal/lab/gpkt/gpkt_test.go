package gpkt_test

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// TestChecksumRFC1071 checks Sum and Checksum against the worked example
// of RFC 1071 section 3 and against gopacket's IPv4 header checksum.
func TestChecksumRFC1071(t *testing.T) {
	// RFC 1071 3: the bytes 00 01 f2 03 f4 f5 f6 f7 sum to ddf2.
	require.Equal(t, uint16(0xddf2), gpkt.Sum([]byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}, 0))
	require.Equal(t, uint16(0x220d), gpkt.Checksum([]byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}))
	// An odd length pads with zero on the right.
	require.Equal(t, gpkt.Sum([]byte{0xab, 0xcd, 0xef, 0x00}, 0), gpkt.Sum([]byte{0xab, 0xcd, 0xef}, 0))

	f := gpkt.Serialize(t, &layers.IPv4{Version: 4, TTL: 9, Protocol: layers.IPProtocolUDP,
		SrcIP: net.IP{198, 18, 0, 1}, DstIP: net.IP{198, 18, 0, 2}})
	require.Zero(t, gpkt.Checksum(f[:20]), "gopacket's header checksum verifies")
	stored := binary.BigEndian.Uint16(f[10:])
	f[10], f[11] = 0, 0
	require.Equal(t, stored, gpkt.Checksum(f[:20]))
}

// TestSerializeWiresPseudoHeader: a transport layer after an IP layer gets
// its pseudo-header checksum without the caller wiring it.
func TestSerializeWiresPseudoHeader(t *testing.T) {
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
		SrcIP: net.ParseIP("2001:db8::1"), DstIP: net.ParseIP("2001:db8::2")}
	f := gpkt.Serialize(t, ip, &layers.UDP{SrcPort: 1, DstPort: 2}, gopacket.Payload("x"))
	pkt := gopacket.NewPacket(f, layers.LayerTypeIPv6, gopacket.Default)
	u := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	require.NotZero(t, u.Checksum)
	// Recomputed over the pseudo-header and the datagram, it verifies.
	pseudo := append(append(append([]byte(nil), ip.SrcIP...), ip.DstIP...), 0, 0, 0, byte(len(f)-40), 0, 0, 0, 17)
	require.Zero(t, gpkt.Checksum(append(pseudo, f[40:]...)))
}

// TestMustSerialize: the same bytes as Serialize, and a panic where
// Serialize fails the test.
func TestMustSerialize(t *testing.T) {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP,
		SrcIP: net.IP{198, 18, 0, 1}, DstIP: net.IP{198, 18, 0, 2}}
	ls := []gopacket.SerializableLayer{ip, &layers.UDP{SrcPort: 1, DstPort: 2}, gopacket.Payload("x")}
	require.Equal(t, gpkt.Serialize(t, ls...), gpkt.MustSerialize(ls...))
	bad := &layers.IPv4{Version: 4, SrcIP: net.IP{198, 18, 0, 1}, DstIP: net.IP{1, 2, 3}} // a 3-byte address
	require.Panics(t, func() { gpkt.MustSerialize(bad) })
}
