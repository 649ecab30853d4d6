package header

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// Golden tests: gopacket is the independent oracle. Frames are built with
// gopacket (lengths and checksums computed by it) and read back through our
// views, field by field against gopacket's own decoding; and frames written
// by our code are decoded by gopacket and their checksums recomputed there.

var (
	macA = net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x00, 0x01}
	macB = net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x00, 0x02}
	v4A  = net.IP{198, 18, 0, 1}
	v4B  = net.IP{198, 19, 255, 254}
	v6A  = net.ParseIP("2001:db8::1")
	v6B  = net.ParseIP("2001:db8:ffff::fffe")
	v6C  = net.ParseIP("2001:db8:1:2:3:4:5:6")
)

// payload returns n bytes with a recognisable, non-trivial pattern.
func payload(n int) gopacket.Payload {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + 3)
	}
	return p
}

// Raw IPv6 extension headers gopacket can decode but not serialise.
func routingHeader(next layers.IPProtocol, segmentsLeft uint8, addrs ...net.IP) []byte {
	h := []byte{byte(next), byte(2 * len(addrs)), 0, segmentsLeft, 0, 0, 0, 0}
	for _, a := range addrs {
		h = append(h, a.To16()...)
	}
	return h
}

func fragmentHeader(next layers.IPProtocol, offset uint16, more bool, id uint32) []byte {
	h := make([]byte, 8)
	h[0] = byte(next)
	fo := offset &^ 7
	if more {
		fo |= 1
	}
	binary.BigEndian.PutUint16(h[2:], fo)
	binary.BigEndian.PutUint32(h[4:], id)
	return h
}

func tlv(typ uint8, data ...byte) *layers.IPv6HopByHopOption {
	return &layers.IPv6HopByHopOption{OptionType: typ, OptionData: data}
}

func dtlv(typ uint8, data ...byte) *layers.IPv6DestinationOption {
	return &layers.IPv6DestinationOption{OptionType: typ, OptionData: data}
}

// tcpSegment builds a TCP segment with options; its checksum is computed by
// gopacket over the pseudo-header of ip.
func tcpLayer(src, dst layers.TCPPort) *layers.TCP {
	return &layers.TCP{
		SrcPort: src, DstPort: dst, Seq: 0x01020304, Ack: 0xa0b0c0d0,
		SYN: true, ACK: true, ECE: true, Window: 0xfaf0, Urgent: 0,
		Options: []layers.TCPOption{
			{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}},
			{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2},
			{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}},
			{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		},
	}
}

func ipv4Layer(proto layers.IPProtocol) *layers.IPv4 {
	return &layers.IPv4{
		Version: 4, TOS: 0xb8, Id: 0xbeef, Flags: layers.IPv4DontFragment, TTL: 61,
		Protocol: proto, SrcIP: v4A, DstIP: v4B,
	}
}

func ipv6Layer(next layers.IPProtocol) *layers.IPv6 {
	return &layers.IPv6{
		Version: 6, TrafficClass: 0xb8, FlowLabel: 0xabcde, NextHeader: next, HopLimit: 63,
		SrcIP: v6A, DstIP: v6B,
	}
}

func ethLayer(t layers.EthernetType) *layers.Ethernet {
	return &layers.Ethernet{SrcMAC: macA, DstMAC: macB, EthernetType: t}
}

