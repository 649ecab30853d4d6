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
		exts []gpkt.Ext6
		cut  int // quote length past the fixed header and the chain, 0: whole
	}{
		{"destination options", []gpkt.Ext6{gpkt.DestOpts6}, 0},
		{"first fragment", []gpkt.Ext6{firstFrag6}, 0},
		{"destination options, first fragment", []gpkt.Ext6{gpkt.DestOpts6, firstFrag6}, 0},
		{"destination options, first fragment, quote cut in the payload", []gpkt.Ext6{gpkt.DestOpts6, firstFrag6}, 23},
		{"24-byte chain", []gpkt.Ext6{gpkt.DestOpts6, gpkt.DestOpts6, firstFrag6}, 0},
		{"24-byte chain, quote cut in the payload", []gpkt.Ext6{gpkt.DestOpts6, gpkt.DestOpts6, firstFrag6}, 23},
		{"routing (no segments left), destination options", []gpkt.Ext6{gpkt.Routing6(0), gpkt.DestOpts6}, 0},
		{"eight headers", slices.Repeat([]gpkt.Ext6{gpkt.DestOpts6}, header.IPv6MaxExtensionHeaders), 0},
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
			n = header.IPv6Size + gpkt.ChainLen6(ch.exts...) + ch.cut
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
	nine := slices.Repeat([]gpkt.Ext6{gpkt.DestOpts6}, header.IPv6MaxExtensionHeaders+1)
	both := []gpkt.Ext6{gpkt.DestOpts6, firstFrag6}
	bad := []struct {
		name string
		exts []gpkt.Ext6
		cut  int // quote length past the fixed header and the chain (negative: into the chain), 0: whole
	}{
		{"chain cut in destination options", both, -12},
		{"chain cut in the fragment header", both, -4},
		{"quote ends after the chain", both, 0 + 1<<16},
		{"quote ends inside the ports", both, 3},
		{"nine headers", nine, 0},
		{"non-first fragment", []gpkt.Ext6{gpkt.DestOpts6, gpkt.Fragment6(1, false)}, 0},
		{"two fragment headers", []gpkt.Ext6{firstFrag6, firstFrag6}, 0},
		{"routing with a segment left", []gpkt.Ext6{gpkt.DestOpts6, gpkt.Routing6(1)}, 0},
	}
	n := func(t *testing.T, exts []gpkt.Ext6, cut int) int {
		switch {
		case cut == 0:
			return 0
		case cut == 1<<16:
			return header.IPv6Size + gpkt.ChainLen6(exts...)
		}
		return header.IPv6Size + gpkt.ChainLen6(exts...) + cut
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
	exts := []gpkt.Ext6{gpkt.DestOpts6, gpkt.DestOpts6, firstFrag6}
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
	seg := q[header.IPv6Size+gpkt.ChainLen6(exts...):]
	require.EqualValues(t, 8443, binary.BigEndian.Uint16(seg))
	pseudo := append(append(append([]byte(nil), qip.SrcSlice()...), qip.DstSlice()...), 0, 0, 0, 0, 0, 0, 0, flow.ProtoTCP)
	binary.BigEndian.PutUint16(pseudo[34:], uint16(len(seg)))
	require.Zero(t, gpkt.Checksum(append(pseudo, seg...)), "quoted TCP checksum")
}
