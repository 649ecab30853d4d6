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

// firstFrag6 is the Fragment header of a first fragment.
var firstFrag6 = gpkt.Fragment6(0, true)

// frameExt6 is p's frame (IPv6, TCP or UDP) with exts between the fixed
// header and the transport header; the transport checksum is gopacket's
// over the segment in the frame.
func frameExt6(p pkt, exts ...gpkt.Ext6) []byte {
	transport := layers.IPProtocol(p.protocol())
	first, chain := gpkt.Chain6(transport, exts...)
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: first, SrcIP: p.src.Addr().AsSlice(), DstIP: p.dst.Addr().AsSlice()}
	ls := append([]gopacket.SerializableLayer{
		&layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, DstMAC: net.HardwareAddr(p.dstMAC[:]), EthernetType: layers.EthernetTypeIPv6},
		ip,
	}, chain...)
	if transport == layers.IPProtocolTCP {
		ls = append(ls, &layers.TCP{SrcPort: layers.TCPPort(p.src.Port()), DstPort: layers.TCPPort(p.dst.Port()),
			Seq: 1000, Ack: 2000, ACK: true, Window: 65000})
	} else {
		ls = append(ls, &layers.UDP{SrcPort: layers.UDPPort(p.src.Port()), DstPort: layers.UDPPort(p.dst.Port())})
	}
	return gpkt.MustSerialize(append(ls, gopacket.Payload("0123456789abcdef0123456789abcdef"))...)
}

// cutAtChain, as a quote's cut (quoteLen6), ends the quote right after
// the extension chain: nothing of the transport header quoted.
const cutAtChain = 1 << 16

// quoteLen6 is the length of the quote (icmpErrFrame's n) of an IPv6
// packet with the extension headers exts, cut bytes past its fixed header
// and chain (negative: into the chain; cutAtChain: right after it); 0,
// the whole packet, when cut is 0.
func quoteLen6(exts []gpkt.Ext6, cut int) int {
	switch cut {
	case 0:
		return 0
	case cutAtChain:
		return header.IPv6Size + gpkt.ChainLen6(exts...)
	}
	return header.IPv6Size + gpkt.ChainLen6(exts...) + cut
}

// extChains6 are the extension chains an ICMPv6 error's quote may hold
// for the translators: the error is translated as the same error without
// them would be. cut is quoteLen6's.
var extChains6 = []struct {
	name string
	exts []gpkt.Ext6
	cut  int
}{
	{"destination options", []gpkt.Ext6{gpkt.DestOpts6}, 0},
	{"first fragment", []gpkt.Ext6{firstFrag6}, 0},
	{"destination options, first fragment", []gpkt.Ext6{gpkt.DestOpts6, firstFrag6}, 0},
	{"destination options, first fragment, quote cut in the payload", []gpkt.Ext6{gpkt.DestOpts6, firstFrag6}, 23},
	{"destination options, first fragment, quote cut after 8 bytes", []gpkt.Ext6{gpkt.DestOpts6, firstFrag6}, 8},
	{"24-byte chain", []gpkt.Ext6{gpkt.DestOpts6, gpkt.DestOpts6, firstFrag6}, 0},
	{"24-byte chain, quote cut in the payload", []gpkt.Ext6{gpkt.DestOpts6, gpkt.DestOpts6, firstFrag6}, 23},
	{"routing (no segments left), destination options", []gpkt.Ext6{gpkt.Routing6(0), gpkt.DestOpts6}, 0},
	{"eight headers", slices.Repeat([]gpkt.Ext6{gpkt.DestOpts6}, header.IPv6MaxExtensionHeaders), 0},
}