// goldenFrames is the table of frames built by gopacket.
func goldenFrames(t testing.TB) []struct {
	name  string
	frame []byte
} {
	ipOpts := ipv4Layer(layers.IPProtocolTCP)
	ipOpts.Options = []layers.IPv4Option{
		{OptionType: 0x94, OptionLength: 4, OptionData: []byte{0, 0}}, // router alert
		{OptionType: 0x07, OptionLength: 7, OptionData: []byte{4, 198, 18, 0, 9}},
		{OptionType: 0x00}, // end of list
	}

	// IPv6 with every walked extension header: HBH, DestOpts, Routing
	// (segments left 0), Fragment (first, M set), then TCP, whose
	// checksum gopacket computes over the fixed header's addresses.
	tcp6 := gpkt.Serialize(t, ipv6Layer(layers.IPProtocolTCP), tcpLayer(443, 50000), payload(64))[IPv6Size:]
	ext := append(append(routingHeader(layers.IPProtocolIPv6Fragment, 0, v6C), fragmentHeader(layers.IPProtocolTCP, 0, true, 0xdeadbeef)...), tcp6...)
	hbh := &layers.IPv6HopByHop{Options: []*layers.IPv6HopByHopOption{tlv(0x1e, 1, 2, 3, 4)}}
	hbh.NextHeader = layers.IPProtocolIPv6Destination
	dst := &layers.IPv6Destination{Options: []*layers.IPv6DestinationOption{dtlv(0x1e, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2)}}
	dst.NextHeader = layers.IPProtocolIPv6Routing
	ip6ext := ipv6Layer(layers.IPProtocolIPv6HopByHop)
	ip6ext.HopByHop = hbh

	// Non-first fragment: data after the fragment header is not a header.
	ip6frag := gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv6), ipv6Layer(layers.IPProtocolIPv6Fragment),
		gopacket.Payload(append(fragmentHeader(layers.IPProtocolUDP, 1448, false, 7), payload(40)...)))

	// VXLAN carrying an inner tagged IPv4/TCP frame.
	inner := gpkt.Serialize(t, ethLayer(layers.EthernetTypeDot1Q),
		&layers.Dot1Q{VLANIdentifier: 42, Type: layers.EthernetTypeIPv4},
		ipv4Layer(layers.IPProtocolTCP), tcpLayer(12345, 80), payload(10))
	vx := gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv4), ipv4Layer(layers.IPProtocolUDP),
		&layers.UDP{SrcPort: 51000, DstPort: VXLANPort},
		&layers.VXLAN{ValidIDFlag: true, VNI: 0xabcdef}, gopacket.Payload(inner))

	icmp4Echo := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 0x4242, Seq: 7}
	icmp4Frag := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeFragmentationNeeded)}
	frag4Payload := append([]byte{0, 0, 0x05, 0xdc}, payload(28)...) // unused, MTU 1500, original datagram
	icmp4Frag.Seq = 1500

	return []struct {
		name  string
		frame []byte
	}{
		{"qinq ipv4 options tcp options", gpkt.Serialize(t, ethLayer(layers.EthernetTypeQinQ),
			&layers.Dot1Q{VLANIdentifier: 100, Type: layers.EthernetTypeDot1Q},
			&layers.Dot1Q{VLANIdentifier: 200, Priority: 5, DropEligible: true, Type: layers.EthernetTypeIPv4},
			ipOpts, tcpLayer(40000, 80), payload(33))},
		{"ipv4 udp odd payload", gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv4), ipv4Layer(layers.IPProtocolUDP),
			&layers.UDP{SrcPort: 40001, DstPort: 40002}, payload(101))},
		{"dot1q ipv4 udp", gpkt.Serialize(t, ethLayer(layers.EthernetTypeDot1Q),
			&layers.Dot1Q{VLANIdentifier: 4094, Type: layers.EthernetTypeIPv4},
			ipv4Layer(layers.IPProtocolUDP), &layers.UDP{SrcPort: 1, DstPort: 65535}, payload(40))},
		{"ipv4 icmp echo", gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv4), ipv4Layer(layers.IPProtocolICMPv4), icmp4Echo, payload(56))},
		{"ipv4 icmp frag needed", gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv4), ipv4Layer(layers.IPProtocolICMPv4), icmp4Frag, gopacket.Payload(frag4Payload[4:]))},
		{"ipv6 tcp", gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv6), ipv6Layer(layers.IPProtocolTCP), tcpLayer(443, 50000), payload(200))},
		{"ipv6 udp", gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv6), ipv6Layer(layers.IPProtocolUDP), &layers.UDP{SrcPort: 40003, DstPort: 40004}, payload(31))},
		{"ipv6 hbh destopts routing fragment tcp", gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv6), ip6ext, hbh, dst, gopacket.Payload(ext))},
		{"ipv6 non-first fragment", ip6frag},
		{"ipv6 icmpv6 echo", gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv6), ipv6Layer(layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)},
			&layers.ICMPv6Echo{Identifier: 0x1234, SeqNumber: 9}, payload(32))},
		{"ipv6 icmpv6 packet too big", gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv6), ipv6Layer(layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypePacketTooBig, 0)},
			gopacket.Payload(append([]byte{0, 0, 0x05, 0x00}, payload(48)...)))},
		{"vxlan inner dot1q ipv4 tcp", vx},
	}
}

