package engine_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// Tests of the parse stage (Parse, ParsePacket): golden frames built with
// gopacket, a differential fuzz target with gopacket as the oracle, and an
// allocation guard. Run the fuzzer with
// `go test -run '^$' -fuzz '^FuzzParse$' -fuzztime 60s ./engine/`.

// parseVNI is the VNI every test parses with: the key must carry it.
const parseVNI = 0x5eed42

var (
	pMACa = net.HardwareAddr{0x02, 0, 0x5e, 0, 0, 0x0a}
	pMACb = net.HardwareAddr{0x02, 0, 0x5e, 0, 0, 0x0b}
	p4Src = net.IP{198, 18, 0, 1}
	p4Dst = net.IP{198, 19, 255, 254}
	p6Src = net.ParseIP("2001:db8::1")
	p6Dst = net.ParseIP("2001:db8:ffff::2")
)

func gpEth(t layers.EthernetType) *layers.Ethernet {
	return &layers.Ethernet{SrcMAC: pMACa, DstMAC: pMACb, EthernetType: t}
}

func gpIPv4(proto layers.IPProtocol) *layers.IPv4 {
	return &layers.IPv4{Version: 4, TTL: 64, Id: 0x1234, Protocol: proto, SrcIP: p4Src, DstIP: p4Dst}
}

func gpIPv6(next layers.IPProtocol) *layers.IPv6 {
	return &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: next, SrcIP: p6Src, DstIP: p6Dst}
}

func gpTCP(nl gopacket.NetworkLayer, sport, dport uint16) *layers.TCP {
	t := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: 1000, SYN: true, Window: 65535}
	_ = t.SetNetworkLayerForChecksum(nl)
	return t
}

func gpUDP(nl gopacket.NetworkLayer, sport, dport uint16) *layers.UDP {
	u := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
	_ = u.SetNetworkLayerForChecksum(nl)
	return u
}

// udpDatagram returns a whole UDP datagram (header, checksum over nl's
// pseudo-header, n bytes of data), to be cut into fragments.
func udpDatagram(tb testing.TB, nl gopacket.NetworkLayer, sport, dport uint16, n int) []byte {
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i)
	}
	return gpkt.Serialize(tb, gpUDP(nl, sport, dport), gopacket.Payload(data))
}

// ipv6Ext returns an 8-byte IPv6 extension header (Hop-by-Hop, Routing or
// Destination Options shape: Next Header, Hdr Ext Len 0, 6 bytes of PadN).
func ipv6Ext(next layers.IPProtocol) []byte {
	return []byte{byte(next), 0, 1, 4, 0, 0, 0, 0}
}

// ipv6Routing returns an 8-byte Routing header of type 0 with no
// segments left (RFC 5095: ignored), the only type gopacket decodes.
func ipv6Routing(next layers.IPProtocol) []byte {
	return []byte{byte(next), 0, 0, 0, 0, 0, 0, 0}
}

// ipv6Frag returns an IPv6 Fragment header; offset is in bytes.
func ipv6Frag(next layers.IPProtocol, offset int, more bool) []byte {
	h := make([]byte, 8)
	h[0] = byte(next)
	fo := uint16(offset)
	if more {
		fo |= 1
	}
	binary.BigEndian.PutUint16(h[2:], fo)
	binary.BigEndian.PutUint32(h[4:], 0xcafe)
	return h
}

// patched returns a copy of f changed by fn.
func patched(f []byte, fn func(f []byte)) []byte {
	f = slices.Clone(f)
	fn(f)
	return f
}

// parseCase is one golden frame and what ParsePacket must make of it.
// For accepted frames the hand-written fields are checked, and every field
// is checked again against gopacket's decoding of the same bytes.
type parseCase struct {
	name   string
	frame  []byte
	reason engine.DropReason // 0: accepted

	flags        uint16
	etherType    uint16
	l3, l4       uint16 // l4 when flags has FlagL4
	proto        uint8
	sport, dport uint16
}

const (
	fV4  = engine.FlagIPv4
	fV6  = engine.FlagIPv6
	fL4  = engine.FlagL4
	fFr  = engine.FlagFragment
	fNFF = engine.FlagNonFirstFrag
)

