package engine_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// gpView is what the gopacket oracle makes of a frame.
type gpView struct {
	accept  bool
	why     string              // the rule that rejected the frame
	reasons []engine.DropReason // the drop reasons ParsePacket may give then

	etherType      uint16
	l3             int
	v6             bool
	src, dst       net.IP
	proto          uint8
	frag, nonFirst bool
	l4             int // offset of the validated L4 header; -1 when there is none
	l4End          int // where the IP datagram, and so the L4 segment, ends
	sport, dport   uint16
	tcpFlags       uint8 // FIN 0x01 … CWR 0x80, of a TCP segment
}

func gpReject(why string, reasons ...engine.DropReason) gpView {
	return gpView{why: why, reasons: reasons}
}

// gpTrunc records gopacket's truncation feedback.
type gpTrunc bool

func (f *gpTrunc) SetTruncated() { *f = true }

// offsetIn returns where sub, a slice of base gopacket made by two-index
// slicing, starts in base.
func offsetIn(base, sub []byte) int { return cap(base) - cap(sub) }

// gpDecode decodes frame with gopacket's layer decoders, one header at a
// time, and says whether ParsePacket must accept it and what it must find.
// gopacket decodes every header and computes every length and offset;
// where gopacket and ParsePacket legitimately differ, a rule below says
// how the oracle bridges the difference (the rule names are cited in the
// code):
//
//   - L2-TAGS: gopacket decodes any number of 802.1Q/802.1ad tags; we skip
//     at most two and drop a frame with a third as bad_l2.
//   - V4-VERSION, V6-VERSION: gopacket does not check the IP version
//     nibble; we require 4 (6) under EtherType 0x0800 (0x86DD).
//   - V4-TSO: gopacket reads an IPv4 Total Length of 0 as "use the frame
//     length" (TSO captures); we drop it (Total Length < header).
//   - V4-OPTIONS: we do not read IPv4 options (they are covered by IHL);
//     gopacket parses them and fails on malformed ones, so the oracle
//     decodes a copy whose option bytes are NOPs.
//   - V4-CHECKSUM: neither side verifies the IPv4 header checksum
//     (header.IPv4.Check does not); a frame with a wrong one is accepted.
//   - TRUNCATED: gopacket decodes a packet shorter than its IPv4 Total
//     Length, IPv6 Payload Length or UDP Length and only flags it
//     truncated; we drop it. The oracle rejects when gopacket flags
//     truncation at L3, or at L4 outside a first fragment.
//   - V6-HBH: gopacket parses a Hop-by-Hop header inside the IPv6 layer
//     (its options too, and v1.1.19 cuts the payload at Payload Length
//     counted from after Hop-by-Hop). The oracle decodes the fixed header
//     with gopacket (Next Header set to 59 in its copy) and walks every
//     extension header itself with gopacket's IPv6ExtensionSkipper and
//     IPv6Fragment decoders, within 40+Payload Length bytes.
//   - V6-LEN0: gopacket takes a Payload Length of 0 for a jumbogram and
//     fails without a Jumbo option; we do not support jumbograms and read
//     it as an empty payload.
//   - V6-CHAIN: the chain limits are ours: Hop-by-Hop only first, at most
//     one Fragment header, at most 8 extension headers (bad_ipv6 past
//     them); gopacket has none of these limits.
//   - ATOMIC: an IPv6 Fragment header with offset 0 and M clear (an atomic
//     fragment, RFC 6946) does not make the packet a fragment; gopacket
//     hands any Fragment header's payload to its Fragment layer.
//   - FRAG-L4: gopacket does not decode past an IPv4 or IPv6 fragment.
//     The oracle decodes the transport header at the start of a first
//     fragment's payload with gopacket; a non-first fragment has no L4
//     header, and ports 0.
//   - TCP-OPTIONS: we do not read TCP options; the oracle's copy has NOPs.
//   - UDP-LEN0: gopacket takes a UDP Length of 0 for a jumbogram; we drop
//     it.
//   - UDP-FIRST-FRAG: a first fragment's UDP Length counts the whole
//     datagram, so only the 8-byte header must be present.
//   - ICMPV6-SIZE: gopacket needs 4 bytes of ICMPv6; we need 8 (every
//     ICMPv6 message has the 4-byte type-specific word).
//   - ICMP-ANY-FAMILY: protocols 1 and 58 both mean an 8-byte ICMP header
//     to check, whatever the IP version; other protocols (GRE, ESP, No
//     Next Header...) are accepted with no L4 header and ports 0.
func gpDecode(frame []byte) gpView {
	b := slices.Clone(frame) // the oracle patches its copy (NOPs)
	var tr gpTrunc
	var eth layers.Ethernet
	if eth.DecodeFromBytes(b, &tr) != nil {
		return gpReject("ethernet", engine.DropTruncated)
	}
	typ, rest := eth.EthernetType, eth.Payload
	for tags := 0; typ == layers.EthernetTypeDot1Q || typ == layers.EthernetTypeQinQ; tags++ {
		if tags == 2 {
			return gpReject("L2-TAGS", engine.DropBadL2)
		}
		var q layers.Dot1Q
		if q.DecodeFromBytes(rest, &tr) != nil {
			return gpReject("dot1q", engine.DropTruncated)
		}
		typ, rest = q.Type, q.Payload
	}
	v := gpView{etherType: uint16(typ), l3: offsetIn(b, rest), l4: -1}
	switch typ {
	case layers.EthernetTypeIPv4:
		return v.ipv4(b, rest)
	case layers.EthernetTypeIPv6:
		return v.ipv6(b, rest)
	}
	return gpReject("not ip", engine.DropNotIP)
}

