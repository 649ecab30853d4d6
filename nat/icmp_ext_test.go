package nat_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// ext6 is an IPv6 extension header of a quoted packet: its protocol
// number, and its layer given the header that follows it.
type ext6 struct {
	proto layers.IPProtocol
	layer func(next layers.IPProtocol) gopacket.SerializableLayer
}

// destOpts6 is a Destination Options header (8 bytes), by gopacket.
var destOpts6 = ext6{layers.IPProtocolIPv6Destination, func(next layers.IPProtocol) gopacket.SerializableLayer {
	d := &layers.IPv6Destination{Options: []*layers.IPv6DestinationOption{{OptionType: 0x1e, OptionData: []byte{1, 2, 3, 4}}}}
	d.NextHeader = next
	return d
}}

// fragment6 is a Fragment header, by hand (gopacket cannot serialise one).
func fragment6(offset uint16, more bool) ext6 {
	return ext6{layers.IPProtocolIPv6Fragment, func(next layers.IPProtocol) gopacket.SerializableLayer {
		fo := offset << 3
		if more {
			fo |= 1
		}
		h := gopacket.Payload{byte(next), 0, 0, 0, 0, 0, 0x12, 0x34}
		binary.BigEndian.PutUint16(h[2:], fo)
		return h
	}}
}

// routing6 is a type 0 Routing header with one address and segmentsLeft
// segments left, by hand (gopacket cannot serialise one).
func routing6(segmentsLeft byte) ext6 {
	return ext6{layers.IPProtocolIPv6Routing, func(next layers.IPProtocol) gopacket.SerializableLayer {
		h := make(gopacket.Payload, 24)
		h[0], h[1], h[3] = byte(next), 2, segmentsLeft
		copy(h[8:], netip.MustParseAddr("2001:db8:77::1").AsSlice())
		return h
	}}
}

// firstFrag6 is the Fragment header of a first fragment.
var firstFrag6 = fragment6(0, true)

// frameExt6 is p's frame (IPv6, TCP or UDP) with exts between the fixed
// header and the transport header; the transport checksum is gopacket's
// over the segment in the frame.
func frameExt6(p pkt, exts ...ext6) []byte {
	transport := layers.IPProtocol(p.protocol())
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: transport, SrcIP: p.src.Addr().AsSlice(), DstIP: p.dst.Addr().AsSlice()}
	if len(exts) > 0 {
		ip.NextHeader = exts[0].proto
	}
	ls := []gopacket.SerializableLayer{
		&layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, DstMAC: net.HardwareAddr(p.dstMAC[:]), EthernetType: layers.EthernetTypeIPv6},
		ip,
	}
	for i, e := range exts {
		next := transport
		if i+1 < len(exts) {
			next = exts[i+1].proto
		}
		ls = append(ls, e.layer(next))
	}
	if transport == layers.IPProtocolTCP {
		ls = append(ls, &layers.TCP{SrcPort: layers.TCPPort(p.src.Port()), DstPort: layers.TCPPort(p.dst.Port()),
			Seq: 1000, Ack: 2000, ACK: true, Window: 65000})
	} else {
		ls = append(ls, &layers.UDP{SrcPort: layers.UDPPort(p.src.Port()), DstPort: layers.UDPPort(p.dst.Port())})
	}
	return gpkt.MustSerialize(append(ls, gopacket.Payload("0123456789abcdef0123456789abcdef"))...)
}

// chainLen6 is the length of the extension headers exts.
func chainLen6(exts []ext6) int {
	n := 0
	for _, e := range exts {
		n += len(gpkt.MustSerialize(e.layer(layers.IPProtocolTCP)))
	}
	return n
}