// goldenParseCases builds the golden frames. They are also FuzzParse's
// seeds and the batch of the allocation guard.
func goldenParseCases(tb testing.TB) []parseCase {
	tb.Helper()
	var cs []parseCase
	add := func(c parseCase) { cs = append(cs, c) }
	drop := func(name string, f []byte, r engine.DropReason) {
		add(parseCase{name: name, frame: f, reason: r})
	}
	payload := gopacket.Payload("hello")

	// IPv4.
	ip := gpIPv4(layers.IPProtocolTCP)
	v4tcp := gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv4), ip, gpTCP(ip, 40000, 80), payload)
	add(parseCase{name: "ipv4 tcp", frame: v4tcp, flags: fV4 | fL4, etherType: 0x0800, l3: 14, l4: 34, proto: 6, sport: 40000, dport: 80})

	ip = gpIPv4(layers.IPProtocolUDP)
	v4udp := gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv4), ip, gpUDP(ip, 1000, 53), payload)
	add(parseCase{name: "ipv4 udp", frame: v4udp, flags: fV4 | fL4, etherType: 0x0800, l3: 14, l4: 34, proto: 17, sport: 1000, dport: 53})

	ip = gpIPv4(layers.IPProtocolICMPv4)
	v4icmp := gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv4), ip,
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 7, Seq: 1}, payload)
	add(parseCase{name: "ipv4 icmp echo", frame: v4icmp, flags: fV4 | fL4, etherType: 0x0800, l3: 14, l4: 34, proto: 1})

	ip = gpIPv4(layers.IPProtocolTCP)
	ip.Options = []layers.IPv4Option{{OptionType: 0x94, OptionLength: 4, OptionData: []byte{0, 0}}} // Router Alert
	add(parseCase{name: "ipv4 options tcp", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv4), ip, gpTCP(ip, 40001, 443), payload),
		flags: fV4 | fL4, etherType: 0x0800, l3: 14, l4: 38, proto: 6, sport: 40001, dport: 443})

	ip = gpIPv4(layers.IPProtocolUDP)
	add(parseCase{name: "ipv4 bad header checksum is not checked", frame: patched(v4udp, func(f []byte) { f[14+10] ^= 0xff }),
		flags: fV4 | fL4, etherType: 0x0800, l3: 14, l4: 34, proto: 17, sport: 1000, dport: 53})

	// VLAN tags.
	ip = gpIPv4(layers.IPProtocolUDP)
	vlan := gpkt.Serialize(tb, gpEth(layers.EthernetTypeDot1Q), &layers.Dot1Q{VLANIdentifier: 100, Type: layers.EthernetTypeIPv4},
		ip, gpUDP(ip, 1001, 53), payload)
	add(parseCase{name: "802.1Q ipv4 udp", frame: vlan, flags: fV4 | fL4, etherType: 0x0800, l3: 18, l4: 38, proto: 17, sport: 1001, dport: 53})

	ip = gpIPv4(layers.IPProtocolTCP)
	add(parseCase{name: "802.1ad+802.1Q (QinQ) ipv4 tcp", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeQinQ),
		&layers.Dot1Q{VLANIdentifier: 10, Type: layers.EthernetTypeDot1Q},
		&layers.Dot1Q{VLANIdentifier: 100, Type: layers.EthernetTypeIPv4}, ip, gpTCP(ip, 40002, 80), payload),
		flags: fV4 | fL4, etherType: 0x0800, l3: 22, l4: 42, proto: 6, sport: 40002, dport: 80})

	ip6 := gpIPv6(layers.IPProtocolTCP)
	add(parseCase{name: "802.1Q ipv6 tcp", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeDot1Q),
		&layers.Dot1Q{VLANIdentifier: 7, Type: layers.EthernetTypeIPv6}, ip6, gpTCP(ip6, 40003, 80), payload),
		flags: fV6 | fL4, etherType: 0x86dd, l3: 18, l4: 58, proto: 6, sport: 40003, dport: 80})

	ip = gpIPv4(layers.IPProtocolUDP)
	drop("three VLAN tags", gpkt.Serialize(tb, gpEth(layers.EthernetTypeDot1Q),
		&layers.Dot1Q{VLANIdentifier: 1, Type: layers.EthernetTypeDot1Q},
		&layers.Dot1Q{VLANIdentifier: 2, Type: layers.EthernetTypeDot1Q},
		&layers.Dot1Q{VLANIdentifier: 3, Type: layers.EthernetTypeIPv4}, ip, gpUDP(ip, 1, 2), payload), engine.DropBadL2)

	// IPv6.
	ip6 = gpIPv6(layers.IPProtocolTCP)
	v6tcp := gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6, gpTCP(ip6, 40004, 80), payload)
	add(parseCase{name: "ipv6 tcp", frame: v6tcp, flags: fV6 | fL4, etherType: 0x86dd, l3: 14, l4: 54, proto: 6, sport: 40004, dport: 80})

	ip6 = gpIPv6(layers.IPProtocolUDP)
	v6udp := gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6, gpUDP(ip6, 1002, 53), payload)
	add(parseCase{name: "ipv6 udp", frame: v6udp, flags: fV6 | fL4, etherType: 0x86dd, l3: 14, l4: 54, proto: 17, sport: 1002, dport: 53})

	ip6 = gpIPv6(layers.IPProtocolICMPv6)
	icmp6 := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)}
	_ = icmp6.SetNetworkLayerForChecksum(ip6)
	add(parseCase{name: "icmpv6 echo", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6, icmp6,
		&layers.ICMPv6Echo{Identifier: 7, SeqNumber: 1}, payload),
		flags: fV6 | fL4, etherType: 0x86dd, l3: 14, l4: 54, proto: 58})

	ip6 = gpIPv6(layers.IPProtocolIPv6HopByHop)
	ip6.HopByHop = &layers.IPv6HopByHop{Options: []*layers.IPv6HopByHopOption{
		{OptionType: 5, OptionLength: 2, OptionData: []byte{0, 0}, OptionAlignment: [2]uint8{2, 0}}, // Router Alert
		{OptionType: 1, OptionData: []byte{}},                                                       // PadN to 8 bytes
	}}
	ip6.HopByHop.NextHeader = layers.IPProtocolUDP
	add(parseCase{name: "ipv6 hop-by-hop udp", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6, gpUDP(ip6, 1003, 53), payload),
		flags: fV6 | fL4, etherType: 0x86dd, l3: 14, l4: 62, proto: 17, sport: 1003, dport: 53})

	ip6 = gpIPv6(layers.IPProtocolIPv6HopByHop)
	add(parseCase{name: "ipv6 hop-by-hop, routing, destination options tcp", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6,
		gopacket.Payload(slices.Concat(ipv6Ext(layers.IPProtocolIPv6Routing), ipv6Routing(layers.IPProtocolIPv6Destination), ipv6Ext(layers.IPProtocolTCP))),
		gpTCP(ip6, 40005, 22), payload),
		flags: fV6 | fL4, etherType: 0x86dd, l3: 14, l4: 78, proto: 6, sport: 40005, dport: 22})

	ip6 = gpIPv6(layers.IPProtocolIPv6Destination)
	drop("ipv6 hop-by-hop not first", gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6,
		gopacket.Payload(slices.Concat(ipv6Ext(layers.IPProtocolIPv6HopByHop), ipv6Ext(layers.IPProtocolUDP))),
		gpUDP(ip6, 1, 2), payload), engine.DropBadIPv6)

	ip6 = gpIPv6(layers.IPProtocolIPv6Destination)
	drop("ipv6 extension header past the payload", gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6,
		gopacket.Payload(patched(ipv6Ext(layers.IPProtocolUDP), func(h []byte) { h[1] = 10 })),
		gpUDP(ip6, 1, 2), payload), engine.DropBadIPv6)

	// Fragments, cut from one whole datagram.
	ip = gpIPv4(layers.IPProtocolUDP)
	dg4 := udpDatagram(tb, ip, 1004, 53, 200)
	ip = gpIPv4(layers.IPProtocolUDP)
	ip.Flags = layers.IPv4MoreFragments
	add(parseCase{name: "ipv4 first fragment udp", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv4), ip, gopacket.Payload(dg4[:64])),
		flags: fV4 | fFr | fL4, etherType: 0x0800, l3: 14, l4: 34, proto: 17, sport: 1004, dport: 53})
	ip = gpIPv4(layers.IPProtocolUDP)
	ip.FragOffset = 64 / 8
	add(parseCase{name: "ipv4 last fragment udp", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv4), ip, gopacket.Payload(dg4[64:])),
		flags: fV4 | fFr | fNFF, etherType: 0x0800, l3: 14, proto: 17})
	ip = gpIPv4(layers.IPProtocolUDP)
	ip.Flags = layers.IPv4MoreFragments
	ip.FragOffset = 1
	add(parseCase{name: "ipv4 fragment at offset 8, 8 bytes", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv4), ip, gopacket.Payload(dg4[8:16])),
		flags: fV4 | fFr | fNFF, etherType: 0x0800, l3: 14, proto: 17})
	ip = gpIPv4(layers.IPProtocolTCP)
	ip.Flags = layers.IPv4MoreFragments
	drop("ipv4 first fragment, tcp header cut", gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv4), ip, gopacket.Payload(v4tcp[34:34+16])), engine.DropBadL4)

	ip6 = gpIPv6(layers.IPProtocolUDP)
	dg6 := udpDatagram(tb, ip6, 1005, 53, 200)
	ip6 = gpIPv6(layers.IPProtocolIPv6Fragment)
	add(parseCase{name: "ipv6 first fragment udp", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6,
		gopacket.Payload(slices.Concat(ipv6Frag(layers.IPProtocolUDP, 0, true), dg6[:64]))),
		flags: fV6 | fFr | fL4, etherType: 0x86dd, l3: 14, l4: 62, proto: 17, sport: 1005, dport: 53})
	ip6 = gpIPv6(layers.IPProtocolIPv6Fragment)
	add(parseCase{name: "ipv6 last fragment udp", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6,
		gopacket.Payload(slices.Concat(ipv6Frag(layers.IPProtocolUDP, 64, false), dg6[64:]))),
		flags: fV6 | fFr | fNFF, etherType: 0x86dd, l3: 14, proto: 17})
	ip6 = gpIPv6(layers.IPProtocolIPv6Fragment)
	add(parseCase{name: "ipv6 fragment at offset 8, 8 bytes of tcp", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6,
		gopacket.Payload(slices.Concat(ipv6Frag(layers.IPProtocolTCP, 8, true), v6tcp[54+8:54+16]))),
		flags: fV6 | fFr | fNFF, etherType: 0x86dd, l3: 14, proto: 6})
	ip6 = gpIPv6(layers.IPProtocolIPv6HopByHop)
	add(parseCase{name: "ipv6 hop-by-hop, first fragment, destination options, udp", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6,
		gopacket.Payload(slices.Concat(ipv6Ext(layers.IPProtocolIPv6Fragment), ipv6Frag(layers.IPProtocolIPv6Destination, 0, true),
			ipv6Ext(layers.IPProtocolUDP), dg6[:64]))),
		flags: fV6 | fFr | fL4, etherType: 0x86dd, l3: 14, l4: 78, proto: 17, sport: 1005, dport: 53})
	ip6 = gpIPv6(layers.IPProtocolIPv6Fragment)
	drop("ipv6 two fragment headers", gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6,
		gopacket.Payload(slices.Concat(ipv6Frag(layers.IPProtocolIPv6Fragment, 0, true), ipv6Frag(layers.IPProtocolUDP, 0, true), dg6[:64]))),
		engine.DropBadIPv6)
	// An atomic fragment (offset 0, M clear; RFC 6946) is a whole datagram
	// with a Fragment header: not a fragment, and its UDP Length is checked.
	ip6 = gpIPv6(layers.IPProtocolIPv6Fragment)
	atomic := gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6,
		gopacket.Payload(slices.Concat(ipv6Frag(layers.IPProtocolUDP, 0, false), dg6)))
	add(parseCase{name: "ipv6 atomic fragment udp", frame: atomic,
		flags: fV6 | fL4, etherType: 0x86dd, l3: 14, l4: 62, proto: 17, sport: 1005, dport: 53})
	drop("ipv6 atomic fragment, udp length past the payload", patched(atomic, func(f []byte) {
		binary.BigEndian.PutUint16(f[62+4:], uint16(len(dg6)+1))
	}), engine.DropBadL4)

	// Other protocols.
	ip = gpIPv4(layers.IPProtocolGRE)
	inner := gpIPv4(layers.IPProtocolUDP)
	add(parseCase{name: "ipv4 gre (no l4 parsed)", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv4), ip,
		&layers.GRE{Protocol: layers.EthernetTypeIPv4}, inner, gpUDP(inner, 5, 6), payload),
		flags: fV4, etherType: 0x0800, l3: 14, proto: 47})
	ip6 = gpIPv6(layers.IPProtocolNoNextHeader)
	add(parseCase{name: "ipv6 no next header, empty payload", frame: gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv6), ip6),
		flags: fV6, etherType: 0x86dd, l3: 14, proto: 59})
	drop("arp", gpkt.Serialize(tb, gpEth(layers.EthernetTypeARP), &layers.ARP{
		AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
		Operation: layers.ARPRequest, SourceHwAddress: pMACa, SourceProtAddress: p4Src.To4(),
		DstHwAddress: make([]byte, 6), DstProtAddress: p4Dst.To4(),
	}), engine.DropNotIP)

	// Truncated frames.
	drop("empty frame", []byte{}, engine.DropTruncated)
	drop("runt, 13 bytes", v4tcp[:13], engine.DropTruncated)
	drop("cut in the VLAN tag", vlan[:16], engine.DropTruncated)
	drop("cut in the ipv4 header", v4tcp[:14+12], engine.DropTruncated)
	drop("cut in the ipv4 options", patched(v4tcp[:14+22], func(f []byte) { f[14] = 0x46 }), engine.DropTruncated)
	drop("ipv4 total length past the frame", v4tcp[:14+20+10], engine.DropTruncated)
	drop("cut in the ipv6 header", v6tcp[:14+39], engine.DropTruncated)
	drop("ipv6 payload length past the frame", v6tcp[:len(v6tcp)-1], engine.DropTruncated)

	// Malformed headers.
	drop("ipv4 IHL 4", patched(v4tcp, func(f []byte) { f[14] = 0x44 }), engine.DropBadIPv4)
	drop("ipv4 version 6", patched(v4tcp, func(f []byte) { f[14] = 0x65 }), engine.DropBadIPv4)
	drop("ipv4 total length below the header", patched(v4tcp, func(f []byte) { binary.BigEndian.PutUint16(f[16:], 19) }), engine.DropBadIPv4)
	drop("ipv4 total length 0", patched(v4tcp, func(f []byte) { binary.BigEndian.PutUint16(f[16:], 0) }), engine.DropBadIPv4)
	drop("ipv6 version 4", patched(v6tcp, func(f []byte) { f[14] = 0x40 }), engine.DropBadIPv6)
	drop("tcp data offset 4", patched(v4tcp, func(f []byte) { f[34+12] = 0x40 }), engine.DropBadL4)
	drop("tcp data offset past the segment", patched(v4tcp, func(f []byte) { f[34+12] = 0xf0 }), engine.DropBadL4)
	drop("tcp header cut by ipv4 total length", patched(v4tcp, func(f []byte) { binary.BigEndian.PutUint16(f[16:], 20+19) }), engine.DropBadL4)
	drop("udp length 7", patched(v4udp, func(f []byte) { binary.BigEndian.PutUint16(f[34+4:], 7) }), engine.DropBadL4)
	drop("udp length 0", patched(v6udp, func(f []byte) { binary.BigEndian.PutUint16(f[54+4:], 0) }), engine.DropBadL4)
	drop("icmpv6 4 bytes", patched(v6tcp[:14+40+4], func(f []byte) { f[14+6] = 58; binary.BigEndian.PutUint16(f[14+4:], 4) }), engine.DropBadL4)

	// Ethernet padding: a 60-byte frame around a short IPv4 packet. The L4
	// header must fit in the IP packet (Total Length), not in the frame.
	ip = gpIPv4(layers.IPProtocolUDP)
	short := gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv4), ip, gpUDP(ip, 1006, 53), gopacket.Payload("hi"))
	require.Len(tb, short, 60)
	require.EqualValues(tb, 30, binary.BigEndian.Uint16(short[16:]))
	for i := 14 + 30; i < 60; i++ {
		short[i] = 0xee
	}
	add(parseCase{name: "ethernet padding after a short ipv4 udp", frame: short,
		flags: fV4 | fL4, etherType: 0x0800, l3: 14, l4: 34, proto: 17, sport: 1006, dport: 53})
	drop("udp length into the ethernet padding", patched(short, func(f []byte) { binary.BigEndian.PutUint16(f[34+4:], 8+2+10) }), engine.DropBadL4)
	ip = gpIPv4(layers.IPProtocolTCP)
	shortTCP := gpkt.Serialize(tb, gpEth(layers.EthernetTypeIPv4), ip, gpTCP(ip, 40006, 80))
	require.Len(tb, shortTCP, 60)
	drop("tcp data offset into the ethernet padding", patched(shortTCP, func(f []byte) { f[34+12] = 6 << 4 }), engine.DropBadL4)
	drop("icmp cut by total length, padding after", patched(v4icmp, func(f []byte) { binary.BigEndian.PutUint16(f[16:], 20+4) }), engine.DropBadL4)
	add(parseCase{name: "ipv6 udp with a trailer", frame: slices.Concat(v6udp, []byte{0xee, 0xee, 0xee, 0xee}),
		flags: fV6 | fL4, etherType: 0x86dd, l3: 14, l4: 54, proto: 17, sport: 1002, dport: 53})
	drop("udp length into the ipv6 trailer", patched(slices.Concat(v6udp, []byte{0xee, 0xee, 0xee, 0xee}),
		func(f []byte) { binary.BigEndian.PutUint16(f[54+4:], 8+5+4) }), engine.DropBadL4)
	return cs
}