func (v gpView) ipv4(b, l3 []byte) gpView {
	bad := []engine.DropReason{engine.DropBadIPv4, engine.DropTruncated}
	if len(l3) >= 20 { // V4-OPTIONS
		if hl := int(l3[0]&0xf) * 4; hl > 20 && hl <= len(l3) {
			for i := 20; i < hl; i++ {
				l3[i] = 1
			}
		}
	}
	var ip layers.IPv4
	var tr gpTrunc
	switch err := ip.DecodeFromBytes(l3, &tr); {
	case err != nil:
		return gpReject("ipv4: "+err.Error(), bad...)
	case ip.Version != 4:
		return gpReject("V4-VERSION", engine.DropBadIPv4)
	case binary.BigEndian.Uint16(l3[2:]) == 0:
		return gpReject("V4-TSO", engine.DropBadIPv4)
	case bool(tr):
		return gpReject("TRUNCATED ipv4", engine.DropTruncated)
	}
	v.src, v.dst, v.proto = ip.SrcIP, ip.DstIP, uint8(ip.Protocol)
	v.frag = ip.Flags&layers.IPv4MoreFragments != 0 || ip.FragOffset != 0
	v.nonFirst = ip.FragOffset != 0
	if v.nonFirst {
		v.accept = true
		return v
	}
	return v.transport(b, ip.Payload)
}

func (v gpView) ipv6(b, l3 []byte) gpView {
	if len(l3) < 40 {
		return gpReject("ipv6 header", engine.DropTruncated)
	}
	var ip layers.IPv6
	var tr gpTrunc
	next := l3[6]
	l3[6] = byte(layers.IPProtocolNoNextHeader) // V6-HBH
	err := ip.DecodeFromBytes(l3, &tr)
	l3[6] = next
	pl := ip.Payload
	switch {
	case err != nil && ip.Length != 0:
		return gpReject("ipv6: "+err.Error(), engine.DropBadIPv6, engine.DropTruncated)
	case ip.Version != 6:
		return gpReject("V6-VERSION", engine.DropBadIPv6)
	case err != nil: // V6-LEN0
		pl = pl[:0]
	case bool(tr):
		return gpReject("TRUNCATED ipv6", engine.DropTruncated)
	}
	v.v6, v.src, v.dst = true, ip.SrcIP, ip.DstIP

	proto, fragSeen := layers.IPProtocol(next), false
	for n := 0; ; n++ {
		switch proto {
		case layers.IPProtocolIPv6HopByHop, layers.IPProtocolIPv6Routing, layers.IPProtocolIPv6Destination, layers.IPProtocolIPv6Fragment:
		default:
			v.proto = uint8(proto)
			return v.transport(b, pl)
		}
		if n == 8 {
			return gpReject("V6-CHAIN: more than 8 extension headers", engine.DropBadIPv6)
		}
		if proto == layers.IPProtocolIPv6HopByHop && n != 0 {
			return gpReject("V6-CHAIN: hop-by-hop not first", engine.DropBadIPv6)
		}
		if proto != layers.IPProtocolIPv6Fragment {
			var x layers.IPv6ExtensionSkipper
			if x.DecodeFromBytes(pl, &tr) != nil {
				return gpReject("ipv6 extension header", engine.DropBadIPv6)
			}
			proto, pl = x.NextHeader, x.Payload
			continue
		}
		if fragSeen {
			return gpReject("V6-CHAIN: second fragment header", engine.DropBadIPv6)
		}
		fragSeen = true
		fp := gopacket.NewPacket(pl, layers.LayerTypeIPv6Fragment, gopacket.DecodeOptions{NoCopy: true, Lazy: true})
		fh, _ := fp.Layer(layers.LayerTypeIPv6Fragment).(*layers.IPv6Fragment)
		if fh == nil {
			return gpReject("ipv6 fragment header", engine.DropBadIPv6)
		}
		proto, pl = fh.NextHeader, fh.Payload
		v.frag = fh.FragmentOffset != 0 || fh.MoreFragments // ATOMIC
		if fh.FragmentOffset != 0 {
			v.nonFirst, v.proto, v.accept = true, uint8(proto), true
			return v
		}
	}
}

