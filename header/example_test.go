package header_test

import (
	"fmt"
	"net/netip"

	"github.com/xdplb/xdplb/header"
)

// exampleFrame returns an Ethernet/IPv4/TCP SYN from 198.18.0.1:40000 to
// the VIP 198.18.0.100:80, with correct checksums.
func exampleFrame() []byte {
	frame := make([]byte, header.EthernetSize+header.IPv4MinSize+header.TCPMinSize)
	header.Ethernet(frame).Encode(header.MAC{2, 0, 0, 0, 0, 2}, header.MAC{2, 0, 0, 0, 0, 1}, header.EtherTypeIPv4)
	ip := header.IPv4(frame[header.EthernetSize:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: header.IPv4MinSize + header.TCPMinSize, TTL: 64, Protocol: header.ProtoTCP,
		Src: [4]byte{198, 18, 0, 1}, Dst: [4]byte{198, 18, 0, 100},
	})
	tcp := header.TCP(ip.Payload())
	tcp.SetSrcPort(40000)
	tcp.SetDstPort(80)
	tcp.SetDataOffset(header.TCPMinSize)
	tcp.SetFlags(header.TCPFlagSyn)
	tcp.SetChecksum(tcp.CalculateChecksum(header.PseudoHeaderChecksum(header.ProtoTCP, ip.SrcSlice(), ip.DstSlice(), uint16(len(tcp)))))
	return frame
}

// Parse a frame layer by layer, then NAT its destination VIP:80 to a
// backend DIP:8080, as the Host Agent does. RewriteIPv4 keeps the IP and
// TCP checksums right without recomputing them.
func Example() {
	frame := exampleFrame()

	etherType, l3, err := header.ParseEthernet(frame)
	if err != nil || etherType != header.EtherTypeIPv4 {
		return // count a drop reason
	}
	ip := header.IPv4(frame[l3:])
	if err := ip.Check(); err != nil {
		return
	}
	tcp := header.TCP(ip.Payload())
	if ip.Protocol() != header.ProtoTCP || tcp.Check() != nil {
		return
	}
	fmt.Printf("%v:%d -> %v:%d syn=%v\n",
		netip.AddrFrom4(ip.Src()), tcp.SrcPort(), netip.AddrFrom4(ip.Dst()), tcp.DstPort(),
		tcp.Flags()&header.TCPFlagSyn != 0)

	dip := netip.MustParseAddr("198.19.0.7")
	if err := header.RewriteIPv4(ip, header.SideDst, dip.As4(), 8080); err != nil {
		return
	}
	pseudo := header.PseudoHeaderChecksum(header.ProtoTCP, ip.SrcSlice(), ip.DstSlice(), uint16(len(tcp)))
	fmt.Printf("%v:%d -> %v:%d ip csum ok=%v tcp csum ok=%v\n",
		netip.AddrFrom4(ip.Src()), tcp.SrcPort(), netip.AddrFrom4(ip.Dst()), tcp.DstPort(),
		ip.IsChecksumValid(), tcp.IsChecksumValid(pseudo))
	// Output:
	// 198.18.0.1:40000 -> 198.18.0.100:80 syn=true
	// 198.18.0.1:40000 -> 198.19.0.7:8080 ip csum ok=true tcp csum ok=true
}

// Walk an IPv6 extension header chain to the transport header.
func ExampleIPv6_TransportHeader() {
	pkt := make([]byte, header.IPv6Size+8+8+header.UDPSize)
	ip := header.IPv6(pkt)
	ip.Encode(&header.IPv6Fields{
		PayloadLength: uint16(len(pkt) - header.IPv6Size), NextHeader: header.ProtoHopByHop, HopLimit: 64,
		Src: netip.MustParseAddr("2001:db8::1").As16(), Dst: netip.MustParseAddr("2001:db8::2").As16(),
	})
	pkt[40] = header.ProtoFragment // Hop-by-Hop: next header, length 0 (8 bytes)
	pkt[48] = header.ProtoUDP      // Fragment: next header, offset 0, M set
	pkt[51] = 1

	proto, off, frag, err := ip.TransportHeader()
	fmt.Println(proto, off, frag.Present, frag.More, frag.NonFirst(), err)
	// Output: 17 56 true true false <nil>
}

// Checksum returns the folded sum; a checksum field stores its complement,
// and a correct region sums to 0xFFFF.
func ExampleChecksum() {
	// RFC 1071 section 3 example.
	b := []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}
	fmt.Printf("%#04x\n", header.Checksum(b, 0))

	// Incremental update when the word 0xf203 becomes 0x1234 (RFC 1624).
	stored := ^header.Checksum(b, 0)
	updated := header.ChecksumUpdate16(stored, 0xf203, 0x1234)
	b[2], b[3] = 0x12, 0x34
	fmt.Println(updated == ^header.Checksum(b, 0))
	// Output:
	// 0xddf2
	// true
}

// Build a VXLAN header and read it back.
func ExampleVXLAN() {
	v := header.VXLAN(make([]byte, header.VXLANSize))
	v.Encode(0xabcdef)
	fmt.Println(v.Check(), v.VNI() == 0xabcdef, v.Flags() == header.VXLANFlagVNI)
	// Output: <nil> true true
}