func TestGoldenRead(t *testing.T) {
	for _, tc := range goldenFrames(t) {
		t.Run(tc.name, func(t *testing.T) {
			n := crossCheck(t, tc.frame)
			if n < 3 {
				t.Fatalf("only %d layers compared", n)
			}
		})
	}
}

// crossCheck decodes frame with gopacket and walks it with our views,
// comparing every field of every layer gopacket found. It verifies every
// checksum with our code (the frames' checksums come from gopacket or from
// code already checked against it). It returns how many layers it compared.
func crossCheck(t testing.TB, frame []byte) int {
	t.Helper()
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	if el := pkt.ErrorLayer(); el != nil {
		t.Fatalf("gopacket: %v", el.Error())
	}
	ls := pkt.Layers()
	i := 0
	next := func() gopacket.Layer {
		t.Helper()
		if i >= len(ls) {
			t.Fatalf("ran out of gopacket layers")
		}
		i++
		return ls[i-1]
	}
	b := frame
	for {
		// Ethernet and tags.
		et, l3, err := ParseEthernet(b)
		noErr(t, err, "ParseEthernet")
		ge := next().(*layers.Ethernet)
		e := Ethernet(b)
		equal(t, MAC(ge.DstMAC), e.Dst(), "eth dst")
		equal(t, MAC(ge.SrcMAC), e.Src(), "eth src")
		equal(t, uint16(ge.EthernetType), e.Type(), "eth type")
		for off := EthernetSize; off < l3; off += VLANTagSize {
			gq := next().(*layers.Dot1Q)
			tag := VLANTag(b[off:])
			equal(t, gq.VLANIdentifier, tag.VID(), "vid")
			equal(t, gq.Priority, tag.PCP(), "pcp")
			equal(t, uint16(gq.Type), tag.Type(), "tag type")
		}
		var l4 []byte
		var proto uint8
		var pseudoSrc, pseudoDst []byte
		nonFirst := false
		switch et {
		case EtherTypeIPv4:
			g := next().(*layers.IPv4)
			ip := IPv4(b[l3:])
			noErr(t, ip.Check(), "IPv4.Check")
			equal(t, int(g.IHL)*4, ip.HeaderLength(), "ihl")
			equal(t, g.TOS, ip.TOS(), "tos")
			equal(t, g.Length, ip.TotalLength(), "total length")
			equal(t, g.Id, ip.ID(), "id")
			equal(t, uint8(g.Flags), ip.Flags(), "flags")
			equal(t, g.Flags&layers.IPv4DontFragment != 0, ip.DontFragment(), "df")
			equal(t, g.Flags&layers.IPv4MoreFragments != 0, ip.MoreFragments(), "mf")
			equal(t, g.FragOffset*8, ip.FragmentOffset(), "frag offset")
			equal(t, g.TTL, ip.TTL(), "ttl")
			equal(t, uint8(g.Protocol), ip.Protocol(), "protocol")
			equal(t, g.Checksum, ip.Checksum(), "checksum")
			equal(t, [4]byte(g.SrcIP.To4()), ip.Src(), "src")
			equal(t, [4]byte(g.DstIP.To4()), ip.Dst(), "dst")
			equal(t, true, bytes.Equal(g.SrcIP.To4(), ip.SrcSlice()), "src slice")
			equal(t, true, bytes.Equal(g.DstIP.To4(), ip.DstSlice()), "dst slice")
			equal(t, true, bytes.Equal(g.Contents[IPv4MinSize:], ip.Options()), "options")
			equal(t, true, bytes.Equal(g.Payload, ip.Payload()), "payload")
			equal(t, true, ip.IsChecksumValid(), "ip checksum valid")
			equal(t, ip.Checksum(), ip.CalculateChecksum(), "ip checksum recomputed")
			l4, proto, pseudoSrc, pseudoDst = ip.Payload(), ip.Protocol(), ip.SrcSlice(), ip.DstSlice()
			nonFirst = ip.IsNonFirstFragment()
		case EtherTypeIPv6:
			g := next().(*layers.IPv6)
			ip := IPv6(b[l3:])
			noErr(t, ip.Check(), "IPv6.Check")
			equal(t, g.TrafficClass, ip.TrafficClass(), "tc")
			equal(t, g.FlowLabel, ip.FlowLabel(), "flow label")
			equal(t, g.Length, ip.PayloadLength(), "payload length")
			equal(t, uint8(g.NextHeader), ip.NextHeader(), "next header")
			equal(t, g.HopLimit, ip.HopLimit(), "hop limit")
			equal(t, [16]byte(g.SrcIP), ip.Src(), "src")
			equal(t, [16]byte(g.DstIP), ip.Dst(), "dst")
			equal(t, true, bytes.Equal(g.SrcIP, ip.SrcSlice()), "src slice")
			equal(t, true, bytes.Equal(g.DstIP, ip.DstSlice()), "dst slice")
			// gopacket's IPv6 payload starts after a Hop-by-Hop header.
			equal(t, true, bytes.HasSuffix(ip.Payload(), g.Payload), "payload")
			p, off, frag, err := ip.TransportHeader()
			noErr(t, err, "TransportHeader")
			// Walk gopacket's extension layers alongside.
			want := IPv6Size
			var wantFrag IPv6Frag
			wantProto := uint8(g.NextHeader)
		ext:
			for i < len(ls) {
				switch x := ls[i].(type) {
				case *layers.IPv6HopByHop:
					want += x.ActualLength
					wantProto = uint8(x.NextHeader)
				case *layers.IPv6Destination:
					want += x.ActualLength
					wantProto = uint8(x.NextHeader)
				case *layers.IPv6Routing:
					want += x.ActualLength
					wantProto = uint8(x.NextHeader)
				case *layers.IPv6Fragment:
					want += 8
					wantProto = uint8(x.NextHeader)
					wantFrag = IPv6Frag{Present: true, Offset: x.FragmentOffset * 8, More: x.MoreFragments, ID: x.Identification}
				default:
					break ext
				}
				i++
			}
			equal(t, wantProto, p, "transport protocol")
			equal(t, want, off, "transport offset")
			equal(t, wantFrag, frag, "fragment info")
			l4, proto = ip[off:IPv6Size+int(ip.PayloadLength())], p
			pseudoSrc, pseudoDst = ip.SrcSlice(), ip.DstSlice()
			nonFirst = frag.NonFirst()
		default:
			t.Fatalf("unexpected EtherType %#x", et)
		}
		if nonFirst {
			// gopacket stops at a Fragment layer too.
			equal(t, gopacket.LayerTypeFragment, next().LayerType(), "fragment payload")
			return i
		}
		switch proto {
		case ProtoTCP:
			if _, ok := ls[i].(*layers.TCP); !ok {
				// A first fragment: gopacket stops; check what we can.
				equal(t, gopacket.LayerTypeFragment, next().LayerType(), "first fragment payload")
				tcp := TCP(l4)
				noErr(t, tcp.Check(), "TCP.Check")
				equal(t, true, tcp.IsChecksumValid(PseudoHeaderChecksum(ProtoTCP, pseudoSrc, pseudoDst, uint16(len(l4)))), "tcp checksum (fragment)")
				return i
			}
			g := next().(*layers.TCP)
			tcp := TCP(l4)
			noErr(t, tcp.Check(), "TCP.Check")
			equal(t, uint16(g.SrcPort), tcp.SrcPort(), "sport")
			equal(t, uint16(g.DstPort), tcp.DstPort(), "dport")
			equal(t, g.Seq, tcp.SeqNum(), "seq")
			equal(t, g.Ack, tcp.AckNum(), "ack")
			equal(t, int(g.DataOffset)*4, tcp.DataOffset(), "data offset")
			equal(t, g.Contents[13], tcp.Flags(), "flags")
			equal(t, g.SYN, tcp.Flags()&TCPFlagSyn != 0, "syn")
			equal(t, g.ACK, tcp.Flags()&TCPFlagAck != 0, "ack flag")
			equal(t, g.FIN, tcp.Flags()&TCPFlagFin != 0, "fin")
			equal(t, g.RST, tcp.Flags()&TCPFlagRst != 0, "rst")
			equal(t, g.PSH, tcp.Flags()&TCPFlagPsh != 0, "psh")
			equal(t, g.URG, tcp.Flags()&TCPFlagUrg != 0, "urg")
			equal(t, g.Window, tcp.Window(), "window")
			equal(t, g.Urgent, tcp.UrgentPointer(), "urgent")
			equal(t, g.Checksum, tcp.Checksum(), "checksum")
			equal(t, true, bytes.Equal(g.Contents[TCPMinSize:], tcp.Options()), "options")
			equal(t, true, bytes.Equal(g.Payload, tcp.Payload()), "payload")
			ph := PseudoHeaderChecksum(ProtoTCP, pseudoSrc, pseudoDst, uint16(len(l4)))
			equal(t, true, tcp.IsChecksumValid(ph), "tcp checksum valid")
			equal(t, tcp.Checksum(), tcp.CalculateChecksum(ph), "tcp checksum recomputed")
			if len(g.Payload) > 0 {
				equal(t, gopacket.LayerTypePayload, next().LayerType(), "tcp payload layer")
			}
			return i
		case ProtoUDP:
			g := next().(*layers.UDP)
			u := UDP(l4)
			noErr(t, u.Check(), "UDP.Check")
			equal(t, uint16(g.SrcPort), u.SrcPort(), "sport")
			equal(t, uint16(g.DstPort), u.DstPort(), "dport")
			equal(t, g.Length, u.Length(), "length")
			equal(t, g.Checksum, u.Checksum(), "checksum")
			equal(t, true, bytes.Equal(g.Payload, u.Payload()), "payload")
			ph := PseudoHeaderChecksum(ProtoUDP, pseudoSrc, pseudoDst, u.Length())
			equal(t, true, u.IsChecksumValid(ph), "udp checksum valid")
			if g.Checksum != 0 {
				equal(t, nonZero(g.Checksum), u.CalculateChecksum(ph), "udp checksum recomputed")
			}
			if u.DstPort() == VXLANPort {
				gv := next().(*layers.VXLAN)
				v := VXLAN(u.Payload())
				noErr(t, v.Check(), "VXLAN.Check")
				equal(t, gv.VNI, v.VNI(), "vni")
				equal(t, gv.ValidIDFlag, v.Flags()&VXLANFlagVNI != 0, "I flag")
				b = v.Payload()
				continue // the inner frame
			}
			if len(g.Payload) > 0 {
				equal(t, gopacket.LayerTypePayload, next().LayerType(), "udp payload layer")
			}
			return i
		case ProtoICMP:
			g := next().(*layers.ICMPv4)
			m := ICMPv4(l4)
			noErr(t, m.Check(), "ICMPv4.Check")
			equal(t, g.TypeCode.Type(), m.Type(), "type")
			equal(t, g.TypeCode.Code(), m.Code(), "code")
			equal(t, g.Checksum, m.Checksum(), "checksum")
			equal(t, g.Id, m.Ident(), "ident")
			equal(t, g.Seq, m.Sequence(), "seq")
			if m.Type() == ICMPv4DestUnreachable && m.Code() == ICMPv4CodeFragNeeded {
				equal(t, g.Seq, m.MTU(), "mtu") // gopacket has no MTU field: it is the Seq half
			}
			equal(t, true, bytes.Equal(g.Payload, m.Payload()), "payload")
			equal(t, true, m.IsChecksumValid(), "icmp checksum valid")
			equal(t, m.Checksum(), m.CalculateChecksum(), "icmp checksum recomputed")
			return i
		case ProtoICMPv6:
			g := next().(*layers.ICMPv6)
			m := ICMPv6(l4)
			noErr(t, m.Check(), "ICMPv6.Check")
			equal(t, g.TypeCode.Type(), m.Type(), "type")
			equal(t, g.TypeCode.Code(), m.Code(), "code")
			equal(t, g.Checksum, m.Checksum(), "checksum")
			switch m.Type() {
			case ICMPv6EchoRequest, ICMPv6EchoReply:
				ge := next().(*layers.ICMPv6Echo)
				equal(t, ge.Identifier, m.Ident(), "ident")
				equal(t, ge.SeqNumber, m.Sequence(), "seq")
			case ICMPv6PacketTooBig:
				equal(t, binary.BigEndian.Uint32(g.Payload), m.MTU(), "mtu")
			}
			ph := PseudoHeaderChecksum(ProtoICMPv6, pseudoSrc, pseudoDst, uint16(len(l4)))
			equal(t, true, m.IsChecksumValid(ph), "icmpv6 checksum valid")
			equal(t, m.Checksum(), m.CalculateChecksum(ph), "icmpv6 checksum recomputed")
			return i
		default:
			t.Fatalf("unexpected protocol %d", proto)
		}
	}
}

