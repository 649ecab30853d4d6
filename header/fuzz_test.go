package header

import (
	"encoding/binary"
	"testing"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// Fuzz targets. `go test` runs the seed corpus of each; run one with
// `go test -run=^$ -fuzz=^FuzzIPv4$ -fuzztime=10s ./header`.

// addGoldenSeeds adds every golden frame, and the frame from its L3
// header on, as seeds.
func addGoldenSeeds(f *testing.F, l3 bool) {
	for _, g := range goldenFrames(f) {
		if !l3 {
			f.Add(g.frame)
			continue
		}
		_, off, err := ParseEthernet(g.frame)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(g.frame[off:])
	}
}

// walkFrame exercises every accessor that a passing Check makes safe, down
// through VXLAN into inner frames. Any out-of-bounds access panics and
// fails the fuzzer.
func walkFrame(t *testing.T, b []byte) {
	for depth := 0; depth < 4; depth++ {
		et, off, err := ParseEthernet(b)
		if err != nil {
			return
		}
		if off > len(b) || (off != 14 && off != 18 && off != 22) {
			t.Fatalf("l3 offset %d for %d bytes", off, len(b))
		}
		e := Ethernet(b)
		_, _, _ = e.Dst(), e.Src(), e.Type()
		var l4 []byte
		var proto uint8
		switch et {
		case EtherTypeIPv4:
			ip := IPv4(b[off:])
			if ip.Check() != nil {
				return
			}
			touchIPv4(ip)
			if ip.IsNonFirstFragment() {
				return
			}
			l4, proto = ip.Payload(), ip.Protocol()
		case EtherTypeIPv6:
			ip := IPv6(b[off:])
			if ip.Check() != nil {
				return
			}
			p, l4off, frag, err := ip.TransportHeader()
			if err != nil || frag.NonFirst() {
				return
			}
			l4, proto = ip[l4off:IPv6Size+int(ip.PayloadLength())], p
		default:
			return
		}
		switch proto {
		case ProtoTCP:
			touchTCP(TCP(l4))
		case ProtoICMP:
			touchICMPv4(ICMPv4(l4))
		case ProtoICMPv6:
			touchICMPv6(ICMPv6(l4))
		case ProtoUDP:
			u := UDP(l4)
			if !touchUDP(u) || u.DstPort() != VXLANPort {
				return
			}
			v := VXLAN(u.Payload())
			if !touchVXLAN(v) {
				return
			}
			b = v.Payload()
		}
	}
}

func touchIPv4(ip IPv4) {
	_ = ip.HeaderLength() + len(ip.Options()) + len(ip.Payload()) + len(ip.SrcSlice()) + len(ip.DstSlice())
	_ = ip.TotalLength() + ip.ID() + ip.FragmentOffset() + ip.Checksum() + ip.CalculateChecksum()
	_ = ip.TOS() + ip.TTL() + ip.Protocol() + ip.Flags()
	_, _, _, _, _ = ip.IsFragment(), ip.IsNonFirstFragment(), ip.MoreFragments(), ip.DontFragment(), ip.IsChecksumValid()
	_, _ = ip.Src(), ip.Dst()
}

func touchTCP(t TCP) bool {
	if t.Check() != nil {
		return false
	}
	_ = t.SrcPort() + t.DstPort() + t.Window() + t.Checksum() + t.UrgentPointer() + t.CalculateChecksum(0)
	_ = t.SeqNum() + t.AckNum()
	_ = t.DataOffset() + len(t.Options()) + len(t.Payload()) + int(t.Flags())
	return true
}

func touchUDP(u UDP) bool {
	if u.Check() != nil {
		return false
	}
	_ = u.SrcPort() + u.DstPort() + u.Length() + u.Checksum() + u.CalculateChecksum(0)
	_ = len(u.Payload())
	return true
}

func touchICMPv4(m ICMPv4) bool {
	if m.Check() != nil {
		return false
	}
	_ = m.Type() + m.Code()
	_ = m.Checksum() + m.Ident() + m.Sequence() + m.MTU() + m.CalculateChecksum()
	_ = len(m.Payload())
	return true
}

func touchICMPv6(m ICMPv6) bool {
	if m.Check() != nil {
		return false
	}
	_ = m.Type() + m.Code()
	_ = m.Checksum() + m.Ident() + m.Sequence() + m.CalculateChecksum(0)
	_ = m.MTU()
	_ = len(m.Payload())
	return true
}

func touchVXLAN(v VXLAN) bool {
	if v.Check() != nil {
		return false
	}
	_ = v.VNI() + uint32(v.Flags())
	_ = len(v.Payload())
	return true
}

func FuzzParseEthernet(f *testing.F) {
	addGoldenSeeds(f, false)
	f.Add([]byte{})
	f.Add(make([]byte, 13))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x81, 0x00, 0, 1, 0x88, 0xa8, 0, 2, 0x81, 0x00, 0, 3, 0x08, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		walkFrame(t, b)
	})
}