// parseInto copies frame into a new buffer, head junk bytes before it and
// tail junk bytes after it, and parses it. With tail 0 the frame's
// capacity ends with it, so any read past the frame panics.
func parseInto(frame []byte, head, tail int, junk byte) (*engine.Packet, engine.DropReason) {
	buf := make([]byte, head+len(frame)+tail)
	for i := range buf {
		buf[i] = junk
	}
	copy(buf[head:], frame)
	p := new(engine.Packet)
	p.SetBuffer(nil, 0, buf, head, len(frame), 0)
	return p, engine.ParsePacket(p, parseVNI)
}

func TestParse(t *testing.T) {
	for _, c := range goldenParseCases(t) {
		t.Run(c.name, func(t *testing.T) {
			p, r := parseInto(c.frame, engine.DefaultHeadroom, 0, 0)
			require.Equal(t, c.reason, r, "drop reason %v, want %v", r, c.reason)
			checkGopacketOracle(t, c.frame, p, r)
			if r != 0 {
				return
			}
			require.Equal(t, c.flags, p.Flags, "flags %#x, want %#x", p.Flags, c.flags)
			require.Equal(t, c.etherType, p.EtherType)
			require.Equal(t, c.l3, p.L3Off)
			if c.flags&fL4 != 0 {
				require.Equal(t, c.l4, p.L4Off)
			}
			require.Equal(t, c.proto, p.L4Proto)
			require.Equal(t, c.proto, p.Key.Proto)
			require.EqualValues(t, parseVNI, p.Key.VNI)
			require.Equal(t, c.sport, p.Key.SrcPort)
			require.Equal(t, c.dport, p.Key.DstPort)
			if c.flags&fV4 != 0 {
				require.Equal(t, netip.AddrFrom4([4]byte(p4Src)), p.Key.SrcAddr())
				require.Equal(t, netip.AddrFrom4([4]byte(p4Dst)), p.Key.DstAddr())
			} else {
				require.Equal(t, netip.AddrFrom16([16]byte(p6Src)), p.Key.SrcAddr())
				require.Equal(t, netip.AddrFrom16([16]byte(p6Dst)), p.Key.DstAddr())
			}
			checkNewPacket(t, c.frame, p)
		})
	}
}

