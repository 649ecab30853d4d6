package header

import (
	"encoding/binary"
	"slices"
	"testing"
)

func TestParseEthernet(t *testing.T) {
	eth := func(types ...uint16) []byte {
		b := make([]byte, 12, 40)
		for i, ty := range types {
			b = binary.BigEndian.AppendUint16(b, ty)
			if i < len(types)-1 {
				b = binary.BigEndian.AppendUint16(b, 0x0123) // TCI
			}
		}
		return b
	}
	tests := []struct {
		name    string
		b       []byte
		wantET  uint16
		wantOff int
		wantErr error
	}{
		{"untagged ipv4", eth(EtherTypeIPv4), EtherTypeIPv4, 14, nil},
		{"untagged arp", eth(EtherTypeARP), EtherTypeARP, 14, nil},
		{"802.3 length passes through", eth(0x05dc), 0x05dc, 14, nil},
		{"dot1q ipv6", eth(EtherTypeVLAN, EtherTypeIPv6), EtherTypeIPv6, 18, nil},
		{"qinq", eth(EtherTypeQinQ, EtherTypeVLAN, EtherTypeIPv4), EtherTypeIPv4, 22, nil},
		{"double 8100", eth(EtherTypeVLAN, EtherTypeVLAN, EtherTypeIPv4), EtherTypeIPv4, 22, nil},
		{"three tags", eth(EtherTypeQinQ, EtherTypeVLAN, EtherTypeVLAN, EtherTypeIPv4), 0, 0, ErrExtension},
		{"empty", nil, 0, 0, ErrTruncated},
		{"13 bytes", make([]byte, 13), 0, 0, ErrTruncated},
		{"tag cut", eth(EtherTypeVLAN, EtherTypeIPv4)[:17], 0, 0, ErrTruncated},
		{"second tag cut", eth(EtherTypeQinQ, EtherTypeVLAN, EtherTypeIPv4)[:21], 0, 0, ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			et, off, err := ParseEthernet(tt.b)
			equal(t, tt.wantErr, err, "err")
			equal(t, tt.wantET, et, "ethertype")
			equal(t, tt.wantOff, off, "offset")
		})
	}
}

func TestMAC(t *testing.T) {
	m := MAC{0x02, 0x00, 0x5e, 0xab, 0xcd, 0xef}
	equal(t, "02:00:5e:ab:cd:ef", m.String())
	equal(t, false, m.IsMulticast())
	equal(t, true, MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}.IsBroadcast())
	equal(t, true, MAC{0x01, 0x00, 0x5e, 0, 0, 1}.IsMulticast())
	b := make([]byte, EthernetSize)
	e := Ethernet(b)
	e.SetDst(m)
	e.SetSrc(MAC{1, 2, 3, 4, 5, 6})
	e.SetType(EtherTypeARP)
	equal(t, m, e.Dst())
	equal(t, MAC{1, 2, 3, 4, 5, 6}, e.Src())
	equal(t, uint16(EtherTypeARP), e.Type())
}

func v4Header(mod func(b []byte)) []byte {
	b := make([]byte, 40)
	IPv4(b).Encode(&IPv4Fields{TotalLength: 40, TTL: 64, Protocol: ProtoUDP, Src: [4]byte{198, 18, 0, 1}, Dst: [4]byte{198, 18, 0, 2}})
	if mod != nil {
		mod(b)
	}
	return b
}

func TestIPv4Check(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"valid", v4Header(nil), nil},
		{"padding after total length", append(v4Header(nil), 0, 0, 0, 0), nil},
		{"empty", nil, ErrTruncated},
		{"19 bytes", v4Header(nil)[:19], ErrTruncated},
		{"version 6", v4Header(func(b []byte) { b[0] = 0x65 }), ErrVersion},
		{"ihl 4", v4Header(func(b []byte) { b[0] = 0x44 }), ErrHeaderLength},
		{"ihl 0", v4Header(func(b []byte) { b[0] = 0x40 }), ErrHeaderLength},
		{"ihl beyond slice", v4Header(func(b []byte) { b[0] = 0x4f }), ErrTruncated},
		{"total length below header", v4Header(func(b []byte) { b[3] = 19 }), ErrTotalLength},
		{"total length below options", v4Header(func(b []byte) { b[0] = 0x46; b[3] = 20 }), ErrTotalLength},
		{"total length beyond slice", v4Header(func(b []byte) { b[3] = 41 }), ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { equal(t, tt.want, IPv4(tt.b).Check()) })
	}
}