func FuzzIPv4(f *testing.F) {
	for _, g := range goldenFrames(f) {
		if _, off, _ := ParseEthernet(g.frame); Ethernet(g.frame[off-2:]).Type() == EtherTypeIPv4 {
			f.Add(g.frame[off:])
		}
	}
	f.Add(v4Header(nil))
	f.Add(v4Header(func(b []byte) { b[0] = 0x4f }))
	f.Add([]byte{0x45})
	f.Fuzz(func(t *testing.T, b []byte) {
		ip := IPv4(b)
		if ip.Check() != nil {
			return
		}
		touchIPv4(ip)
		if hl, tl := ip.HeaderLength(), int(ip.TotalLength()); hl < IPv4MinSize || hl > tl || tl > len(b) {
			t.Fatalf("Check passed with hl %d tl %d len %d", hl, tl, len(b))
		}
		// After storing the computed checksum it verifies, and the
		// incremental updates keep it verifying.
		ip.SetChecksum(ip.CalculateChecksum())
		if !ip.IsChecksumValid() {
			t.Fatalf("computed checksum does not verify")
		}
		ip.SetTTLWithChecksumUpdate(ip.TTL() - 1)
		ip.SetSrcWithChecksumUpdate(ip.Dst())
		ip.SetDstWithChecksumUpdate([4]byte{198, 18, 0, 7})
		if !ip.IsChecksumValid() || ip.Checksum() != ip.CalculateChecksum() {
			t.Fatalf("incremental update disagrees: stored %#04x computed %#04x", ip.Checksum(), ip.CalculateChecksum())
		}
	})
}

func FuzzIPv6TransportHeader(f *testing.F) {
	for _, g := range goldenFrames(f) {
		if _, off, _ := ParseEthernet(g.frame); Ethernet(g.frame[off-2:]).Type() == EtherTypeIPv6 {
			f.Add(g.frame[off:])
		}
	}
	f.Add(ext(ProtoHopByHop, opt(ProtoDestOpts, 1), opt(ProtoRouting, 0), fragHdr(ProtoDestOpts, 0, true), opt(ProtoTCP, 0)))
	f.Add(ext(ProtoFragment, fragHdr(ProtoUDP, 8, true)))
	f.Add(make([]byte, 40))
	// An ICMPv6 error's quote: Destination Options and a first Fragment
	// header, cut after the TCP ports, its Payload Length the packet's.
	quote := ext(ProtoDestOpts, opt(ProtoFragment, 0), fragHdr(ProtoTCP, 0, true))
	IPv6(quote).SetPayloadLength(1400)
	f.Add(quote[:IPv6Size+16+4])
	f.Fuzz(func(t *testing.T, b []byte) {
		ip := IPv6(b)
		proto, off, frag, err := ip.TransportHeader()
		// The same packet as an ICMPv6 error's quote: walked alike when it
		// is whole; otherwise within what the quote holds.
		qproto, qoff, qfrag, _, qerr := ip.QuotedTransportHeader()
		switch {
		case err == nil && (qerr != nil || qproto != proto || qoff != off || qfrag != frag):
			t.Fatalf("whole packet: TransportHeader %d %d %+v, QuotedTransportHeader %d %d %+v %v", proto, off, frag, qproto, qoff, qfrag, qerr)
		case qerr != nil && (qoff != 0 || qproto != 0 || qfrag.Present):
			t.Fatalf("quote: error %v with results %d %d %+v", qerr, qproto, qoff, qfrag)
		case qerr == nil && (qoff < IPv6Size || qoff > len(b)):
			t.Fatalf("quote: offset %d outside [40, %d]", qoff, len(b))
		}
		if err != nil {
			if off != 0 || proto != 0 || frag.Present {
				t.Fatalf("error %v with results %d %d %+v", err, proto, off, frag)
			}
			return
		}
		end := IPv6Size + int(ip.PayloadLength())
		if off < IPv6Size || off > end || end > len(b) {
			t.Fatalf("offset %d outside [40, %d] (len %d)", off, end, len(b))
		}
		if off != IPv6Size && (off-IPv6Size)%8 != 0 {
			t.Fatalf("offset %d not a multiple of 8 past the header", off)
		}
		switch proto {
		case ProtoHopByHop, ProtoRouting, ProtoDestOpts, ProtoFragment:
			if !frag.NonFirst() {
				t.Fatalf("returned extension header %d as transport", proto)
			}
		}
		if ip.Check() == nil {
			_ = ip.TrafficClass() + ip.HopLimit() + ip.NextHeader()
			_ = ip.FlowLabel()
			_, _ = ip.Src(), ip.Dst()
			_ = len(ip.Payload())
		}
	})
}

