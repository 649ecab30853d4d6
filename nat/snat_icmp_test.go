package nat_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// echoFrame is an ICMP (IPv4) or ICMPv6 echo request or reply from src to
// dst with identifier id, built by gopacket (checksums computed); an IPv6
// one with the extension headers exts (none over IPv4).
func echoFrame(src, dst netip.Addr, dstMAC header.MAC, reply bool, id uint16, exts ...gpkt.Ext6) []byte {
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, DstMAC: net.HardwareAddr(dstMAC[:])}
	payload := gopacket.Payload("ping payload 0123456789")
	if src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip := &layers.IPv4{Version: 4, TTL: 64, Id: 0x4321, Protocol: layers.IPProtocolICMPv4, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		typ := uint8(layers.ICMPv4TypeEchoRequest)
		if reply {
			typ = layers.ICMPv4TypeEchoReply
		}
		return gpkt.MustSerialize(eth, ip, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, 0), Id: id, Seq: 7}, payload)
	}
	eth.EthernetType = layers.EthernetTypeIPv6
	first, chain := gpkt.Chain6(layers.IPProtocolICMPv6, exts...)
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: first, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	typ := uint8(layers.ICMPv6TypeEchoRequest)
	if reply {
		typ = layers.ICMPv6TypeEchoReply
	}
	m := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, 0)}
	ls := append(append([]gopacket.SerializableLayer{eth, ip}, chain...), m, &layers.ICMPv6Echo{Identifier: id, SeqNumber: 7}, payload)
	return gpkt.MustSerialize(ls...)
}

// echoID reads the identifier of the echo message in a frame.
func echoID(t testing.TB, frame []byte, v4 bool) uint16 {
	off := header.EthernetSize + header.IPv6Size
	if v4 {
		off = header.EthernetSize + header.IPv4MinSize
	}
	require.Greater(t, len(frame), off+8)
	return uint16(frame[off+4])<<8 | uint16(frame[off+5])
}

// TestSNATEcho: a VM's ping to the outside leaves from the VIP with an
// identifier of its DIP's ports, the echo reply to the VIP comes back to
// the VM with its own identifier; every byte as gopacket builds it.
func TestSNATEcho(t *testing.T) {
	for _, tc := range []struct {
		name      string
		dip, vip  netip.Addr
		remote    netip.Addr
		first, lo uint16
	}{
		{"icmp", dipA, vipO, remote, 2048, 2111},
		{"icmpv6", dip6, vipO6, remote6, 4096, 4103},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 2111, dipA, vni), alloc(vipO6, 4096, 4103, dip6, vni))
			v4 := tc.dip.Is4()
			req := echoFrame(tc.dip, tc.remote, macGW, false, 0x77)
			res := e.run(e.ret, req, vni)
			require.Empty(t, res.reason)
			id := echoID(t, res.frame, v4)
			require.True(t, id >= tc.first && id <= tc.lo, "identifier %d from the DIP's range", id)
			require.Equal(t, echoFrame(tc.vip, tc.remote, macGW, false, id), res.frame, "translated request")
			require.NotZero(t, res.p.Flags&engine.FlagOutbound)
			require.EqualValues(t, uplink, res.p.OutPort)
			// The same ping again: the same identifier.
			require.Equal(t, id, echoID(t, e.run(e.ret, req, vni).frame, v4))

			back := e.run(e.in, echoFrame(tc.remote, tc.vip, macA, true, id), vni)
			require.Empty(t, back.reason)
			require.Equal(t, echoFrame(tc.remote, tc.dip, macA, true, 0x77), back.frame, "translated reply")
			require.Equal(t, "snat_no_state", e.run(e.in, echoFrame(tc.remote, tc.vip, macA, true, id+1), vni).reason)
			require.EqualValues(t, 3, e.s.Stats().ICMP)
		})
	}
}

// snatRouter and snatRouter6 are routers on the way to the remotes, which
// send the VIP ICMP errors about outbound connections' packets.
var (
	snatRouter  = netip.MustParseAddr("198.18.50.254")
	snatRouter6 = netip.MustParseAddr("2001:db8:50::fe")
)