func TestIPv4Accessors(t *testing.T) {
	ip := IPv4(v4Header(nil))
	equal(t, true, ip.IsChecksumValid())
	ip.SetTTLWithChecksumUpdate(1)
	equal(t, uint8(1), ip.TTL())
	equal(t, true, ip.IsChecksumValid(), "after TTL update")
	ip.SetSrcWithChecksumUpdate([4]byte{198, 19, 255, 255})
	ip.SetDstWithChecksumUpdate([4]byte{0, 0, 0, 0})
	equal(t, true, ip.IsChecksumValid(), "after address updates")
	equal(t, ip.CalculateChecksum(), ip.Checksum())
	ip.SetSrc([4]byte{1, 1, 1, 1})
	equal(t, false, ip.IsChecksumValid(), "SetSrc leaves the checksum")
	equal(t, false, ip.IsFragment())
	equal(t, 20, len(ip.Payload()))
	equal(t, 0, len(ip.Options()))
	s := ip.SrcSlice()
	s[0] = 9
	equal(t, [4]byte{9, 1, 1, 1}, ip.Src(), "SrcSlice is a view")
}

// ext builds an IPv6 packet whose payload is the given extension headers
// followed by 20 bytes of "transport".
func ext(first uint8, hdrs ...[]byte) []byte {
	b := make([]byte, IPv6Size)
	IPv6(b).Encode(&IPv6Fields{NextHeader: first, HopLimit: 1})
	for _, h := range hdrs {
		b = append(b, h...)
	}
	b = append(b, make([]byte, 20)...)
	IPv6(b).SetPayloadLength(uint16(len(b) - IPv6Size))
	return b
}

func opt(next uint8, lenUnits uint8) []byte {
	h := make([]byte, (int(lenUnits)+1)*8)
	h[0], h[1] = next, lenUnits
	return h
}

func fragHdr(next uint8, off uint16, more bool) []byte {
	h := make([]byte, 8)
	h[0] = next
	v := off &^ 7
	if more {
		v |= 1
	}
	binary.BigEndian.PutUint16(h[2:], v)
	binary.BigEndian.PutUint32(h[4:], 0x01020304)
	return h
}

