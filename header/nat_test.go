package header

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// refL4Valid verifies a TCP/UDP/ICMPv6 checksum independently of the fast
// code: it lays the pseudo-header out as bytes (RFC 768/793 for IPv4, RFC
// 8200 section 8.1 for IPv6) and sums it with the byte-by-byte reference.
func refL4Valid(src, dst []byte, proto uint8, l4 []byte) bool {
	var ph []byte
	ph = append(ph, src...)
	ph = append(ph, dst...)
	if len(src) == 4 {
		ph = append(ph, 0, proto, byte(len(l4)>>8), byte(len(l4)))
	} else {
		ph = append(ph, 0, 0, byte(len(l4)>>8), byte(len(l4)), 0, 0, 0, proto)
	}
	return gpkt.Sum(append(ph, l4...), 0) == 0xffff
}

var (
	newV4 = [4]byte{198, 19, 1, 2}
	newV6 = [16]byte{0x20, 0x01, 0x0d, 0xb8, 0xca, 0xfe, 0, 0, 0, 0, 0, 0, 0, 0, 0xbe, 0xef}
)

const newPort = 8443

func natFrames(t testing.TB) []struct {
	name      string
	frame     []byte
	gopacket  bool // every layer serialisable: gopacket recomputes checksums
	ports     bool // a transport header with ports follows
	zeroUDPv4 bool
	zeroUDPv6 bool
} {
	g := goldenFrames(t)
	byName := func(n string) []byte {
		for _, f := range g {
			if f.name == n {
				return append([]byte(nil), f.frame...)
			}
		}
		t.Fatalf("no golden frame %q", n)
		return nil
	}
	zeroUDP := func(frame []byte) []byte {
		_, l3, err := ParseEthernet(frame)
		noErr(t, err)
		var u UDP
		if Ethernet(frame).Type() == EtherTypeIPv6 {
			u = UDP(IPv6(frame[l3:]).Payload())
		} else {
			u = UDP(IPv4(frame[l3:]).Payload())
		}
		u.SetChecksum(0)
		return frame
	}
	nonFirst4 := gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv4),
		&layers.IPv4{Version: 4, Id: 5, FragOffset: 185, TTL: 9, Protocol: layers.IPProtocolTCP, SrcIP: v4A, DstIP: v4B},
		payload(64))
	return []struct {
		name      string
		frame     []byte
		gopacket  bool
		ports     bool
		zeroUDPv4 bool
		zeroUDPv6 bool
	}{
		{"ipv4 tcp options qinq", byName("qinq ipv4 options tcp options"), true, true, false, false},
		{"ipv4 udp", byName("ipv4 udp odd payload"), true, true, false, false},
		{"ipv4 udp zero checksum", zeroUDP(byName("ipv4 udp odd payload")), true, true, true, false},
		{"ipv4 icmp echo", byName("ipv4 icmp echo"), true, false, false, false},
		{"ipv4 non-first fragment", nonFirst4, false, false, false, false},
		{"vxlan outer ipv4 udp", byName("vxlan inner dot1q ipv4 tcp"), true, true, false, false},
		{"ipv6 tcp", byName("ipv6 tcp"), true, true, false, false},
		{"ipv6 udp", byName("ipv6 udp"), true, true, false, false},
		{"ipv6 udp zero checksum", zeroUDP(byName("ipv6 udp")), true, true, false, true},
		{"ipv6 icmpv6 echo", byName("ipv6 icmpv6 echo"), true, false, false, false},
		{"ipv6 ext headers first fragment tcp", byName("ipv6 hbh destopts routing fragment tcp"), false, true, false, false},
		{"ipv6 non-first fragment", byName("ipv6 non-first fragment"), false, false, false, false},
	}
}