// TestParseStage runs the golden frames as batches through the Parse
// stage: dropped frames carry their reason, kept ones the stage's VNI.
func TestParseStage(t *testing.T) {
	cs := goldenParseCases(t)
	for _, vni := range []uint32{0, 1, 0xffffff} {
		ps := engine.Parse{VNI: vni}
		for start := 0; start < len(cs); start += engine.MaxBatch {
			chunk := cs[start:min(start+engine.MaxBatch, len(cs))]
			var b engine.Batch
			pkts := make([]engine.Packet, len(chunk))
			for i, c := range chunk {
				pkts[i].SetBuffer(nil, 0, slices.Clone(c.frame), 0, len(c.frame), 0)
				require.True(t, b.Append(&pkts[i]))
			}
			ps.Process(&b)
			for i, c := range chunk {
				p := &pkts[i]
				if c.reason != 0 {
					require.Equal(t, engine.VerdictDrop, p.Verdict, c.name)
					require.Equal(t, c.reason, p.Reason, c.name)
					continue
				}
				require.Equal(t, engine.VerdictTX, p.Verdict, c.name)
				require.EqualValues(t, vni, p.Key.VNI, c.name)
				require.Equal(t, c.flags, p.Flags, c.name)
			}
		}
	}
}

// TestParseNoAllocs: the Parse stage allocates nothing, on kept and on
// dropped frames alike.
func TestParseNoAllocs(t *testing.T) {
	cs := goldenParseCases(t)
	var batches []*engine.Batch
	for start := 0; start < len(cs); start += engine.MaxBatch {
		b := new(engine.Batch)
		for _, c := range cs[start:min(start+engine.MaxBatch, len(cs))] {
			p := new(engine.Packet)
			buf := make([]byte, engine.DefaultHeadroom+len(c.frame))
			copy(buf[engine.DefaultHeadroom:], c.frame)
			p.SetBuffer(nil, 0, buf, engine.DefaultHeadroom, len(c.frame), 0)
			b.Append(p)
		}
		batches = append(batches, b)
	}
	ps := engine.Parse{VNI: parseVNI}
	allocs := testing.AllocsPerRun(100, func() {
		for _, b := range batches {
			ps.Process(b)
		}
	})
	require.Zero(t, allocs)
}