func TestIPv6TransportHeader(t *testing.T) {
	// chain returns n Destination Options headers, the last one followed
	// by UDP.
	chain := func(n int) [][]byte {
		hs := make([][]byte, n)
		for i := range hs {
			hs[i] = opt(ProtoDestOpts, 0)
		}
		hs[n-1][0] = ProtoUDP
		return hs
	}
	trunc := ext(ProtoRouting, opt(ProtoTCP, 3))
	trunc = trunc[:IPv6Size+16]
	IPv6(trunc).SetPayloadLength(16)

	tests := []struct {
		name      string
		b         []byte
		wantProto uint8
		wantOff   int
		wantFrag  IPv6Frag
		wantErr   error
	}{
		{"no extensions", ext(ProtoTCP), ProtoTCP, 40, IPv6Frag{}, nil},
		{"hbh", ext(ProtoHopByHop, opt(ProtoUDP, 0)), ProtoUDP, 48, IPv6Frag{}, nil},
		{"hbh dest routing dest", ext(ProtoHopByHop, opt(ProtoDestOpts, 1), opt(ProtoRouting, 0), opt(ProtoDestOpts, 2), opt(ProtoICMPv6, 0)), ProtoICMPv6, 40 + 16 + 8 + 24 + 8, IPv6Frag{}, nil},
		{"first fragment", ext(ProtoFragment, fragHdr(ProtoTCP, 0, true)), ProtoTCP, 48, IPv6Frag{Present: true, More: true, ID: 0x01020304}, nil},
		{"atomic fragment", ext(ProtoFragment, fragHdr(ProtoTCP, 0, false)), ProtoTCP, 48, IPv6Frag{Present: true, ID: 0x01020304}, nil},
		{"non-first fragment stops", ext(ProtoFragment, fragHdr(ProtoHopByHop, 1232, false)), ProtoHopByHop, 48, IPv6Frag{Present: true, Offset: 1232, ID: 0x01020304}, nil},
		{"first fragment then dest opts", ext(ProtoFragment, fragHdr(ProtoDestOpts, 0, true), opt(ProtoUDP, 0)), ProtoUDP, 56, IPv6Frag{Present: true, More: true, ID: 0x01020304}, nil},
		{"ah not walked", ext(ProtoAH, opt(ProtoTCP, 0)), ProtoAH, 40, IPv6Frag{}, nil},
		{"esp not walked", ext(ProtoDestOpts, opt(ProtoESP, 0)), ProtoESP, 48, IPv6Frag{}, nil},
		{"no next header", ext(ProtoNoNext), ProtoNoNext, 40, IPv6Frag{}, nil},
		{"limit reached exactly", ext(ProtoDestOpts, chain(IPv6MaxExtensionHeaders)...), ProtoUDP, 40 + 8*IPv6MaxExtensionHeaders, IPv6Frag{}, nil},
		{"too many", ext(ProtoDestOpts, chain(IPv6MaxExtensionHeaders+1)...), 0, 0, IPv6Frag{}, ErrExtension},
		{"hbh not first", ext(ProtoDestOpts, opt(ProtoHopByHop, 0), opt(ProtoTCP, 0)), 0, 0, IPv6Frag{}, ErrExtension},
		{"two fragment headers", ext(ProtoFragment, fragHdr(ProtoFragment, 0, true), fragHdr(ProtoTCP, 0, true)), 0, 0, IPv6Frag{}, ErrExtension},
		{"extension past payload", trunc, 0, 0, IPv6Frag{}, ErrExtension},
		{"extension header cut below 8", func() []byte {
			b := ext(ProtoDestOpts)[:IPv6Size+4]
			IPv6(b).SetPayloadLength(4)
			return b
		}(), 0, 0, IPv6Frag{}, ErrExtension},
		{"short", make([]byte, 39), 0, 0, IPv6Frag{}, ErrTruncated},
		{"payload length past slice", func() []byte { b := ext(ProtoTCP); IPv6(b).SetPayloadLength(100); return b }(), 0, 0, IPv6Frag{}, ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, off, frag, err := IPv6(tt.b).TransportHeader()
			equal(t, tt.wantErr, err, "err")
			equal(t, tt.wantProto, p, "proto")
			equal(t, tt.wantOff, off, "offset")
			equal(t, tt.wantFrag, frag, "frag")
		})
	}
	equal(t, true, IPv6Frag{Present: true, Offset: 8}.NonFirst())
	equal(t, false, IPv6Frag{Present: true, More: true}.NonFirst())
	equal(t, true, IPv6Frag{Present: true, More: true}.IsFragment())
	equal(t, false, IPv6Frag{Present: true}.IsFragment())
}

