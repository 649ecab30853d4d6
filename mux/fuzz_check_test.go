package mux

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// muxFlowVIP says, by gopacket's decode of the injected IP packet, which
// VIP's rule the packet belongs to (the index in benchVIPs), or -1 and
// why none: a TCP or UDP packet (or first fragment) to the VIP's address,
// protocol and port, or an ICMP error about a flow of that VIP (quoting a
// packet from the VIP's address and port).
func muxFlowVIP(in *muxInjected) (int, string) {
	vip := vipByAddr(in.dst)
	if vip < 0 {
		return -1, fmt.Sprintf("destination %v is no VIP", in.dst)
	}
	v := benchVIPs[vip]
	match := func(proto uint8, dport uint16, what string) (int, string) {
		if proto != v.proto || dport != v.addr.Port() {
			return -1, fmt.Sprintf("%s protocol %d port %d, VIP %s is %d:%d", what, proto, dport, v.name, v.proto, v.addr.Port())
		}
		return vip, ""
	}
	l4 := in.l4
	switch {
	case !l4.ok:
		return -1, "an IPv6 extension chain that does not reach a transport header"
	case l4.nonFirst:
		return -1, "a non-first fragment (the VIP hashes ports)"
	}
	seg := in.ip[l4.off:]
	var quote []byte
	switch l4.proto {
	case flow.ProtoTCP, flow.ProtoUDP:
		lt := layers.LayerTypeTCP
		if l4.proto == flow.ProtoUDP {
			lt = layers.LayerTypeUDP
		}
		pkt := gopacket.NewPacket(seg, lt, gopacket.Default)
		switch l := pkt.Layer(lt).(type) {
		case *layers.TCP:
			return match(l4.proto, uint16(l.DstPort), "TCP")
		case *layers.UDP:
			return match(l4.proto, uint16(l.DstPort), "UDP")
		}
		if l4.frag && len(seg) >= 4 {
			// A first fragment may hold less than gopacket wants.
			return match(l4.proto, binary.BigEndian.Uint16(seg[2:]), "first fragment")
		}
		return -1, fmt.Sprintf("gopacket finds no transport header of protocol %d", l4.proto)
	case flow.ProtoICMP:
		if !in.v4 {
			return -1, "ICMPv4 in IPv6"
		}
		l, ok := gopacket.NewPacket(seg, layers.LayerTypeICMPv4, gopacket.Default).Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		if !ok {
			return -1, "gopacket finds no ICMPv4 header"
		}
		switch l.TypeCode.Type() {
		case layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4TypeTimeExceeded:
		default:
			return -1, fmt.Sprintf("ICMPv4 %v is no error", l.TypeCode)
		}
		quote = l.Payload
	case flow.ProtoICMPv6:
		if in.v4 {
			return -1, "ICMPv6 in IPv4"
		}
		l, ok := gopacket.NewPacket(seg, layers.LayerTypeICMPv6, gopacket.Default).Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
		if !ok {
			return -1, "gopacket finds no ICMPv6 header"
		}
		switch l.TypeCode.Type() {
		case layers.ICMPv6TypeDestinationUnreachable, layers.ICMPv6TypePacketTooBig, layers.ICMPv6TypeTimeExceeded:
		default:
			return -1, fmt.Sprintf("ICMPv6 %v is no error", l.TypeCode)
		}
		if len(l.Payload) < 4 {
			return -1, "ICMPv6 error without a quote"
		}
		quote = l.Payload[4:] // after the unused / MTU word
	default:
		return -1, fmt.Sprintf("protocol %d", l4.proto)
	}
	// The quoted packet: from the VIP (DSR: the VIP is the replies'
	// source) to the client; its source port is the VIP's.
	// gopacket reads the fixed fields before any check that can fail
	// past the fixed header's length, and a quote's length fields are
	// the original packet's, not the quote's: decode errors are ignored.
	var qsrc net.IP
	var qproto uint8
	var ql4 []byte
	if in.v4 {
		var ip layers.IPv4
		if len(quote) < 20 {
			return -1, "the ICMP error quotes no IPv4 header"
		}
		_ = ip.DecodeFromBytes(quote, gopacket.NilDecodeFeedback)
		if hl := int(ip.IHL) * 4; ip.Version != 4 || hl < 20 || hl > len(quote) {
			return -1, "the ICMP error quotes no valid IPv4 header"
		} else if ip.FragOffset == 0 {
			ql4 = quote[hl:]
		}
		qsrc, qproto = ip.SrcIP, uint8(ip.Protocol)
	} else {
		var ip layers.IPv6
		if len(quote) < 40 {
			return -1, "the ICMPv6 error quotes no IPv6 header"
		}
		_ = ip.DecodeFromBytes(quote, gopacket.NilDecodeFeedback)
		if ip.Version != 6 {
			return -1, "the ICMPv6 error quotes no IPv6 header"
		}
		var ok bool
		if qproto, ql4, ok = quotedIPv6L4(quote); !ok {
			return -1, "the ICMPv6 error quotes an extension chain that does not reach a transport header"
		}
		qsrc = ip.SrcIP
	}
	if a, _ := netip.AddrFromSlice(qsrc); a != v.addr.Addr() {
		return -1, fmt.Sprintf("the ICMP error to VIP %s quotes a packet from %v", v.name, a)
	}
	if len(ql4) < 4 {
		return -1, "the ICMP error quotes no ports"
	}
	return match(qproto, binary.BigEndian.Uint16(ql4), "quoted packet")
}

