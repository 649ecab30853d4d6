package header

import "testing"

// sink keeps results alive so the compiler cannot drop the calls.
var (
	sinkU16 uint16
	sinkInt int
	sinkErr error
)

// TestNoAllocs guards the zero-allocation promise of every accessor,
// Check, checksum, update and rewrite.
func TestNoAllocs(t *testing.T) {
	g := goldenFrames(t)
	frame := func(name string) []byte {
		for _, f := range g {
			if f.name == name {
				return append([]byte(nil), f.frame...)
			}
		}
		t.Fatalf("no frame %q", name)
		return nil
	}
	v4tcp := frame("qinq ipv4 options tcp options")
	_, l3, _ := ParseEthernet(v4tcp)
	ip4 := IPv4(v4tcp[l3:])
	tcp := TCP(ip4.Payload())
	v6 := frame("ipv6 hbh destopts routing fragment tcp")
	ip6 := IPv6(v6[EthernetSize:])
	v6udp := frame("ipv6 udp")
	ip6u := IPv6(v6udp[EthernetSize:])
	udp6 := UDP(ip6u.Payload())
	vx := frame("vxlan inner dot1q ipv4 tcp")
	icmp := ICMPv6(IPv6(frame("ipv6 icmpv6 echo")[EthernetSize:]).Payload())
	buf := make([]byte, 1500)
	a4, a16 := [4]byte{198, 18, 9, 9}, [16]byte{0x20, 0x01, 0x0d, 0xb8, 9}
	mac := MAC{2, 0, 0, 0, 0, 9}

	tests := []struct {
		name string
		fn   func()
	}{
		{"ParseEthernet", func() { _, sinkInt, sinkErr = ParseEthernet(v4tcp) }},
		{"Ethernet accessors", func() {
			e := Ethernet(v4tcp)
			e.SetDst(e.Src())
			e.SetSrc(mac)
			sinkU16 = e.Type()
		}},
		{"IPv4 Check and accessors", func() {
			sinkErr = ip4.Check()
			sinkInt = ip4.HeaderLength() + len(ip4.Payload()) + len(ip4.Options())
			sinkU16 = ip4.TotalLength() + ip4.ID() + ip4.FragmentOffset() + uint16(ip4.TTL()+ip4.Protocol()+ip4.TOS()+ip4.Flags())
			_ = ip4.IsFragment() || ip4.IsNonFirstFragment() || ip4.MoreFragments() || ip4.DontFragment()
			s, d := ip4.Src(), ip4.Dst()
			sinkInt += int(s[0]) + int(d[0]) + len(ip4.SrcSlice()) + len(ip4.DstSlice())
		}},
		{"IPv4 checksum", func() {
			ip4.SetChecksum(ip4.CalculateChecksum())
			_ = ip4.IsChecksumValid()
			ip4.SetTTLWithChecksumUpdate(ip4.TTL())
		}},
		{"IPv4 address update", func() { ip4.SetSrcWithChecksumUpdate(a4); ip4.SetDstWithChecksumUpdate(a4) }},
		{"IPv4 Encode", func() { IPv4(buf).Encode(&IPv4Fields{TotalLength: 100, TTL: 1, Src: a4, Dst: a4}) }},
		{"IPv6 Check and accessors", func() {
			sinkErr = ip6.Check()
			sinkU16 = ip6.PayloadLength() + uint16(ip6.NextHeader()+ip6.HopLimit()+ip6.TrafficClass())
			sinkInt = int(ip6.FlowLabel()) + len(ip6.Payload()) + len(ip6.SrcSlice()) + len(ip6.DstSlice())
			s, d := ip6.Src(), ip6.Dst()
			sinkInt += int(s[15]) + int(d[15])
		}},
		{"IPv6 TransportHeader", func() { _, sinkInt, _, sinkErr = ip6.TransportHeader() }},
		{"IPv6 QuotedTransportHeader", func() { _, sinkInt, _, _, sinkErr = IPv6(ip6[:IPv6Size+20]).QuotedTransportHeader() }},
		{"IPv6 Encode", func() { IPv6(buf).Encode(&IPv6Fields{PayloadLength: 10, Src: a16, Dst: a16}) }},
		{"TCP", func() {
			sinkErr = tcp.Check()
			sinkU16 = tcp.SrcPort() + tcp.DstPort() + tcp.Window() + tcp.Checksum() + uint16(tcp.Flags())
			sinkInt = tcp.DataOffset() + int(tcp.SeqNum()+tcp.AckNum()) + len(tcp.Payload()) + len(tcp.Options())
		}},
		{"TCP checksum", func() {
			ph := PseudoHeaderChecksum(ProtoTCP, ip4.SrcSlice(), ip4.DstSlice(), uint16(len(tcp)))
			tcp.SetChecksum(tcp.CalculateChecksum(ph))
			_ = tcp.IsChecksumValid(ph)
		}},
		{"TCP updates", func() {
			tcp.UpdateChecksumPseudoHeaderAddress(ip4.SrcSlice(), a4[:])
			tcp.SetSrcPortWithChecksumUpdate(1)
			tcp.SetDstPortWithChecksumUpdate(2)
		}},
		{"UDP", func() {
			sinkErr = udp6.Check()
			sinkU16 = udp6.SrcPort() + udp6.DstPort() + udp6.Length() + udp6.Checksum()
			sinkInt = len(udp6.Payload())
			ph := PseudoHeaderChecksum(ProtoUDP, ip6u.SrcSlice(), ip6u.DstSlice(), udp6.Length())
			udp6.SetChecksum(udp6.CalculateChecksum(ph))
			_ = udp6.IsChecksumValid(ph)
			udp6.UpdateChecksumPseudoHeaderAddress(ip6u.SrcSlice(), a16[:])
			udp6.SetSrcPortWithChecksumUpdate(3)
			udp6.SetDstPortWithChecksumUpdate(4)
		}},
		{"ICMPv6", func() {
			sinkErr = icmp.Check()
			sinkU16 = icmp.Ident() + icmp.Sequence() + uint16(icmp.Type()+icmp.Code()) + icmp.Checksum()
			sinkInt = int(icmp.MTU()) + len(icmp.Payload())
			icmp.UpdateChecksumPseudoHeaderAddress(a16[:], a16[:])
		}},
		{"ICMPv4", func() {
			m := ICMPv4(buf[:64])
			sinkErr = m.Check()
			m.SetChecksum(m.CalculateChecksum())
			sinkU16 = m.Ident() + m.Sequence() + m.MTU() + uint16(m.Type()+m.Code())
			_ = m.IsChecksumValid()
		}},
		{"VXLAN", func() {
			v := VXLAN(buf[:16])
			v.Encode(77)
			sinkErr = v.Check()
			v.SetVNI(v.VNI() + 1)
			sinkInt = int(v.Flags()) + len(v.Payload())
		}},
		{"Checksum 1500", func() { sinkU16 = Checksum(buf, 0) }},
		{"Checksum helpers", func() {
			sinkU16 = ChecksumCombine(PseudoHeaderChecksum(ProtoUDP, a16[:], a16[:], 9), ChecksumUpdate16(1, 2, 3))
			sinkU16 += ChecksumUpdate(sinkU16, a16[:], a16[:])
		}},
		{"RewriteIPv4", func() {
			sinkErr = RewriteIPv4(ip4, SideSrc, a4, 1)
			sinkErr = RewriteIPv4(ip4, SideDst, a4, 2)
		}},
		{"RewriteIPv6", func() { sinkErr = RewriteIPv6(ip6u, IPv6Size, ProtoUDP, SideDst, a16, 5) }},
		{"RewriteIPv6Packet", func() { sinkErr = RewriteIPv6Packet(ip6, SideSrc, a16, 6) }},
		{"VXLAN frame walk", func() {
			_, off, _ := ParseEthernet(vx)
			ip := IPv4(vx[off:])
			sinkErr = ip.Check()
			u := UDP(ip.Payload())
			sinkErr = u.Check()
			sinkInt = int(VXLAN(u.Payload()).VNI())
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if n := testing.AllocsPerRun(100, tt.fn); n != 0 {
				t.Fatalf("%v allocs per run, want 0", n)
			}
		})
	}
}