// gopacketChecksums decodes frame with gopacket, re-serialises it with
// ComputeChecksums and reports every stored checksum that differs from
// gopacket's recomputation. It needs every layer to be serialisable (no
// IPv6 Routing or Fragment headers). A UDP checksum of 0 over IPv4 ("none")
// is accepted, and a stored 0xFFFF where gopacket computes 0 (RFC 768).
func gopacketChecksums(t testing.TB, frame []byte) {
	t.Helper()
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	if el := pkt.ErrorLayer(); el != nil {
		t.Fatalf("gopacket: %v", el.Error())
	}
	type stored struct {
		l    gopacket.Layer
		sum  uint16
		over gopacket.NetworkLayer
	}
	var sums []stored
	var netl gopacket.NetworkLayer
	var sl []gopacket.SerializableLayer
	var icmp6 *layers.ICMPv6
	for _, l := range pkt.Layers() {
		switch v := l.(type) {
		case *layers.IPv4:
			netl = v
			sums = append(sums, stored{v, v.Checksum, nil})
		case *layers.IPv6:
			netl = v
		case *layers.TCP:
			noErr(t, v.SetNetworkLayerForChecksum(netl))
			sums = append(sums, stored{v, v.Checksum, netl})
		case *layers.UDP:
			noErr(t, v.SetNetworkLayerForChecksum(netl))
			sums = append(sums, stored{v, v.Checksum, netl})
		case *layers.ICMPv4:
			sums = append(sums, stored{v, v.Checksum, nil})
		case *layers.ICMPv6:
			noErr(t, v.SetNetworkLayerForChecksum(netl))
			sums = append(sums, stored{v, v.Checksum, netl})
			icmp6 = v
		}
		s, ok := l.(gopacket.SerializableLayer)
		if !ok {
			t.Fatalf("layer %v is not serialisable", l.LayerType())
		}
		sl = append(sl, s)
		if _, ok := l.(*layers.ICMPv6Echo); ok {
			// gopacket's echo layer drops the data after it.
			sl = append(sl, gopacket.Payload(icmp6.Payload[4:]))
		}
	}
	buf := gopacket.NewSerializeBuffer()
	noErr(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, sl...), "reserialize")
	if len(sums) == 0 {
		t.Fatalf("no checksummed layers")
	}
	for _, s := range sums {
		var got uint16
		switch v := s.l.(type) {
		case *layers.IPv4:
			got = v.Checksum
		case *layers.TCP:
			got = v.Checksum
		case *layers.UDP:
			got = v.Checksum
			_, v4 := s.over.(*layers.IPv4)
			if s.sum == 0 && v4 {
				continue // "no checksum"
			}
			if s.sum == 0xffff && got == 0 {
				continue // RFC 768: computed 0 is sent as all ones
			}
		case *layers.ICMPv4:
			got = v.Checksum
		case *layers.ICMPv6:
			got = v.Checksum
		}
		if got != s.sum {
			t.Errorf("%v checksum: stored %#04x, gopacket computes %#04x", s.l.LayerType(), s.sum, got)
		}
	}
}