// TestRewrite rewrites each side of each frame and checks: the address
// (and port) changed, every other byte but the checksums stayed, the ICMP
// identifier is untouched, the UDP zero rule, and every checksum verifies,
// by gopacket's recomputation where it can serialise the frame and by the
// independent reference otherwise.
func TestRewrite(t *testing.T) {
	for _, tc := range natFrames(t) {
		for _, side := range []Side{SideSrc, SideDst} {
			name := tc.name + "/src"
			if side == SideDst {
				name = tc.name + "/dst"
			}
			t.Run(name, func(t *testing.T) {
				orig := tc.frame
				frame := append([]byte(nil), orig...)
				et, l3, err := ParseEthernet(frame)
				noErr(t, err)
				changed := map[int]bool{} // offsets allowed to change
				mark := func(off, n int) {
					for i := 0; i < n; i++ {
						changed[off+i] = true
					}
				}
				var l4off int
				var proto uint8
				var src, dst []byte
				if et == EtherTypeIPv4 {
					ip := IPv4(frame[l3:])
					noErr(t, RewriteIPv4(ip, side, newV4, newPort))
					addr := ip.Src()
					mark(l3+ipv4Checksum, 2)
					if side == SideDst {
						addr = ip.Dst()
						mark(l3+ipv4Dst, 4)
					} else {
						mark(l3+ipv4Src, 4)
					}
					equal(t, newV4, addr, "address")
					equal(t, true, ip.IsChecksumValid(), "ip checksum")
					l4off, proto, src, dst = l3+ip.HeaderLength(), ip.Protocol(), ip.SrcSlice(), ip.DstSlice()
				} else {
					ip := IPv6(frame[l3:])
					noErr(t, RewriteIPv6Packet(ip, side, newV6, newPort))
					// RewriteIPv6 with the walked offset does the same.
					again := append([]byte(nil), orig...)
					p, off, frag, err := IPv6(again[l3:]).TransportHeader()
					noErr(t, err)
					if frag.NonFirst() {
						off = -1
					}
					noErr(t, RewriteIPv6(IPv6(again[l3:]), off, p, side, newV6, newPort))
					equal(t, true, bytes.Equal(frame, again), "RewriteIPv6 == RewriteIPv6Packet")

					addr := ip.Src()
					if side == SideDst {
						addr = ip.Dst()
						mark(l3+ipv6Dst, 16)
					} else {
						mark(l3+ipv6Src, 16)
					}
					equal(t, newV6, addr, "address")
					p, off, _, err = ip.TransportHeader()
					noErr(t, err)
					l4off, proto, src, dst = l3+off, p, ip.SrcSlice(), ip.DstSlice()
				}
				l4 := frame[l4off:]
				if et == EtherTypeIPv4 {
					l4 = IPv4(frame[l3:]).Payload()
				} else {
					l4 = frame[l4off : l3+IPv6Size+int(IPv6(frame[l3:]).PayloadLength())]
				}
				if tc.ports {
					sp, dp := binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
					osp, odp := binary.BigEndian.Uint16(orig[l4off:]), binary.BigEndian.Uint16(orig[l4off+2:])
					if side == SideSrc {
						equal(t, uint16(newPort), sp, "src port")
						equal(t, odp, dp, "dst port kept")
						mark(l4off, 2)
					} else {
						equal(t, uint16(newPort), dp, "dst port")
						equal(t, osp, sp, "src port kept")
						mark(l4off+2, 2)
					}
					switch proto {
					case ProtoTCP:
						mark(l4off+tcpChecksum, 2)
						equal(t, true, refL4Valid(src, dst, proto, l4), "tcp checksum (reference)")
					case ProtoUDP:
						mark(l4off+udpChecksum, 2)
						u := UDP(l4)
						switch {
						case tc.zeroUDPv4:
							equal(t, uint16(0), u.Checksum(), "zero UDP checksum kept over IPv4")
						case tc.zeroUDPv6:
							if u.Checksum() == 0 {
								t.Fatalf("zero UDP checksum over IPv6 not computed")
							}
							fallthrough
						default:
							equal(t, true, refL4Valid(src, dst, proto, l4), "udp checksum (reference)")
						}
					}
				}
				if proto == ProtoICMPv6 {
					mark(l4off+icmpChecksum, 2)
					equal(t, true, refL4Valid(src, dst, proto, l4), "icmpv6 checksum (reference)")
				}
				if proto == ProtoICMP || proto == ProtoICMPv6 {
					equal(t, binary.BigEndian.Uint16(orig[l4off+icmpIdent:]), binary.BigEndian.Uint16(l4[icmpIdent:]), "echo identifier untouched")
				}
				for i := range frame {
					if frame[i] != orig[i] && !changed[i] {
						t.Fatalf("byte %d changed %#02x -> %#02x", i, orig[i], frame[i])
					}
				}
				if tc.gopacket {
					gopacketChecksums(t, frame)
					crossCheck(t, frame)
				}
			})
		}
	}
}