// TestIPv6QuotedTransportHeader: the packet an ICMPv6 error quotes is cut
// short of its Payload Length; its extension chain is walked as far as the
// quote goes. TransportHeader refuses such a packet (ErrTruncated).
func TestIPv6QuotedTransportHeader(t *testing.T) {
	// quoted is a packet of 1400 bytes of payload behind hdrs, cut after n
	// bytes (its Payload Length kept).
	quoted := func(n int, first uint8, hdrs ...[]byte) []byte {
		b := ext(first, hdrs...)
		IPv6(b).SetPayloadLength(1400)
		return b[:n]
	}
	// Hop-by-Hop (16 bytes), Routing (8), Fragment (8), then TCP at 72.
	chain := [][]byte{opt(ProtoRouting, 1), opt(ProtoFragment, 0), fragHdr(ProtoTCP, 0, true)}
	first := IPv6Frag{Present: true, More: true, ID: 0x01020304}
	tests := []struct {
		name      string
		b         []byte
		wantProto uint8
		wantOff   int
		wantFrag  IPv6Frag
		wantErr   error
	}{
		{"no extensions", quoted(48, ProtoTCP), ProtoTCP, 40, IPv6Frag{}, nil},
		{"chain and ports", quoted(72+4, ProtoHopByHop, chain...), ProtoTCP, 72, first, nil},
		{"chain, nothing after", quoted(72, ProtoHopByHop, chain...), ProtoTCP, 72, first, nil},
		{"cut in the fragment header", quoted(72-1, ProtoHopByHop, chain...), 0, 0, IPv6Frag{}, ErrExtension},
		{"cut in a header's first 8 bytes", quoted(40+4, ProtoHopByHop, chain...), 0, 0, IPv6Frag{}, ErrExtension},
		{"cut past a header's first 8 bytes", quoted(40+8+10, ProtoHopByHop, chain...), 0, 0, IPv6Frag{}, ErrExtension},
		{"non-first fragment", quoted(40+8+4, ProtoFragment, fragHdr(ProtoDestOpts, 1232, false)), ProtoDestOpts, 48, IPv6Frag{Present: true, Offset: 1232, ID: 0x01020304}, nil},
		{"too many", quoted(40+8*(IPv6MaxExtensionHeaders+1)+4, ProtoDestOpts, slices.Repeat([][]byte{opt(ProtoDestOpts, 0)}, IPv6MaxExtensionHeaders+1)...), 0, 0, IPv6Frag{}, ErrExtension},
		{"hbh not first", quoted(40+16+4, ProtoDestOpts, opt(ProtoHopByHop, 0), opt(ProtoTCP, 0)), 0, 0, IPv6Frag{}, ErrExtension},
		{"chain past payload length", func() []byte {
			b := ext(ProtoDestOpts, opt(ProtoTCP, 1))
			IPv6(b).SetPayloadLength(8) // the 16-byte header runs past it, not past b
			return b
		}(), 0, 0, IPv6Frag{}, ErrExtension},
		{"short", make([]byte, 39), 0, 0, IPv6Frag{}, ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, off, frag, _, err := IPv6(tt.b).QuotedTransportHeader()
			equal(t, tt.wantErr, err, "err")
			equal(t, tt.wantProto, p, "proto")
			equal(t, tt.wantOff, off, "offset")
			equal(t, tt.wantFrag, frag, "frag")
		})
	}
}

func TestIPv6Check(t *testing.T) {
	good := ext(ProtoTCP)
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"valid", good, nil},
		{"padding", append(append([]byte(nil), good...), 0, 0), nil},
		{"short", good[:39], ErrTruncated},
		{"version 4", func() []byte { b := append([]byte(nil), good...); b[0] = 0x45; return b }(), ErrVersion},
		{"payload past slice", good[:len(good)-1], ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { equal(t, tt.want, IPv6(tt.b).Check()) })
	}
}