func FuzzTCP(f *testing.F) {
	f.Add(make([]byte, 20))
	f.Add([]byte{0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0x12, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if touchTCP(TCP(b)) && TCP(b).DataOffset() > len(b) {
			t.Fatalf("data offset past slice")
		}
	})
}

func FuzzUDP(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 0, 8, 0, 0})
	f.Add([]byte{0, 1, 0, 2, 0, 9, 0, 0, 7})
	f.Fuzz(func(t *testing.T, b []byte) {
		if touchUDP(UDP(b)) && int(UDP(b).Length()) > len(b) {
			t.Fatalf("length past slice")
		}
	})
}

func FuzzICMP(f *testing.F) {
	f.Add([]byte{8, 0, 0, 0, 0, 1, 0, 2})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 5, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		touchICMPv4(ICMPv4(b))
		touchICMPv6(ICMPv6(b))
		if ICMPv4(b).Check() == nil {
			m := ICMPv4(b)
			m.SetChecksum(m.CalculateChecksum())
			if !m.IsChecksumValid() {
				t.Fatalf("icmp checksum does not verify")
			}
		}
	})
}

func FuzzVXLAN(f *testing.F) {
	f.Add([]byte{0x08, 0, 0, 0, 0, 0, 1, 0})
	f.Add([]byte{0x00, 0, 0, 0, 0, 0, 1, 0, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if touchVXLAN(VXLAN(b)) && VXLAN(b).Flags()&VXLANFlagVNI == 0 {
			t.Fatalf("Check passed without the I flag")
		}
	})
}

func FuzzChecksum(f *testing.F) {
	f.Add([]byte{}, uint16(0), uint8(0))
	f.Add([]byte{0xff, 0xff, 0xff}, uint16(0xffff), uint8(3))
	f.Add(make([]byte, 1500), uint16(1), uint8(7))
	f.Fuzz(func(t *testing.T, b []byte, initial uint16, shift uint8) {
		// Re-place b at each alignment the fuzzer picks.
		buf := make([]byte, len(b)+8)
		s := int(shift % 8)
		copy(buf[s:], b)
		c := buf[s : s+len(b)]
		if got, want := Checksum(c, initial), gpkt.Sum(c, initial); got != want {
			t.Fatalf("Checksum %#04x, reference %#04x (len %d, align %d)", got, want, len(b), s)
		}
	})
}