// TestICMPv6ErrorsQuoteExtensionHeaders: an ICMPv6 error (Packet Too Big,
// Destination Unreachable) whose quoted packet has extension headers —
// destination options, the Fragment header of a first fragment, a chain
// longer than the quote's fixed edit window — is translated in both
// directions exactly as the same error without them: the result is, byte
// for byte, the frame gopacket builds for the translated error (quoted
// addresses and ports translated, the quoted TCP/UDP checksum and the
// ICMPv6 checksum gopacket's). Such errors were dropped as bad_l4. A
// quote whose chain is cut, too long or malformed, a quoted non-first
// fragment and a quote ending before the ports are still dropped as
// bad_l4; so is a quote with a Routing header that has segments left
// (its transport checksum's pseudo-header holds the final destination).
func TestICMPv6ErrorsQuoteExtensionHeaders(t *testing.T) {
	router6 := netip.MustParseAddr("2001:db8:50::1")
	chains := []struct {
		name string
		exts []ext6
		cut  int // quote length past the fixed header and the chain, 0: whole
	}{
		{"destination options", []ext6{destOpts6}, 0},
		{"first fragment", []ext6{firstFrag6}, 0},
		{"destination options, first fragment", []ext6{destOpts6, firstFrag6}, 0},
		{"destination options, first fragment, quote cut in the payload", []ext6{destOpts6, firstFrag6}, 23},
		{"24-byte chain", []ext6{destOpts6, destOpts6, firstFrag6}, 0},
		{"24-byte chain, quote cut in the payload", []ext6{destOpts6, destOpts6, firstFrag6}, 23},
		{"routing (no segments left), destination options", []ext6{routing6(0), destOpts6}, 0},
		{"eight headers", slices.Repeat([]ext6{destOpts6}, header.IPv6MaxExtensionHeaders), 0},
	}
	kinds := []struct {
		name  string
		unrch bool // Destination Unreachable (port unreachable), else Packet Too Big
	}{{"packet too big", false}, {"destination unreachable", true}}
	flows := []struct {
		name   string
		client netip.AddrPort
		vip    netip.AddrPort
		dip    netip.AddrPort
		tcp    bool
	}{
		{"tcp", ap(client6, 40010), ap(vip6, 443), ap(dip6, 8443), true},
		{"udp remapped", ap(client6, 40011), ap(vip6, 5353), ap(dip6, 5300), false},
	}
	mk := func(src, dst netip.AddrPort, tcpFlow bool) pkt {
		if tcpFlow {
			return tcp(src, dst)
		}
		return udp(src, dst)
	}
	for _, ch := range chains {
		n := 0
		if ch.cut != 0 {
			n = header.IPv6Size + chainLen6(ch.exts) + ch.cut
		}
		for _, k := range kinds {
			for _, fl := range flows {
				t.Run("inbound/"+k.name+"/"+fl.name+"/"+ch.name, func(t *testing.T) {
					// A router's error about the VIP's reply, to the DIP.
					e := newEnv(t, testRules(), testLocals())
					require.Empty(t, e.inbound(mk(fl.client, fl.vip, fl.tcp).to(mac6)).reason)
					reply := mk(fl.vip, fl.client, fl.tcp).to(mac6)
					in := icmpErrFrame(router6, fl.vip.Addr(), mac6, frameExt6(reply, ch.exts...), n, k.unrch)
					res := e.run(e.in, in, vni)
					require.Empty(t, res.reason)
					want := icmpErrFrame(router6, fl.dip.Addr(), mac6, frameExt6(reply.withSrc(fl.dip), ch.exts...), n, k.unrch)
					require.Equal(t, want, res.frame)
					require.Equal(t, fl.dip.Addr(), res.p.Key.DstAddr())
					require.EqualValues(t, 1, e.tr.Stats().ICMPErrors)
				})
				t.Run("return/"+k.name+"/"+fl.name+"/"+ch.name, func(t *testing.T) {
					// The VM's error about a client packet, to the client.
					e := newEnv(t, testRules(), testLocals())
					require.Empty(t, e.inbound(mk(fl.client, fl.vip, fl.tcp).to(mac6)).reason)
					got := mk(fl.client, fl.dip, fl.tcp).to(mac6) // as the VM received it
					in := icmpErrFrame(fl.dip.Addr(), fl.client.Addr(), macGW, frameExt6(got, ch.exts...), n, k.unrch)
					res := e.run(e.ret, in, vni)
					require.Empty(t, res.reason)
					want := icmpErrFrame(fl.vip.Addr(), fl.client.Addr(), macGW, frameExt6(got.withDst(fl.vip), ch.exts...), n, k.unrch)
					require.Equal(t, want, res.frame)
					require.Equal(t, fl.vip.Addr(), res.p.Key.SrcAddr())
					require.EqualValues(t, uplink, res.p.OutPort)
					require.EqualValues(t, 1, e.tr.Stats().ICMPErrors)
				})
			}
		}
	}

	// Quotes the NAT cannot translate: dropped as before, as bad_l4.
	nine := slices.Repeat([]ext6{destOpts6}, header.IPv6MaxExtensionHeaders+1)
	both := []ext6{destOpts6, firstFrag6}
	bad := []struct {
		name string
		exts []ext6
		cut  int // quote length past the fixed header and the chain (negative: into the chain), 0: whole
	}{
		{"chain cut in destination options", both, -12},
		{"chain cut in the fragment header", both, -4},
		{"quote ends after the chain", both, 0 + 1<<16},
		{"quote ends inside the ports", both, 3},
		{"nine headers", nine, 0},
		{"non-first fragment", []ext6{destOpts6, fragment6(1, false)}, 0},
		{"two fragment headers", []ext6{firstFrag6, firstFrag6}, 0},
		{"routing with a segment left", []ext6{destOpts6, routing6(1)}, 0},
	}
	n := func(t *testing.T, exts []ext6, cut int) int {
		switch {
		case cut == 0:
			return 0
		case cut == 1<<16:
			return header.IPv6Size + chainLen6(exts)
		}
		return header.IPv6Size + chainLen6(exts) + cut
	}
	for _, tc := range bad {
		for _, k := range kinds {
			t.Run("drop/"+k.name+"/"+tc.name, func(t *testing.T) {
				e := newEnv(t, testRules(), testLocals())
				fl := flows[0]
				require.Empty(t, e.inbound(tcp(fl.client, fl.vip).to(mac6)).reason)
				reply := tcp(fl.vip, fl.client).to(mac6)
				res := e.run(e.in, icmpErrFrame(router6, fl.vip.Addr(), mac6, frameExt6(reply, tc.exts...), n(t, tc.exts, tc.cut), k.unrch), vni)
				require.Equal(t, "bad_l4", res.reason, "inbound")
				got := tcp(fl.client, fl.dip).to(mac6)
				res = e.run(e.ret, icmpErrFrame(fl.dip.Addr(), fl.client.Addr(), macGW, frameExt6(got, tc.exts...), n(t, tc.exts, tc.cut), k.unrch), vni)
				require.Equal(t, "bad_l4", res.reason, "return")
				require.Zero(t, e.tr.Stats().ICMPErrors)
			})
		}
	}
}