// quotedIPv6L4 locates the transport header of the IPv6 packet an ICMPv6
// error quotes, as muxIPv6L4 does a packet's, but within the quote or its
// Payload Length, whichever ends first: a quote holds only the packet's
// first bytes. It returns the quoted protocol and the quote from the
// transport header on (nil for a non-first fragment); false when the
// extension chain does not reach a transport header within that end.
func quotedIPv6L4(quote []byte) (proto uint8, l4 []byte, ok bool) {
	end := min(len(quote), 40+int(binary.BigEndian.Uint16(quote[4:])))
	l := muxIPv6L4(quote[:end])
	switch {
	case !l.ok:
		return 0, nil, false
	case l.nonFirst:
		return l.proto, nil, true
	}
	return l.proto, quote[l.off:], true
}

// checkMuxICMP checks a frame that is not VXLAN: it must be an ICMP
// message the Mux made for in's sender. It returns its kind.
func checkMuxICMP(t *testing.T, fr []byte, in *muxInjected) string {
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("transmitted frame is neither VXLAN nor ICMP for the sender: "+format+"\n in  %x\n out %x",
			append(args, in.frame, fr)...)
	}
	l3 := in.l3off
	// L2: the injected frame's, MACs swapped, tags kept.
	if len(fr) < l3 || !bytes.Equal(fr[:6], in.frame[6:12]) || !bytes.Equal(fr[6:12], in.frame[:6]) ||
		!bytes.Equal(fr[12:l3], in.frame[12:l3]) {
		fail("the Ethernet header is not the injected one turned around")
	}
	// Never about a frame sent to a link-layer group address (RFC 1122
	// 3.2.2, 3.3.6): turned around, it would leave with a group source.
	if fr[6]&1 != 0 {
		fail("an ICMP reply to a frame sent to a link-layer group address")
	}
	// The IP packet, bounded by its length field, then its ICMP message.
	var (
		ipLen     int
		h4        layers.IPv4
		h6        layers.IPv6
		src, dst  net.IP
		ttl       uint8
		typ, code uint8
		l4        muxL4
	)
	if in.v4 {
		if err := decodeIPv4(&h4, fr[l3:]); err != nil {
			fail("%v", err)
		}
		if gpkt.Checksum(h4.Contents) != 0 {
			fail("IPv4 header checksum %#04x is wrong (the injected header's was right: %v)",
				h4.Checksum, gpkt.Checksum(in.ip4.Contents) == 0)
		}
		ipLen, src, dst, ttl = int(h4.Length), h4.SrcIP, h4.DstIP, h4.TTL
		l4 = muxL4{proto: uint8(h4.Protocol), off: len(h4.Contents), ok: true, nonFirst: h4.FragOffset != 0}
	} else {
		if err := decodeIPv6Fixed(&h6, fr[l3:]); err != nil {
			fail("%v", err)
		}
		ipLen, src, dst, ttl = 40+int(h6.Length), h6.SrcIP, h6.DstIP, h6.HopLimit
	}
	if l3+ipLen > len(fr) {
		fail("IP packet of %d bytes past the frame", ipLen)
	}
	ipPkt := fr[l3 : l3+ipLen]
	if !in.v4 {
		l4 = muxIPv6L4(ipPkt)
	}
	if !l4.ok || l4.nonFirst || l4.off+4 > len(ipPkt) {
		fail("no ICMP header")
	}
	msg := ipPkt[l4.off:] // the ICMP message
	if (in.v4 && l4.proto != flow.ProtoICMP) || (!in.v4 && l4.proto != flow.ProtoICMPv6) {
		fail("protocol %d, no ICMP of the packet's family", l4.proto)
	}
	var sumOK bool
	var reser []byte
	typ, code, sumOK, reser = muxICMPChecksum(t, msg, in.v4, src, dst)
	if !sumOK {
		// Say whether the injected message (an echo request) already had
		// a wrong one.
		was := "not ICMP"
		if in.l4.ok && !in.l4.nonFirst && in.l4.proto == l4.proto && len(in.ip)-in.l4.off >= 8 {
			_, _, reqOK, _ := muxICMPChecksum(t, in.ip[in.l4.off:], in.v4,
				net.IP(in.src.AsSlice()), net.IP(in.dst.AsSlice()))
			was = map[bool]string{true: "right", false: "wrong too"}[reqOK]
		}
		fail("ICMP checksum: gopacket computes %x, sent %x (the injected message's: %s)", reser[2:4], msg[2:4], was)
	}
	// From the address the sender wrote to, to the sender.
	if a, _ := netip.AddrFromSlice(dst); a != in.src {
		fail("ICMP to %v, the injected frame is from %v", a, in.src)
	}
	if a, _ := netip.AddrFromSlice(src); a != in.dst {
		fail("ICMP from %v, the injected frame is to %v", a, in.dst)
	}
	if ttl != 64 {
		fail("TTL / hop limit %d, want 64", ttl)
	}
	if spoof := muxSpoofed(in); spoof != "" {
		fail("ICMP sent to a spoofed source (%s)", spoof)
	}
	switch {
	case in.v4 && typ == layers.ICMPv4TypeEchoReply, !in.v4 && typ == layers.ICMPv6TypeEchoReply:
		// A ping of a VIP address, answered in place: the request with
		// the addresses swapped, TTL / hop limit 64, the type changed
		// (checksums verified above), any padding kept.
		req := byte(layers.ICMPv4TypeEchoRequest)
		if !in.v4 {
			req = layers.ICMPv6TypeEchoRequest
		}
		if vipByAddr(in.dst) < 0 {
			fail("echo reply for a ping of %v, no VIP", in.dst)
		}
		if len(ipPkt) != len(in.ip) {
			fail("echo reply of %d IP bytes for a request of %d", len(ipPkt), len(in.ip))
		}
		at := l4.off
		want := bytes.Clone(in.ip)
		if in.l4.off != at || want[at] != req {
			fail("echo reply to something other than an echo request")
		}
		if in.v4 {
			copy(want[12:16], in.ip[16:20])
			copy(want[16:20], in.ip[12:16])
			want[8] = 64
			copy(want[10:12], ipPkt[10:12])
		} else {
			copy(want[8:24], in.ip[24:40])
			copy(want[24:40], in.ip[8:24])
			want[7] = 64
		}
		want[at] = typ
		copy(want[at+2:at+4], msg[2:4])
		if !bytes.Equal(want, ipPkt) {
			fail("the echo reply is not the request turned around\n want %x", want)
		}
		if !bytes.Equal(fr[l3+len(ipPkt):], in.frame[l3+len(in.ip):]) {
			fail("the echo reply's Ethernet padding differs from the request's")
		}
		return "echo-reply"
	case in.v4 && typ == layers.ICMPv4TypeDestinationUnreachable && code == layers.ICMPv4CodeFragmentationNeeded,
		!in.v4 && typ == layers.ICMPv6TypePacketTooBig && code == 0:
		// The packet does not fit the tunnel: the error gives the inner
		// MTU and quotes as much of the packet as the RFC limit allows
		// (576 bytes for ICMPv4, 1280 for ICMPv6, the whole error), right
		// after a plain IP header.
		kind, hdr, limit := "frag-needed", 20, 576
		if !in.v4 {
			kind, hdr, limit = "packet-too-big", 40, 1280
		}
		mtu := encap.DefaultMTU - encap.OverheadIPv4 // every backend host is IPv4
		if len(in.ip) <= mtu {
			fail("%s for a %d-byte packet, which fits the tunnel's %d", kind, len(in.ip), mtu)
		}
		if in.ttl() <= 1 {
			fail("%s for a packet whose TTL / hop limit (%d) ran out", kind, in.ttl())
		}
		if in.v4 && (in.ip4.Flags&layers.IPv4DontFragment == 0 || in.ip4.FragOffset != 0) {
			fail("frag-needed for a packet without DF or a non-first fragment")
		}
		if len(ipPkt) != hdr+len(msg) || len(fr) != l3+len(ipPkt) {
			fail("%s: %d IP bytes with a %d-byte message in a %d-byte frame", kind, len(ipPkt), len(msg), len(fr))
		}
		q := min(len(in.ip), limit-hdr-8)
		if len(msg) != 8+q {
			fail("%s of %d bytes, want 8 + %d quoted", kind, len(msg), q)
		}
		var want [4]byte
		binary.BigEndian.PutUint32(want[:], uint32(mtu))
		if !bytes.Equal(msg[4:8], want[:]) {
			fail("%s says MTU %x, want %d", kind, msg[4:8], mtu)
		}
		if !bytes.Equal(msg[8:], in.ip[:q]) {
			fail("%s quotes other bytes than the packet's first %d", kind, q)
		}
		return kind
	}
	fail("ICMP type %d code %d is nothing the Mux sends", typ, code)
	return ""
}