// badChains6 are quotes the translators cannot translate, dropped as
// bad_l4: chains cut, too long or malformed, a non-first fragment, a
// quote ending before the ports, a Routing header with segments left
// (the quoted transport checksum's pseudo-header holds the final
// destination). cut is quoteLen6's.
var badChains6 = []struct {
	name string
	exts []gpkt.Ext6
	cut  int
}{
	{"chain cut in destination options", []gpkt.Ext6{gpkt.DestOpts6, firstFrag6}, -12},
	{"chain cut in the fragment header", []gpkt.Ext6{gpkt.DestOpts6, firstFrag6}, -4},
	{"quote ends after the chain", []gpkt.Ext6{gpkt.DestOpts6, firstFrag6}, cutAtChain},
	{"quote ends inside the ports", []gpkt.Ext6{gpkt.DestOpts6, firstFrag6}, 3},
	{"nine headers", slices.Repeat([]gpkt.Ext6{gpkt.DestOpts6}, header.IPv6MaxExtensionHeaders+1), 0},
	{"non-first fragment", []gpkt.Ext6{gpkt.DestOpts6, gpkt.Fragment6(1, false)}, 0},
	{"two fragment headers", []gpkt.Ext6{firstFrag6, firstFrag6}, 0},
	{"routing with a segment left", []gpkt.Ext6{gpkt.DestOpts6, gpkt.Routing6(1)}, 0},
}

// errKinds6 are the ICMPv6 errors the tests quote packets in (icmpErrFrame's
// portUnreach).
var errKinds6 = []struct {
	name  string
	unrch bool // Destination Unreachable (port unreachable), else Packet Too Big
}{{"packet too big", false}, {"destination unreachable", true}}

// icmpv6ErrOracle decodes the ICMPv6 error frame with gopacket, requires
// its ICMPv6 checksum to be the one gopacket computes over the
// pseudo-header and the whole message, and returns the outer IPv6 header
// and the quoted packet.
func icmpv6ErrOracle(t testing.TB, frame []byte) (*layers.IPv6, []byte) {
	t.Helper()
	pk := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	ip, ok := pk.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	require.True(t, ok, "gopacket decode: %v", pk.ErrorLayer())
	m, ok := pk.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
	require.True(t, ok, "gopacket decode: %v", pk.ErrorLayer())
	stored := m.Checksum
	require.NoError(t, m.SetNetworkLayerForChecksum(ip))
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, m, gopacket.Payload(m.LayerPayload())))
	require.Equal(t, stored, binary.BigEndian.Uint16(buf.Bytes()[2:]), "ICMPv6 checksum vs gopacket's")
	return ip, m.LayerPayload()[4:]
}