// FuzzParse checks ParsePacket against gopacket on any bytes:
//
//   - it never panics, and reads nothing outside the frame: the same
//     frame parsed with no tailroom (a read past it panics) and with junk
//     bytes around it gives the same result;
//   - it returns 0 or one of the parser's registered drop reasons;
//   - parsing is stateless: re-parsing a Packet that holds another frame's
//     metadata (as decapsulation does) gives the same result as a fresh one;
//   - it accepts a frame exactly when the gopacket oracle
//     (gpDecode, whose rules are documented there) does; when both reject,
//     the reason is one the oracle allows; when both accept, every field
//     agrees (checkGopacketOracle).
func FuzzParse(f *testing.F) {
	for _, c := range goldenParseCases(f) {
		f.Add(c.frame)
	}
	outer := goldenParseCases(f)[0].frame // an IPv4 TCP frame
	f.Fuzz(func(t *testing.T, frame []byte) {
		p, r := parseInto(frame, 0, 0, 0)
		q, r2 := parseInto(frame, 64, 64, 0xff)
		if r != r2 {
			t.Fatalf("bytes outside the frame changed the result: %v vs %v", r, r2)
		}
		if r == 0 {
			requireSameParse(t, p, q)
		}
		if r != 0 && !slices.Contains(parseDropReasons, r) {
			t.Fatalf("drop reason %v (%d) is not one of the parser's", r, r)
		}
		if int(r) >= len(engine.DropReasons()) {
			t.Fatalf("drop reason %d is not registered", r)
		}

		// A packet that was parsed before, then trimmed to an inner
		// frame (decapsulation).
		buf := slices.Concat(outer, frame)
		var s engine.Packet
		s.SetBuffer(nil, 0, buf, 0, len(buf), 0)
		if engine.ParsePacket(&s, 7) != 0 || !s.TrimFront(len(outer)) {
			t.Fatal("outer frame does not parse")
		}
		if r3 := engine.ParsePacket(&s, parseVNI); r3 != r {
			t.Fatalf("re-parse gave %v, fresh parse %v", r3, r)
		} else if r == 0 {
			requireSameParse(t, p, &s)
		}

		checkGopacketOracle(t, frame, p, r)
	})
}