// rewriteInput builds a valid IPv4 packet from fuzz input: header with
// optional options, transport header and data from payload, correct
// checksums. zeroUDP leaves a UDP checksum at 0.
func rewriteInput(payload []byte, proto uint8, optWords uint8, frag uint16, zeroUDP bool) IPv4 {
	hl := IPv4MinSize + 4*int(optWords%11)
	b := make([]byte, hl+len(payload))
	copy(b[hl:], payload)
	ip := IPv4(b)
	ip.Encode(&IPv4Fields{TotalLength: uint16(len(b)), ID: 1, TTL: 64, Protocol: proto,
		Flags: uint8(frag>>13) & IPv4FlagMoreFragments, FragmentOffset: (frag & 0x1fff) << 3,
		Src: [4]byte{198, 18, payload0(payload), 1}, Dst: [4]byte{198, 19, 0, 2}})
	b[0] = 0x40 | byte(hl/4)
	for i := IPv4MinSize; i < hl; i++ {
		b[i] = 1 // NOP options
	}
	ip.SetChecksum(ip.CalculateChecksum())
	if ip.IsNonFirstFragment() {
		return ip
	}
	l4 := ip.Payload()
	ph := PseudoHeaderChecksum(proto, ip.SrcSlice(), ip.DstSlice(), uint16(len(l4)))
	switch proto {
	case ProtoTCP:
		if len(l4) >= TCPMinSize {
			TCP(l4).SetChecksum(TCP(l4).CalculateChecksum(ph))
		}
	case ProtoUDP:
		if len(l4) >= UDPSize {
			u := UDP(l4)
			u.SetLength(uint16(len(l4)))
			u.SetChecksum(0)
			if !zeroUDP {
				u.SetChecksum(u.CalculateChecksum(ph))
			}
		}
	}
	return ip
}

func payload0(p []byte) byte {
	if len(p) == 0 {
		return 0
	}
	return p[0]
}

func FuzzRewrite(f *testing.F) {
	f.Add([]byte("0123456789abcdefghijklmnopqrstuvwxyz"), uint8(ProtoTCP), uint8(0), uint16(0), false, uint8(SideSrc), uint16(443), uint32(0xc6120101))
	f.Add([]byte("0123456789"), uint8(ProtoUDP), uint8(3), uint16(0), false, uint8(SideDst), uint16(0), uint32(0xffffffff))
	f.Add([]byte("0123456789"), uint8(ProtoUDP), uint8(0), uint16(0), true, uint8(SideDst), uint16(53), uint32(0))
	f.Add([]byte("0123456789abcdefghijklmnopqrstuvwxyz"), uint8(ProtoTCP), uint8(1), uint16(0x2000), false, uint8(SideSrc), uint16(1), uint32(7))
	f.Add([]byte("fragment data"), uint8(ProtoTCP), uint8(0), uint16(0x0010), false, uint8(SideDst), uint16(1), uint32(7))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, uint8(ProtoUDP), uint8(0), uint16(0), false, uint8(SideSrc), uint16(0xffff), uint32(0xffffffff))
	f.Fuzz(func(t *testing.T, payload []byte, proto uint8, optWords uint8, frag uint16, zeroUDP bool, side uint8, port uint16, addr uint32) {
		if len(payload) > 2000 {
			return
		}
		switch proto % 3 {
		case 0:
			proto = ProtoTCP
		case 1:
			proto = ProtoUDP
		default:
			proto = ProtoICMP
		}
		ip := rewriteInput(payload, proto, optWords, frag, zeroUDP)
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], addr)
		sd := Side(side % 2)
		l4 := ip.Payload()
		wantErr := !ip.IsNonFirstFragment() && ((proto == ProtoTCP && len(l4) < TCPMinSize) || (proto == ProtoUDP && len(l4) < UDPSize))
		before := append([]byte(nil), ip...)
		err := RewriteIPv4(ip, sd, a, port)
		if wantErr {
			if err != ErrTruncated || string(before) != string(ip) {
				t.Fatalf("want ErrTruncated and no change, got %v", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("RewriteIPv4: %v", err)
		}
		if ip.Checksum() != ip.CalculateChecksum() {
			t.Fatalf("ip checksum %#04x, recomputed %#04x", ip.Checksum(), ip.CalculateChecksum())
		}
		if (sd == SideSrc && ip.Src() != a) || (sd == SideDst && ip.Dst() != a) {
			t.Fatalf("address not rewritten")
		}
		if ip.IsNonFirstFragment() {
			if string(before[ip.HeaderLength():]) != string(ip[ip.HeaderLength():]) {
				t.Fatalf("non-first fragment payload changed")
			}
			return
		}
		ph := PseudoHeaderChecksum(proto, ip.SrcSlice(), ip.DstSlice(), uint16(len(l4)))
		switch proto {
		case ProtoTCP:
			tcp := TCP(l4)
			if got, want := tcp.Checksum(), tcp.CalculateChecksum(ph); got != want {
				t.Fatalf("tcp checksum %#04x, recomputed %#04x", got, want)
			}
			if (sd == SideSrc && tcp.SrcPort() != port) || (sd == SideDst && tcp.DstPort() != port) {
				t.Fatalf("port not rewritten")
			}
		case ProtoUDP:
			u := UDP(l4)
			if zeroUDP {
				if u.Checksum() != 0 {
					t.Fatalf("zero UDP checksum became %#04x", u.Checksum())
				}
				return
			}
			if got, want := u.Checksum(), u.CalculateChecksum(ph); got != want {
				t.Fatalf("udp checksum %#04x, recomputed %#04x", got, want)
			}
		case ProtoICMP:
			if string(before[ip.HeaderLength():]) != string(ip[ip.HeaderLength():]) {
				t.Fatalf("ICMP payload changed")
			}
		}
	})
}