func TestTransportChecks(t *testing.T) {
	udp := func(length uint16, n int) []byte {
		b := make([]byte, n)
		binary.BigEndian.PutUint16(b[4:], length)
		return b
	}
	tcp := func(doff uint8, n int) []byte {
		b := make([]byte, n)
		b[12] = doff << 4
		return b
	}
	vx := func(flags uint8, n int) []byte {
		b := make([]byte, n)
		b[0] = flags
		return b
	}
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"udp ok", UDP(udp(8, 8)).Check(), nil},
		{"udp ok shorter length", UDP(udp(9, 20)).Check(), nil},
		{"udp short", UDP(udp(8, 8)[:7]).Check(), ErrTruncated},
		{"udp length < 8", UDP(udp(7, 8)).Check(), ErrTotalLength},
		{"udp length > slice", UDP(udp(21, 20)).Check(), ErrTruncated},
		{"tcp ok", TCP(tcp(5, 20)).Check(), nil},
		{"tcp ok options", TCP(tcp(15, 60)).Check(), nil},
		{"tcp short", TCP(tcp(5, 20)[:19]).Check(), ErrTruncated},
		{"tcp doff 4", TCP(tcp(4, 20)).Check(), ErrHeaderLength},
		{"tcp doff beyond", TCP(tcp(6, 23)).Check(), ErrTruncated},
		{"icmpv4 ok", ICMPv4(make([]byte, 8)).Check(), nil},
		{"icmpv4 short", ICMPv4(make([]byte, 7)).Check(), ErrTruncated},
		{"icmpv6 ok", ICMPv6(make([]byte, 8)).Check(), nil},
		{"icmpv6 short", ICMPv6(make([]byte, 7)).Check(), ErrTruncated},
		{"vxlan ok", VXLAN(vx(0x08, 8)).Check(), nil},
		{"vxlan reserved bits tolerated", VXLAN(vx(0xff, 8)).Check(), nil},
		{"vxlan no I flag", VXLAN(vx(0xf7, 8)).Check(), ErrFlags},
		{"vxlan short", VXLAN(vx(0x08, 7)).Check(), ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { equal(t, tt.want, tt.err) })
	}
}

func TestVXLANEncode(t *testing.T) {
	b := make([]byte, 8)
	for i := range b {
		b[i] = 0xff
	}
	v := VXLAN(b)
	v.Encode(0x1abcdef) // high bits dropped
	equal(t, [8]byte{0x08, 0, 0, 0, 0xab, 0xcd, 0xef, 0}, [8]byte(b))
	equal(t, uint32(0xabcdef), v.VNI())
	b[7] = 0x5a
	v.SetVNI(1)
	equal(t, uint32(1), v.VNI())
	equal(t, byte(0x5a), b[7], "reserved byte kept")
}

func TestUDPZeroChecksumRule(t *testing.T) {
	// A datagram whose correct checksum is 0x0000 must be sent as 0xFFFF.
	// Find a payload word that makes the sum -0.
	src, dst := []byte{198, 18, 0, 1}, []byte{198, 18, 0, 2}
	u := UDP(make([]byte, 10))
	u.Encode(1000, 2000, 10)
	ph := PseudoHeaderChecksum(ProtoUDP, src, dst, 10)
	s := Checksum(u, ph)
	binary.BigEndian.PutUint16(u[8:], ^s) // now the sum is 0xffff: checksum 0
	equal(t, uint16(0xffff), u.CalculateChecksum(ph), "computed zero stored as all ones")
	u.SetChecksum(0xffff)
	equal(t, true, u.IsChecksumValid(ph))
	// Incremental updates that land on 0 also store 0xffff, and from
	// 0xffff continue to agree with recomputation.
	for p := 0; p < 65536; p += 97 {
		u.SetSrcPortWithChecksumUpdate(uint16(p))
		c := u.Checksum()
		if c == 0 {
			t.Fatalf("stored 0")
		}
		equal(t, u.CalculateChecksum(ph), c, "port %d", p)
	}
	// A zero checksum ("none" over IPv4) is left alone.
	u.SetChecksum(0)
	u.SetDstPortWithChecksumUpdate(5)
	u.UpdateChecksumPseudoHeaderAddress(src, dst)
	equal(t, uint16(0), u.Checksum())
}

// TestIPv6QuotedTransportHeaderRouted: routed reports a Routing header
// with segments left in the quoted chain, and only then.
func TestIPv6QuotedTransportHeaderRouted(t *testing.T) {
	for _, left := range []byte{0, 1} {
		r := opt(ProtoTCP, 0)
		r[3] = left
		b := ext(ProtoDestOpts, opt(ProtoRouting, 0), r)
		b = b[:len(b)-16] // the quote ends in the TCP header
		p, off, _, routed, err := IPv6(b).QuotedTransportHeader()
		equal(t, nil, err, "err")
		equal(t, uint8(ProtoTCP), p, "proto")
		equal(t, 56, off, "offset")
		equal(t, left != 0, routed, "routed, segments left %d", left)
	}
}