func TestGoldenGopacketAgreesWithGoldenFrames(t *testing.T) {
	// Sanity check of the oracle helper on frames gopacket built itself.
	for _, tc := range goldenFrames(t) {
		if bytes.Contains([]byte(tc.name), []byte("fragment")) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) { gopacketChecksums(t, tc.frame) })
	}
}

// TestGoldenEncode writes a VXLAN-encapsulated frame entirely with our
// Encode methods and checksum helpers and lets gopacket decode and verify
// it.
func TestGoldenEncode(t *testing.T) {
	inner := goldenFrames(t)[5].frame // ipv6 tcp
	for _, v6 := range []bool{false, true} {
		hdr := EthernetSize + IPv4MinSize
		if v6 {
			hdr = EthernetSize + IPv6Size
		}
		hdr += UDPSize + VXLANSize
		frame := make([]byte, hdr+len(inner))
		copy(frame[hdr:], inner)

		Ethernet(frame).Encode(MAC(macB), MAC(macA), EtherTypeIPv4)
		var udp UDP
		if v6 {
			Ethernet(frame).SetType(EtherTypeIPv6)
			ip := IPv6(frame[EthernetSize:])
			ip.Encode(&IPv6Fields{TrafficClass: 0x10, FlowLabel: 0x12345, PayloadLength: uint16(len(frame) - EthernetSize - IPv6Size),
				NextHeader: ProtoUDP, HopLimit: 64, Src: [16]byte(v6A), Dst: [16]byte(v6B)})
			udp = UDP(ip.Payload())
			udp.Encode(50123, VXLANPort, uint16(len(udp)))
			VXLAN(udp[UDPSize:]).Encode(0x123456)
			udp.SetChecksum(udp.CalculateChecksum(PseudoHeaderChecksum(ProtoUDP, ip.SrcSlice(), ip.DstSlice(), uint16(len(udp)))))
		} else {
			ip := IPv4(frame[EthernetSize:])
			ip.Encode(&IPv4Fields{TOS: 0x10, TotalLength: uint16(len(frame) - EthernetSize), ID: 77, Flags: IPv4FlagDontFragment,
				TTL: 64, Protocol: ProtoUDP, Src: [4]byte(v4A), Dst: [4]byte(v4B)})
			udp = UDP(ip.Payload())
			udp.Encode(50123, VXLANPort, uint16(len(udp)))
			VXLAN(udp[UDPSize:]).Encode(0x123456)
			udp.SetChecksum(udp.CalculateChecksum(PseudoHeaderChecksum(ProtoUDP, ip.SrcSlice(), ip.DstSlice(), uint16(len(udp)))))
		}

		pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
		if el := pkt.ErrorLayer(); el != nil {
			t.Fatalf("gopacket: %v", el.Error())
		}
		vx := pkt.Layer(layers.LayerTypeVXLAN).(*layers.VXLAN)
		equal(t, uint32(0x123456), vx.VNI, "vni")
		equal(t, true, vx.ValidIDFlag, "I flag")
		if v6 {
			g := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
			equal(t, uint8(0x10), g.TrafficClass, "tc")
			equal(t, uint32(0x12345), g.FlowLabel, "flow")
			equal(t, uint8(64), g.HopLimit, "hop limit")
			equal(t, true, g.DstIP.Equal(v6B), "dst")
		} else {
			g := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
			equal(t, uint16(77), g.Id, "id")
			equal(t, layers.IPv4DontFragment, g.Flags, "flags")
			equal(t, uint8(64), g.TTL, "ttl")
			equal(t, true, g.SrcIP.Equal(v4A), "src")
		}
		gopacketChecksums(t, frame)
		crossCheck(t, frame)
	}
}