// TestRewriteIPv4Fragments splits a TCP datagram into two fragments,
// rewrites each (the first gets address and port, the second only the
// address), reassembles them, and has gopacket verify the TCP checksum of
// the whole datagram: the incremental update in the first fragment is right
// for the reassembled datagram.
func TestRewriteIPv4Fragments(t *testing.T) {
	whole := gpkt.Serialize(t, ipv4Layer(layers.IPProtocolTCP), tcpLayer(40000, 80), payload(200))
	ip := IPv4(whole)
	seg := ip.Payload()
	cut := 96 // multiple of 8
	mk := func(data []byte, off int, more bool) IPv4 {
		b := make([]byte, IPv4MinSize+len(data))
		f := IPv4Fields{TotalLength: uint16(len(b)), ID: 99, TTL: 64, Protocol: ProtoTCP, Src: ip.Src(), Dst: ip.Dst(), FragmentOffset: uint16(off)}
		if more {
			f.Flags = IPv4FlagMoreFragments
		}
		IPv4(b).Encode(&f)
		copy(b[IPv4MinSize:], data)
		return b
	}
	for _, side := range []Side{SideSrc, SideDst} {
		first, second := mk(seg[:cut], 0, true), mk(seg[cut:], cut, false)
		equal(t, true, first.IsFragment() && !first.IsNonFirstFragment(), "first")
		equal(t, true, second.IsFragment() && second.IsNonFirstFragment(), "second")
		keep := append([]byte(nil), second[IPv4MinSize:]...)
		noErr(t, RewriteIPv4(first, side, newV4, newPort))
		noErr(t, RewriteIPv4(second, side, newV4, newPort))
		equal(t, true, first.IsChecksumValid() && second.IsChecksumValid(), "ip checksums")
		equal(t, true, bytes.Equal(keep, second[IPv4MinSize:]), "non-first fragment payload untouched")
		equal(t, first.Src(), second.Src(), "src")
		equal(t, first.Dst(), second.Dst(), "dst")

		// Reassemble and let gopacket verify.
		re := make([]byte, IPv4MinSize+len(seg))
		IPv4(re).Encode(&IPv4Fields{TotalLength: uint16(len(re)), ID: 99, TTL: 64, Protocol: ProtoTCP, Src: first.Src(), Dst: first.Dst()})
		copy(re[IPv4MinSize:], first.Payload())
		copy(re[IPv4MinSize+cut:], second.Payload())
		eth := append(make([]byte, EthernetSize), re...)
		Ethernet(eth).Encode(MAC(macA), MAC(macB), EtherTypeIPv4)
		gopacketChecksums(t, eth)
		tcp := TCP(IPv4(re).Payload())
		if side == SideSrc {
			equal(t, uint16(newPort), tcp.SrcPort(), "src port")
		} else {
			equal(t, uint16(newPort), tcp.DstPort(), "dst port")
		}
	}
}