// quotedOracle6 decodes with gopacket the quoted IPv6 packet q, whose
// transport header (TCP, UDP or ICMPv6 echo request, as proto says) lies
// behind chain bytes of extension headers, and returns its endpoints (an
// echo's identifier as the source port; a TCP header cut short, which
// gopacket does not decode, its ports as they are). With whole (the
// quote holds the whole segment) it requires the quoted transport
// checksum to be the one gopacket computes over the quoted addresses.
func quotedOracle6(t testing.TB, q []byte, chain int, proto uint8, whole bool) (src, dst netip.AddrPort) {
	t.Helper()
	var ip layers.IPv6
	require.NoError(t, ip.DecodeFromBytes(q, gopacket.NilDecodeFeedback), "quoted IPv6 header")
	pseudo := &layers.IPv6{SrcIP: ip.SrcIP, DstIP: ip.DstIP}
	sa, _ := netip.AddrFromSlice(ip.SrcIP)
	da, _ := netip.AddrFromSlice(ip.DstIP)
	seg := q[header.IPv6Size+chain:]
	var l interface {
		gopacket.SerializableLayer
		SetNetworkLayerForChecksum(gopacket.NetworkLayer) error
		LayerPayload() []byte
	}
	var stored uint16
	csOff := 0
	switch proto {
	case flow.ProtoTCP:
		if len(seg) < header.TCPMinSize {
			// Cut in the header, which gopacket does not decode: the
			// ports by hand.
			require.False(t, whole)
			require.GreaterOrEqual(t, len(seg), 4)
			return netip.AddrPortFrom(sa, binary.BigEndian.Uint16(seg)), netip.AddrPortFrom(da, binary.BigEndian.Uint16(seg[2:]))
		}
		pk := gopacket.NewPacket(seg, layers.LayerTypeTCP, gopacket.Default)
		v, ok := pk.Layer(layers.LayerTypeTCP).(*layers.TCP)
		require.True(t, ok, "quoted TCP: %v", pk.ErrorLayer())
		src, dst = netip.AddrPortFrom(sa, uint16(v.SrcPort)), netip.AddrPortFrom(da, uint16(v.DstPort))
		l, stored, csOff = v, v.Checksum, 16
	case flow.ProtoUDP:
		pk := gopacket.NewPacket(seg, layers.LayerTypeUDP, gopacket.Default)
		v, ok := pk.Layer(layers.LayerTypeUDP).(*layers.UDP)
		require.True(t, ok, "quoted UDP: %v", pk.ErrorLayer())
		src, dst = netip.AddrPortFrom(sa, uint16(v.SrcPort)), netip.AddrPortFrom(da, uint16(v.DstPort))
		l, stored, csOff = v, v.Checksum, 6
	case flow.ProtoICMPv6:
		pk := gopacket.NewPacket(seg, layers.LayerTypeICMPv6, gopacket.Default)
		v, ok := pk.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
		require.True(t, ok, "quoted ICMPv6: %v", pk.ErrorLayer())
		require.Equal(t, layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0), v.TypeCode)
		echo, ok := pk.Layer(layers.LayerTypeICMPv6Echo).(*layers.ICMPv6Echo)
		require.True(t, ok, "quoted echo: %v", pk.ErrorLayer())
		src, dst = netip.AddrPortFrom(sa, echo.Identifier), netip.AddrPortFrom(da, 0)
		l, stored, csOff = v, v.Checksum, 2
	default:
		t.Fatalf("quoted protocol %d", proto)
	}
	if whole {
		require.NoError(t, l.SetNetworkLayerForChecksum(pseudo))
		buf := gopacket.NewSerializeBuffer()
		require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, l, gopacket.Payload(l.LayerPayload())))
		require.Equal(t, stored, binary.BigEndian.Uint16(buf.Bytes()[csOff:]), "quoted checksum vs gopacket's")
	}
	return src, dst
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
	for _, ch := range extChains6 {
		n := quoteLen6(ch.exts, ch.cut)
		for _, k := range errKinds6 {
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
	for _, tc := range badChains6 {
		for _, k := range errKinds6 {
			t.Run("drop/"+k.name+"/"+tc.name, func(t *testing.T) {
				e := newEnv(t, testRules(), testLocals())
				fl := flows[0]
				require.Empty(t, e.inbound(tcp(fl.client, fl.vip).to(mac6)).reason)
				reply := tcp(fl.vip, fl.client).to(mac6)
				res := e.run(e.in, icmpErrFrame(router6, fl.vip.Addr(), mac6, frameExt6(reply, tc.exts...), quoteLen6(tc.exts, tc.cut), k.unrch), vni)
				require.Equal(t, "bad_l4", res.reason, "inbound")
				got := tcp(fl.client, fl.dip).to(mac6)
				res = e.run(e.ret, icmpErrFrame(fl.dip.Addr(), fl.client.Addr(), macGW, frameExt6(got, tc.exts...), quoteLen6(tc.exts, tc.cut), k.unrch), vni)
				require.Equal(t, "bad_l4", res.reason, "return")
				require.Zero(t, e.tr.Stats().ICMPErrors)
			})
		}
	}
}

// TestICMPv6ErrorsQuoteExtensionHeadersChecksums: the translated errors'
// checksums verify by gopacket's own decoding (the ICMPv6 checksum over
// the pseudo-header and the whole message, recomputed by gopacket), and
// the quoted TCP checksum by gopacket's over the quoted addresses and
// segment.
func TestICMPv6ErrorsQuoteExtensionHeadersChecksums(t *testing.T) {
	router6 := netip.MustParseAddr("2001:db8:50::1")
	exts := []gpkt.Ext6{gpkt.DestOpts6, gpkt.DestOpts6, firstFrag6}
	e := newEnv(t, testRules(), testLocals())
	require.Empty(t, e.inbound(tcp(ap(client6, 40020), ap(vip6, 443)).to(mac6)).reason)
	quoted := frameExt6(tcp(ap(vip6, 443), ap(client6, 40020)).to(mac6), exts...)
	res := e.run(e.in, icmpErrFrame(router6, vip6, mac6, quoted, 0, false), vni)
	require.Empty(t, res.reason)

	_, q := icmpv6ErrOracle(t, res.frame)
	// The quote: its source is the DIP endpoint, its TCP checksum right.
	src, dst := quotedOracle6(t, q, gpkt.ChainLen6(exts...), flow.ProtoTCP, true)
	require.Equal(t, ap(dip6, 8443), src)
	require.Equal(t, ap(client6, 40020), dst)
}