// parseDropReasons are the reasons ParsePacket returns.
var parseDropReasons = []engine.DropReason{
	engine.DropTruncated, engine.DropNotIP, engine.DropBadL2,
	engine.DropBadIPv4, engine.DropBadIPv6, engine.DropBadL4,
}

// requireSameParse checks that two packets parsed from the same frame agree
// on what the parser sets (L4Off only when it is valid).
func requireSameParse(t *testing.T, a, b *engine.Packet) {
	t.Helper()
	if a.Flags != b.Flags || a.EtherType != b.EtherType || a.L3Off != b.L3Off || a.L4Proto != b.L4Proto || a.Key != b.Key ||
		a.TCPFlags != b.TCPFlags || (a.Flags&fL4 != 0 && a.L4Off != b.L4Off) {
		t.Fatalf("same frame, different parse:\n%+v\n%+v", a, b)
	}
}

// checkNewPacket compares an accepted golden frame's parse with gopacket's
// whole-packet decoding (gopacket.NewPacket, layers aliasing the frame).
func checkNewPacket(t *testing.T, frame []byte, p *engine.Packet) {
	t.Helper()
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.DecodeOptions{NoCopy: true})
	var src, dst net.IP
	var frag, nonFirst bool
	switch nl := pkt.NetworkLayer().(type) {
	case *layers.IPv4:
		src, dst = nl.SrcIP, nl.DstIP
		require.Equal(t, uint8(nl.Protocol), p.L4Proto)
		frag = nl.Flags&layers.IPv4MoreFragments != 0 || nl.FragOffset != 0
		nonFirst = nl.FragOffset != 0
	case *layers.IPv6:
		src, dst = nl.SrcIP, nl.DstIP
		if fh, ok := pkt.Layer(layers.LayerTypeIPv6Fragment).(*layers.IPv6Fragment); ok {
			frag = fh.FragmentOffset != 0 || fh.MoreFragments // ATOMIC
			nonFirst = fh.FragmentOffset != 0
		}
	default:
		t.Fatalf("gopacket found no IP layer: %v", pkt)
	}
	require.Equal(t, offsetIn(frame, pkt.NetworkLayer().LayerContents()), int(p.L3Off))
	require.Equal(t, netip.MustParseAddr(src.String()), p.Key.SrcAddr())
	require.Equal(t, netip.MustParseAddr(dst.String()), p.Key.DstAddr())
	require.Equal(t, frag, p.Flags&fFr != 0, "fragment")
	require.Equal(t, nonFirst, p.Flags&fNFF != 0, "non-first fragment")

	if p.Flags&fL4 == 0 {
		return // gopacket may have found a transport layer deeper (GRE)
	}
	fl := pkt.Layer(gopacket.LayerTypeFragment)
	switch tl := pkt.TransportLayer().(type) {
	case *layers.TCP:
		require.Equal(t, uint8(6), p.L4Proto)
		require.Equal(t, [2]uint16{uint16(tl.SrcPort), uint16(tl.DstPort)}, [2]uint16{p.Key.SrcPort, p.Key.DstPort})
		require.Equal(t, offsetIn(frame, tl.LayerContents()), int(p.L4Off))
	case *layers.UDP:
		require.Equal(t, uint8(17), p.L4Proto)
		require.Equal(t, [2]uint16{uint16(tl.SrcPort), uint16(tl.DstPort)}, [2]uint16{p.Key.SrcPort, p.Key.DstPort})
		require.Equal(t, offsetIn(frame, tl.LayerContents()), int(p.L4Off))
	case nil:
		for _, lt := range []gopacket.LayerType{layers.LayerTypeICMPv4, layers.LayerTypeICMPv6} {
			if l := pkt.Layer(lt); l != nil {
				require.Equal(t, offsetIn(frame, l.LayerContents()), int(p.L4Off))
			}
		}
		if fl != nil {
			// A first fragment (or an atomic one): its payload starts
			// with the L4 header, unless extension headers follow the
			// Fragment header.
			if fh, ok := pkt.Layer(layers.LayerTypeIPv6Fragment).(*layers.IPv6Fragment); !ok || uint8(fh.NextHeader) == p.L4Proto {
				require.Equal(t, offsetIn(frame, fl.LayerContents()), int(p.L4Off))
			}
		}
	default:
		t.Fatalf("unexpected transport layer %v", tl.LayerType())
	}
}