// TestICMPv6ErrorsQuoteExtensionHeadersChecksums: the translated errors'
// checksums verify by gopacket's own decoding (the ICMPv6 checksum over
// the pseudo-header and the whole message, recomputed by gopacket), and
// the quoted TCP checksum by gpkt's RFC 1071 sum over the quoted segment.
func TestICMPv6ErrorsQuoteExtensionHeadersChecksums(t *testing.T) {
	router6 := netip.MustParseAddr("2001:db8:50::1")
	exts := []ext6{destOpts6, destOpts6, firstFrag6}
	e := newEnv(t, testRules(), testLocals())
	require.Empty(t, e.inbound(tcp(ap(client6, 40020), ap(vip6, 443)).to(mac6)).reason)
	quoted := frameExt6(tcp(ap(vip6, 443), ap(client6, 40020)).to(mac6), exts...)
	res := e.run(e.in, icmpErrFrame(router6, vip6, mac6, quoted, 0, false), vni)
	require.Empty(t, res.reason)

	pk := gopacket.NewPacket(res.frame, layers.LayerTypeEthernet, gopacket.Default)
	ip := pk.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	m := pk.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
	stored := m.Checksum
	require.NoError(t, m.SetNetworkLayerForChecksum(ip))
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, m, gopacket.Payload(m.LayerPayload())))
	require.Equal(t, stored, binary.BigEndian.Uint16(buf.Bytes()[2:]), "ICMPv6 checksum vs gopacket's")

	// The quote: its source is the DIP endpoint, its TCP checksum right.
	q := m.LayerPayload()[4:]
	qip := header.IPv6(q)
	require.Equal(t, dip6.As16(), [16]byte(qip.SrcSlice()))
	seg := q[header.IPv6Size+chainLen6(exts):]
	require.EqualValues(t, 8443, binary.BigEndian.Uint16(seg))
	pseudo := append(append(append([]byte(nil), qip.SrcSlice()...), qip.DstSlice()...), 0, 0, 0, 0, 0, 0, 0, flow.ProtoTCP)
	binary.BigEndian.PutUint16(pseudo[34:], uint16(len(seg)))
	require.Zero(t, gpkt.Checksum(append(pseudo, seg...)), "quoted TCP checksum")
}