func FuzzRewriteIPv6(f *testing.F) {
	f.Add([]byte("0123456789abcdefghijklmnopqrstuvwxyz"), uint8(0), false, uint8(0), uint16(443), byte(1))
	f.Add([]byte("0123456789"), uint8(1), true, uint8(1), uint16(9), byte(0xff))
	f.Add([]byte("0123456789"), uint8(2), false, uint8(1), uint16(9), byte(0))
	f.Fuzz(func(t *testing.T, payload []byte, protoSel uint8, zeroUDP bool, side uint8, port uint16, fill byte) {
		if len(payload) > 2000 {
			return
		}
		proto := [3]uint8{ProtoTCP, ProtoUDP, ProtoICMPv6}[protoSel%3]
		b := make([]byte, IPv6Size+len(payload))
		ip := IPv6(b)
		ip.Encode(&IPv6Fields{PayloadLength: uint16(len(payload)), NextHeader: proto, HopLimit: 1,
			Src: [16]byte{0x20, 0x01, 0x0d, 0xb8, fill}, Dst: [16]byte{0x20, 0x01, 0x0d, 0xb8, 0, fill}})
		copy(b[IPv6Size:], payload)
		l4 := ip.Payload()
		ph := func() uint16 { return PseudoHeaderChecksum(proto, ip.SrcSlice(), ip.DstSlice(), uint16(len(l4))) }
		min := map[uint8]int{ProtoTCP: TCPMinSize, ProtoUDP: UDPSize, ProtoICMPv6: ICMPv6MinSize}[proto]
		if len(l4) < min {
			if err := RewriteIPv6Packet(ip, Side(side%2), [16]byte{1}, port); err != ErrTruncated {
				t.Fatalf("want ErrTruncated, got %v", err)
			}
			return
		}
		switch proto {
		case ProtoTCP:
			TCP(l4).SetChecksum(TCP(l4).CalculateChecksum(ph()))
		case ProtoUDP:
			UDP(l4).SetLength(uint16(len(l4)))
			UDP(l4).SetChecksum(0)
			if !zeroUDP {
				UDP(l4).SetChecksum(UDP(l4).CalculateChecksum(ph()))
			}
		case ProtoICMPv6:
			ICMPv6(l4).SetChecksum(ICMPv6(l4).CalculateChecksum(ph()))
		}
		a := [16]byte{0x20, 0x01, 0x0d, 0xb8, 0xff, fill, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}
		if err := RewriteIPv6Packet(ip, Side(side%2), a, port); err != nil {
			t.Fatalf("RewriteIPv6Packet: %v", err)
		}
		var got, want uint16
		switch proto {
		case ProtoTCP:
			got, want = TCP(l4).Checksum(), TCP(l4).CalculateChecksum(ph())
		case ProtoUDP:
			// Zero is invalid over IPv6: a whole datagram gets one.
			got, want = UDP(l4).Checksum(), UDP(l4).CalculateChecksum(ph())
		case ProtoICMPv6:
			got, want = ICMPv6(l4).Checksum(), ICMPv6(l4).CalculateChecksum(ph())
		}
		if got != want {
			t.Fatalf("proto %d checksum %#04x, recomputed %#04x", proto, got, want)
		}
	})
}