// muxICMPChecksum decodes the ICMP (v4) or ICMPv6 message msg of a packet
// from src to dst with gopacket and re-serialises it with gopacket's
// checksum (for ICMPv6 over the IPv6 pseudo-header). It returns the type,
// the code, whether the message's checksum is the one gopacket computes,
// and gopacket's bytes.
func muxICMPChecksum(t *testing.T, msg []byte, v4 bool, src, dst net.IP) (typ, code uint8, ok bool, reser []byte) {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{ComputeChecksums: true}
	if v4 {
		m, ok := gopacket.NewPacket(msg, layers.LayerTypeICMPv4, gopacket.Default).Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		if !ok {
			t.Fatalf("gopacket decodes no ICMPv4 message in %x", msg)
		}
		typ, code = m.TypeCode.Type(), m.TypeCode.Code()
		c := *m
		require.NoError(t, gopacket.SerializeLayers(buf, opts, &c, gopacket.Payload(m.Payload)))
	} else {
		m, ok := gopacket.NewPacket(msg, layers.LayerTypeICMPv6, gopacket.Default).Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
		if !ok {
			t.Fatalf("gopacket decodes no ICMPv6 message in %x", msg)
		}
		typ, code = m.TypeCode.Type(), m.TypeCode.Code()
		c := *m
		require.NoError(t, c.SetNetworkLayerForChecksum(&layers.IPv6{SrcIP: src, DstIP: dst}))
		require.NoError(t, gopacket.SerializeLayers(buf, opts, &c, gopacket.Payload(m.Payload)))
	}
	return typ, code, bytes.Equal(buf.Bytes(), msg), buf.Bytes()
}