// transport checks the L4 header at the start of seg, a slice of b.
func (v gpView) transport(b, seg []byte) gpView {
	var tr gpTrunc
	var err error
	switch v.proto {
	case 6:
		if len(seg) >= 20 { // TCP-OPTIONS
			if do := int(seg[12]>>4) * 4; do > 20 && do <= len(seg) {
				for i := 20; i < do; i++ {
					seg[i] = 1
				}
			}
		}
		var tcp layers.TCP
		if err = tcp.DecodeFromBytes(seg, &tr); err == nil {
			v.sport, v.dport = uint16(tcp.SrcPort), uint16(tcp.DstPort)
			for i, set := range []bool{tcp.FIN, tcp.SYN, tcp.RST, tcp.PSH, tcp.ACK, tcp.URG, tcp.ECE, tcp.CWR} {
				if set {
					v.tcpFlags |= 1 << i
				}
			}
		}
	case 17:
		if v.frag && len(seg) >= 8 { // UDP-FIRST-FRAG
			binary.BigEndian.PutUint16(seg[4:], 8)
		}
		var udp layers.UDP
		if err = udp.DecodeFromBytes(seg, &tr); err == nil {
			if udp.Length == 0 {
				return gpReject("UDP-LEN0", engine.DropBadL4)
			}
			v.sport, v.dport = uint16(udp.SrcPort), uint16(udp.DstPort)
		}
	case 1:
		var icmp layers.ICMPv4
		err = icmp.DecodeFromBytes(seg, &tr)
	case 58:
		if len(seg) < 8 {
			return gpReject("ICMPV6-SIZE", engine.DropBadL4)
		}
		var icmp layers.ICMPv6
		err = icmp.DecodeFromBytes(seg, &tr)
	default:
		v.accept = true
		return v
	}
	if err != nil {
		return gpReject("l4: "+err.Error(), engine.DropBadL4)
	}
	if tr {
		return gpReject("TRUNCATED l4", engine.DropBadL4)
	}
	v.l4, v.l4End, v.accept = offsetIn(b, seg), offsetIn(b, seg)+len(seg), true
	return v
}

// checkGopacketOracle compares ParsePacket's result r and packet p for
// frame with gpDecode's.
func checkGopacketOracle(t *testing.T, frame []byte, p *engine.Packet, r engine.DropReason) {
	t.Helper()
	g := gpDecode(frame)
	if !g.accept {
		if r == 0 {
			t.Fatalf("accepted a frame gopacket rejects (%s): flags %#x\n% x", g.why, p.Flags, frame)
		}
		if !slices.Contains(g.reasons, r) {
			t.Fatalf("dropped with %v, gopacket rejects (%s) with one of %v\n% x", r, g.why, g.reasons, frame)
		}
		return
	}
	if r != 0 {
		t.Fatalf("dropped (%v) a frame gopacket accepts\n% x", r, frame)
	}
	want := engine.FlagIPv4
	if g.v6 {
		want = engine.FlagIPv6
	}
	if g.frag {
		want |= engine.FlagFragment
	}
	if g.nonFirst {
		want |= engine.FlagNonFirstFrag
	}
	if g.l4 >= 0 {
		want |= engine.FlagL4
	}
	switch {
	case p.Flags != want:
		t.Fatalf("flags %#x, gopacket %#x\n% x", p.Flags, want, frame)
	case p.EtherType != g.etherType:
		t.Fatalf("EtherType %#x, gopacket %#x\n% x", p.EtherType, g.etherType, frame)
	case int(p.L3Off) != g.l3 || (g.l3 != 14 && g.l3 != 18 && g.l3 != 22):
		t.Fatalf("L3Off %d, gopacket %d\n% x", p.L3Off, g.l3, frame)
	case p.L4Proto != g.proto:
		t.Fatalf("L4Proto %d, gopacket %d\n% x", p.L4Proto, g.proto, frame)
	case g.l4 >= 0 && int(p.L4Off) != g.l4:
		t.Fatalf("L4Off %d, gopacket %d\n% x", p.L4Off, g.l4, frame)
	case p.TCPFlags != g.tcpFlags:
		t.Fatalf("TCPFlags %#x, gopacket %#x\n% x", p.TCPFlags, g.tcpFlags, frame)
	case g.l4 >= 0 && len(p.L4Segment()) != g.l4End-g.l4:
		t.Fatalf("L4Segment %d bytes, gopacket's segment %d\n% x", len(p.L4Segment()), g.l4End-g.l4, frame)
	}
	var k flow.Key
	if g.v6 {
		k.SetIPv6(parseVNI, g.proto, g.src, g.dst, g.sport, g.dport)
	} else {
		k.SetIPv4(parseVNI, g.proto, g.src, g.dst, g.sport, g.dport)
	}
	if p.Key != k {
		t.Fatalf("key %v, gopacket %v\n% x", p.Key, k, frame)
	}
	src, _ := netip.AddrFromSlice(g.src)
	dst, _ := netip.AddrFromSlice(g.dst)
	if p.Key.SrcAddr() != src || p.Key.DstAddr() != dst || !p.Key.IsValid() {
		t.Fatalf("key addresses %v %v, gopacket %v %v", p.Key.SrcAddr(), p.Key.DstAddr(), src, dst)
	}
}