func TestGoldenIPv4EncodeFragment(t *testing.T) {
	b := make([]byte, 60)
	ip := IPv4(b)
	ip.Encode(&IPv4Fields{TotalLength: 60, ID: 9, Flags: IPv4FlagMoreFragments, FragmentOffset: 1480, TTL: 1, Protocol: ProtoUDP, Src: [4]byte(v4A), Dst: [4]byte(v4B)})
	g := &layers.IPv4{}
	noErr(t, g.DecodeFromBytes(b, gopacket.NilDecodeFeedback))
	equal(t, uint16(1480/8), g.FragOffset, "frag offset")
	equal(t, layers.IPv4MoreFragments, g.Flags, "flags")
	equal(t, true, ip.IsFragment(), "is fragment")
	equal(t, true, ip.IsNonFirstFragment(), "non-first")
	equal(t, uint16(1480), ip.FragmentOffset(), "offset")
	equal(t, g.Checksum, ip.CalculateChecksum(), "checksum")
}

// TestGoldenSetters writes every field through our setters and reads it
// back with gopacket.
func TestGoldenSetters(t *testing.T) {
	// IPv4 + TCP.
	frame := make([]byte, EthernetSize+IPv4MinSize+TCPMinSize+8)
	Ethernet(frame).Encode(MAC(macB), MAC(macA), EtherTypeIPv4)
	ip := IPv4(frame[EthernetSize:])
	ip.Encode(&IPv4Fields{TotalLength: uint16(len(frame) - EthernetSize), Protocol: ProtoTCP})
	ip.SetTTL(17)
	ip.SetSrc([4]byte(v4A))
	ip.SetDst([4]byte(v4B))
	ip.SetChecksum(ip.CalculateChecksum())
	tcp := TCP(ip.Payload())
	tcp.SetSrcPort(1234)
	tcp.SetDstPort(5678)
	tcp.SetSeqNum(0xdeadbeef)
	tcp.SetAckNum(0xfeedface)
	tcp.SetDataOffset(TCPMinSize)
	tcp.SetFlags(TCPFlagFin | TCPFlagPsh | TCPFlagAck)
	tcp.SetWindow(4321)
	tcp.SetChecksum(tcp.CalculateChecksum(PseudoHeaderChecksum(ProtoTCP, ip.SrcSlice(), ip.DstSlice(), uint16(len(tcp)))))
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	g4 := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	equal(t, uint8(17), g4.TTL, "ttl")
	equal(t, true, g4.SrcIP.Equal(v4A) && g4.DstIP.Equal(v4B), "addresses")
	gt := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
	equal(t, layers.TCPPort(1234), gt.SrcPort, "sport")
	equal(t, layers.TCPPort(5678), gt.DstPort, "dport")
	equal(t, uint32(0xdeadbeef), gt.Seq, "seq")
	equal(t, uint32(0xfeedface), gt.Ack, "ack")
	equal(t, uint8(5), gt.DataOffset, "data offset")
	equal(t, true, gt.FIN && gt.PSH && gt.ACK && !gt.SYN, "flags")
	equal(t, uint16(4321), gt.Window, "window")
	gopacketChecksums(t, frame)

	// IPv6 + ICMPv6.
	frame = make([]byte, EthernetSize+IPv6Size+ICMPv6MinSize+8)
	Ethernet(frame).Encode(MAC(macB), MAC(macA), EtherTypeIPv6)
	ip6 := IPv6(frame[EthernetSize:])
	ip6.Encode(&IPv6Fields{PayloadLength: ICMPv6MinSize + 8, NextHeader: ProtoICMPv6})
	ip6.SetHopLimit(255)
	ip6.SetSrc([16]byte(v6A))
	ip6.SetDst([16]byte(v6B))
	m := ICMPv6(ip6.Payload())
	m.SetType(ICMPv6EchoReply)
	m.SetCode(0)
	m.SetChecksum(m.CalculateChecksum(PseudoHeaderChecksum(ProtoICMPv6, ip6.SrcSlice(), ip6.DstSlice(), uint16(len(m)))))
	pkt = gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	g6 := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	equal(t, uint8(255), g6.HopLimit, "hop limit")
	equal(t, true, g6.SrcIP.Equal(v6A) && g6.DstIP.Equal(v6B), "addresses")
	gm := pkt.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
	equal(t, uint8(ICMPv6EchoReply), gm.TypeCode.Type(), "icmpv6 type")
	gopacketChecksums(t, frame)

	// ICMPv4.
	frame = make([]byte, EthernetSize+IPv4MinSize+ICMPv4MinSize+32)
	Ethernet(frame).Encode(MAC(macB), MAC(macA), EtherTypeIPv4)
	ip = IPv4(frame[EthernetSize:])
	ip.Encode(&IPv4Fields{TotalLength: uint16(len(frame) - EthernetSize), TTL: 1, Protocol: ProtoICMP, Src: [4]byte(v4A), Dst: [4]byte(v4B)})
	m4 := ICMPv4(ip.Payload())
	m4.SetType(ICMPv4TimeExceeded)
	m4.SetCode(1)
	m4.SetChecksum(m4.CalculateChecksum())
	pkt = gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	gm4 := pkt.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
	equal(t, layers.CreateICMPv4TypeCode(ICMPv4TimeExceeded, 1), gm4.TypeCode, "icmpv4 type code")
	gopacketChecksums(t, frame)
}