// TestSNATICMPErrors: an error a router sends to the VIP about an outbound
// connection's packet (fragmentation needed or packet too big, port
// unreachable; about a TCP or UDP packet or a ping; the quote whole or
// cut) reaches the VM with the outer destination and the quoted source
// translated, every checksum as gopacket computes it for the packet the
// VM sent.
func TestSNATICMPErrors(t *testing.T) {
	for _, tc := range []struct {
		name        string
		vm          pkt
		vip         netip.Addr
		from        netip.Addr
		n           int
		portUnreach bool
	}{
		{"tcp4 frag needed", tcp(ap(dipA, 40000), ap(remote, 443)), vipO, snatRouter, 0, false},
		{"tcp4 frag needed, quote cut", tcp(ap(dipA, 40001), ap(remote, 443)), vipO, snatRouter, 28, false},
		{"udp4 port unreachable", udp(ap(dipA, 40002), ap(remote, 53)), vipO, remote, 0, true},
		{"tcp6 packet too big", tcp(ap(dip6, 40003), ap(remote6, 443)), vipO6, snatRouter6, 0, false},
		{"udp6 port unreachable", udp(ap(dip6, 40004), ap(remote6, 53)), vipO6, remote6, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 2111, dipA, vni), alloc(vipO6, 4096, 4103, dip6, vni))
			out := e.out(tc.vm)
			require.Empty(t, out.reason)
			sent := tc.vm.withSrc(ap(tc.vip, out.p.Key.SrcPort))
			res := e.run(e.in, icmpErr(tc.from, tc.vip, macA, sent, tc.n, tc.portUnreach), vni)
			require.Empty(t, res.reason)
			require.Equal(t, icmpErr(tc.from, tc.vm.src.Addr(), macA, tc.vm, tc.n, tc.portUnreach), res.frame)
			require.NotZero(t, res.p.Flags&engine.FlagOutbound)
			// About a port without a connection: dropped.
			other := tc.vm.withSrc(ap(tc.vip, out.p.Key.SrcPort+1))
			require.Equal(t, "snat_no_state", e.run(e.in, icmpErr(tc.from, tc.vip, macA, other, tc.n, tc.portUnreach), vni).reason)
		})
	}
	// About a ping.
	for _, v4 := range []bool{true, false} {
		e := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 2111, dipA, vni), alloc(vipO6, 4096, 4103, dip6, vni))
		dip, vip, rem, from := dipA, vipO, remote, snatRouter
		if !v4 {
			dip, vip, rem, from = dip6, vipO6, remote6, snatRouter6
		}
		res := e.run(e.ret, echoFrame(dip, rem, macGW, false, 0x99), vni)
		require.Empty(t, res.reason)
		id := echoID(t, res.frame, v4)
		got := e.run(e.in, icmpErrFrame(from, vip, macA, echoFrame(vip, rem, macGW, false, id), 0, true), vni)
		require.Empty(t, got.reason, "v4 %v", v4)
		require.Equal(t, icmpErrFrame(from, dip, macA, echoFrame(dip, rem, macGW, false, 0x99), 0, true), got.frame, "v4 %v", v4)
	}
}

// TestSNATICMPErrorQuoteTooShortForEcho: an ICMP or ICMPv6 error to an
// outbound VIP whose quoted echo request is cut before the end of its
// header (the identifier, the SNAT's port, not whole, or no byte of it)
// is unreadable, dropped as bad_l4 like a TCP or UDP quote cut before
// its ports; to an address that is neither a rule's VIP nor an outbound
// VIP it stays nat_no_rule. The SNAT never sees it.
func TestSNATICMPErrorQuoteTooShortForEcho(t *testing.T) {
	for _, tc := range []struct {
		name   string
		v4     bool
		cut    int // bytes of the quoted echo header
		noVIP  bool
		reason string
	}{
		{"icmp, no echo header", true, 0, false, "bad_l4"},
		{"icmp, cut in the identifier", true, 5, false, "bad_l4"},
		{"icmp, cut in the sequence number", true, 7, false, "bad_l4"},
		{"icmpv6, no echo header", false, 0, false, "bad_l4"},
		{"icmpv6, type and code only", false, 2, false, "bad_l4"},
		{"icmpv6, cut in the identifier", false, 5, false, "bad_l4"},
		{"icmp, not an outbound VIP", true, 5, true, "nat_no_rule"},
		{"icmpv6, not an outbound VIP", false, 5, true, "nat_no_rule"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 2111, dipA, vni), alloc(vipO6, 4096, 4103, dip6, vni))
			dip, vip, rem, from, ipLen := dipA, vipO, remote, snatRouter, header.IPv4MinSize
			if !tc.v4 {
				dip, vip, rem, from, ipLen = dip6, vipO6, remote6, snatRouter6, header.IPv6Size
			}
			res := e.run(e.ret, echoFrame(dip, rem, macGW, false, 0x99), vni)
			require.Empty(t, res.reason)
			id := echoID(t, res.frame, tc.v4)
			if tc.noVIP {
				vip = netip.MustParseAddr("198.18.100.50")
				if !tc.v4 {
					vip = netip.MustParseAddr("2001:db8:100::50")
				}
			}
			before := e.s.Stats()
			got := e.run(e.in, icmpErrFrame(from, vip, macA, echoFrame(vip, rem, macGW, false, id), ipLen+tc.cut, true), vni)
			require.Equal(t, tc.reason, got.reason)
			require.Equal(t, map[string]uint64{tc.reason: 1}, e.drop)
			require.Equal(t, before, e.s.Stats())
		})
	}
}