// TestRewriteIPv6RoutingSegmentsLeft: with segments left, the pseudo-header
// destination is the last routing address, so rewriting Dst must not change
// the transport checksum beyond the port.
func TestRewriteIPv6RoutingSegmentsLeft(t *testing.T) {
	// TCP checksum over pseudo-header with final destination v6C.
	final := ipv6Layer(layers.IPProtocolTCP)
	final.DstIP = v6C
	tcp := gpkt.Serialize(t, final, tcpLayer(443, 50000), payload(20))[IPv6Size:]
	frame := gpkt.Serialize(t, ethLayer(layers.EthernetTypeIPv6), ipv6Layer(layers.IPProtocolIPv6Routing),
		gopacket.Payload(append(routingHeader(layers.IPProtocolTCP, 1, v6C), tcp...)))
	ip := IPv6(frame[EthernetSize:])
	_, off, _, err := ip.TransportHeader()
	noErr(t, err)
	l4 := TCP(ip[off:])
	equal(t, true, refL4Valid(ip.SrcSlice(), v6C.To16(), ProtoTCP, l4), "before")
	noErr(t, RewriteIPv6Packet(ip, SideDst, newV6, newPort))
	equal(t, newV6, ip.Dst(), "dst")
	equal(t, uint16(newPort), l4.DstPort(), "port")
	equal(t, true, refL4Valid(ip.SrcSlice(), v6C.To16(), ProtoTCP, l4), "after dst rewrite")
	noErr(t, RewriteIPv6Packet(ip, SideSrc, newV6, newPort))
	equal(t, true, refL4Valid(ip.SrcSlice(), v6C.To16(), ProtoTCP, l4), "after src rewrite")
}

func TestRewriteErrors(t *testing.T) {
	g := goldenFrames(t)
	v4 := append([]byte(nil), g[1].frame[EthernetSize:]...) // ipv4 udp
	v6 := append([]byte(nil), g[5].frame[EthernetSize:]...) // ipv6 tcp

	shortUDP := append([]byte(nil), v4[:IPv4MinSize+4]...)
	IPv4(shortUDP).SetTotalLength(uint16(len(shortUDP)))
	tests := []struct {
		name string
		run  func(b []byte) error
		b    []byte
		want error
	}{
		{"v4 truncated", func(b []byte) error { return RewriteIPv4(b, SideSrc, newV4, 1) }, v4[:10], ErrTruncated},
		{"v4 bad version", func(b []byte) error { b[0] = 0x65; return RewriteIPv4(b, SideSrc, newV4, 1) }, v4, ErrVersion},
		{"v4 short udp", func(b []byte) error { return RewriteIPv4(b, SideSrc, newV4, 1) }, shortUDP, ErrTruncated},
		{"v6 truncated", func(b []byte) error { return RewriteIPv6(b, 40, ProtoTCP, SideSrc, newV6, 1) }, v6[:39], ErrTruncated},
		{"v6 offset before payload", func(b []byte) error { return RewriteIPv6(b, 39, ProtoTCP, SideSrc, newV6, 1) }, v6, ErrOffset},
		{"v6 offset past payload", func(b []byte) error { return RewriteIPv6(b, len(b)+1, ProtoTCP, SideSrc, newV6, 1) }, v6, ErrOffset},
		{"v6 short tcp", func(b []byte) error { return RewriteIPv6(b, len(b)-10, ProtoTCP, SideSrc, newV6, 1) }, v6, ErrTruncated},
		{"v6 packet bad version", func(b []byte) error { b[0] = 0x45; return RewriteIPv6Packet(b, SideSrc, newV6, 1) }, v6, ErrVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := append([]byte(nil), tt.b...)
			err := tt.run(b)
			equal(t, tt.want, err, "error")
			// Nothing but the deliberate corruption changed.
			for i := 1; i < len(b); i++ {
				if b[i] != tt.b[i] {
					t.Fatalf("byte %d changed on error", i)
				}
			}
		})
	}
}
