package mux

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// The outbound sections of benchDocument: VMs use web4's and web6's
// addresses as their source, from static ranges (benchOutbound); their
// hosts are in benchHosts' /24 (which checkVXLAN requires) but none of
// the backends'.
const benchOutboundDoc = `hosts:
  - name: out1
    address: 198.18.254.201
    vms:
      - {vni: 100, address: 198.18.210.1, mac: "02:00:0f:00:00:01", interface: o1}
      - {vni: 300, address: "2001:db8:210::1", mac: "02:00:0f:00:00:03", interface: o3}
  - name: out2
    address: 198.18.254.202
    vms:
      - {vni: 100, address: 198.18.210.2, mac: "02:00:0f:00:00:02", interface: o2}
outbound:
  - address: 198.19.255.1
    vni: 100
    dips: [198.18.210.1, 198.18.210.2]
    unit: 1024
    static:
      - {dip: 198.18.210.1, ports: 1024-2047}
      - {dip: 198.18.210.2, ports: 2048-3071}
  - address: "2001:db8:100::1"
    vni: 300
    dips: ["2001:db8:210::1"]
    static:
      - {dip: "2001:db8:210::1", ports: 4096-8191}
`

// benchOutbound are the allocations of benchOutboundDoc: the fuzz
// oracle's range table.
var benchOutbound = []flow.PortAllocation{
	{VIP: netip.MustParseAddr("198.19.255.1"), First: 1024, Last: 2047, Owner: flow.PortOwner{DIP: netip.MustParseAddr("198.18.210.1"),
		Host: netip.MustParseAddr("198.18.254.201"), VNI: 100, MAC: [6]byte{2, 0, 0x0f, 0, 0, 1}}},
	{VIP: netip.MustParseAddr("198.19.255.1"), First: 2048, Last: 3071, Owner: flow.PortOwner{DIP: netip.MustParseAddr("198.18.210.2"),
		Host: netip.MustParseAddr("198.18.254.202"), VNI: 100, MAC: [6]byte{2, 0, 0x0f, 0, 0, 2}}},
	{VIP: netip.MustParseAddr("2001:db8:100::1"), First: 4096, Last: 8191, Owner: flow.PortOwner{DIP: netip.MustParseAddr("2001:db8:210::1"),
		Host: netip.MustParseAddr("198.18.254.201"), VNI: 300, MAC: [6]byte{2, 0, 0x0f, 0, 0, 3}}},
}

// benchOwner returns the owner of port p of address a in benchOutbound.
func benchOwner(a netip.Addr, p uint16) (flow.PortOwner, bool) {
	for _, al := range benchOutbound {
		if al.VIP == a && p >= al.First && p <= al.Last {
			return al.Owner, true
		}
	}
	return flow.PortOwner{}, false
}

// muxReturnOwner says, by gopacket's decode of the injected IP packet,
// whether it returns to an outbound connection of benchOutbound, and to
// whose: a TCP or UDP packet (or first fragment) to an allocated port; an
// echo reply whose identifier is allocated; an ICMP error quoting a
// packet from the address, from an allocated TCP or UDP port or an echo
// request with an allocated identifier (behind the quote's IPv6 extension
// headers, quotedIPv6L4; a quote of a later fragment has no ports).
func muxReturnOwner(in *muxInjected) (flow.PortOwner, bool) {
	l4 := in.l4
	if !l4.ok || l4.nonFirst {
		return flow.PortOwner{}, false
	}
	seg := in.ip[l4.off:]
	switch l4.proto {
	case flow.ProtoTCP, flow.ProtoUDP:
		if len(seg) < 4 {
			return flow.PortOwner{}, false
		}
		return benchOwner(in.dst, binary.BigEndian.Uint16(seg[2:]))
	case flow.ProtoICMP, flow.ProtoICMPv6:
	default:
		return flow.PortOwner{}, false
	}
	if (l4.proto == flow.ProtoICMP) != in.v4 || len(seg) < 8 {
		return flow.PortOwner{}, false
	}
	var typ uint8
	var quote []byte
	if in.v4 {
		l, ok := gopacket.NewPacket(seg, layers.LayerTypeICMPv4, gopacket.Default).Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		if !ok {
			return flow.PortOwner{}, false
		}
		switch typ = l.TypeCode.Type(); typ {
		case layers.ICMPv4TypeEchoReply:
			return benchOwner(in.dst, l.Id)
		case layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4TypeTimeExceeded:
			quote = l.Payload
		default:
			return flow.PortOwner{}, false
		}
	} else {
		l, ok := gopacket.NewPacket(seg, layers.LayerTypeICMPv6, gopacket.Default).Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
		if !ok {
			return flow.PortOwner{}, false
		}
		switch typ = l.TypeCode.Type(); typ {
		case layers.ICMPv6TypeEchoReply:
			return benchOwner(in.dst, binary.BigEndian.Uint16(seg[4:])) // the identifier
		case layers.ICMPv6TypeDestinationUnreachable, layers.ICMPv6TypePacketTooBig, layers.ICMPv6TypeTimeExceeded:
			quote = l.Payload[4:]
		default:
			return flow.PortOwner{}, false
		}
	}
	// The quoted packet, as muxFlowVIP reads it.
	var qsrc netip.Addr
	var qproto uint8
	var ql4 []byte
	if in.v4 {
		var ip layers.IPv4
		if len(quote) < 20 {
			return flow.PortOwner{}, false
		}
		_ = ip.DecodeFromBytes(quote, gopacket.NilDecodeFeedback)
		hl := int(ip.IHL) * 4
		if ip.Version != 4 || hl < 20 || hl > len(quote) {
			return flow.PortOwner{}, false
		}
		if ip.FragOffset == 0 {
			ql4 = quote[hl:]
		}
		qsrc, _ = netip.AddrFromSlice(ip.SrcIP)
		qproto = uint8(ip.Protocol)
	} else {
		var ip layers.IPv6
		if len(quote) < 40 {
			return flow.PortOwner{}, false
		}
		_ = ip.DecodeFromBytes(quote, gopacket.NilDecodeFeedback)
		if ip.Version != 6 {
			return flow.PortOwner{}, false
		}
		var ok bool
		if qproto, ql4, ok = quotedIPv6L4(quote); !ok {
			return flow.PortOwner{}, false
		}
		qsrc, _ = netip.AddrFromSlice(ip.SrcIP)
	}
	if qsrc != in.dst {
		return flow.PortOwner{}, false
	}
	switch {
	case (qproto == flow.ProtoTCP || qproto == flow.ProtoUDP) && len(ql4) >= 4:
		return benchOwner(in.dst, binary.BigEndian.Uint16(ql4))
	case in.v4 && qproto == flow.ProtoICMP && len(ql4) >= 8 && ql4[0] == layers.ICMPv4TypeEchoRequest,
		!in.v4 && qproto == flow.ProtoICMPv6 && len(ql4) >= 8 && ql4[0] == layers.ICMPv6TypeEchoRequest:
		return benchOwner(in.dst, binary.BigEndian.Uint16(ql4[4:]))
	}
	return flow.PortOwner{}, false
}

// outboundFuzzSeeds are FuzzMuxPipeline's seeds of returning traffic:
// replies, ICMP errors and echo replies to each owner, both families, and
// the drops of a pool port nobody holds.
func outboundFuzzSeeds(tb testing.TB) []muxFuzzSeed {
	web4, web6 := benchVIPs[0].addr.Addr(), benchVIPs[2].addr.Addr()
	p := gopacket.Payload("reply")
	frame := func(ls ...gopacket.SerializableLayer) []byte { return seedFrame(tb, ls...) }
	quote := func(ls ...gopacket.SerializableLayer) gopacket.Payload {
		q := gpkt.Serialize(tb, ls...)
		n := 28
		if _, ok := ls[0].(*layers.IPv6); ok {
			n = 48
		}
		return gopacket.Payload(q[:n])
	}
	icmp6 := func(typ uint8) *layers.ICMPv6 {
		return &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, 0)}
	}
	// A quote whose IPv6 packet has a Destination Options header.
	destOpts := func(next layers.IPProtocol) *layers.IPv6Destination {
		d := &layers.IPv6Destination{Options: []*layers.IPv6DestinationOption{{OptionType: 0x1e, OptionData: []byte{1, 2, 3, 4}}}}
		d.NextHeader = next
		return d
	}
	quoteExt := func(ls ...gopacket.SerializableLayer) []byte {
		return append([]byte{0, 0, 5, 0}, gpkt.Serialize(tb, ls...)[:64]...)
	}
	return []muxFuzzSeed{
		{name: "return-icmp6-packet-too-big-behind-destination-options", frame: frame(outIP6(seedRouter6, web6, layers.IPProtocolICMPv6),
			icmp6(layers.ICMPv6TypePacketTooBig), gopacket.Payload(quoteExt(outIP6(web6, seedClient6, layers.IPProtocolIPv6Destination),
				destOpts(layers.IPProtocolUDP), outUDP(8000, 53), gopacket.Payload(make([]byte, 1400))))),
			want: []string{"vxlan"}},
		{name: "return-icmp6-time-exceeded-quoting-ping-behind-destination-options", frame: frame(outIP6(seedRouter6, web6, layers.IPProtocolICMPv6),
			icmp6(layers.ICMPv6TypeTimeExceeded), gopacket.Payload(quoteExt(outIP6(web6, seedClient6, layers.IPProtocolIPv6Destination),
				destOpts(layers.IPProtocolICMPv6), icmp6(layers.ICMPv6TypeEchoRequest), &layers.ICMPv6Echo{Identifier: 5000, SeqNumber: 1},
				gopacket.Payload(make([]byte, 64))))),
			want: []string{"vxlan"}},
		{name: "return-tcp4", frame: frame(outIP4(seedClient4, web4, layers.IPProtocolTCP), outTCP(443, 1500), p), twice: true, want: []string{"vxlan", "vxlan"}},
		{name: "return-udp4", frame: frame(outIP4(seedClient4, web4, layers.IPProtocolUDP), outUDP(53, 3071), p), twice: true, sameBatch: true, want: []string{"vxlan", "vxlan"}},
		{name: "return-tcp6", frame: frame(outIP6(seedClient6, web6, layers.IPProtocolTCP), outTCP(443, 4096), p), want: []string{"vxlan"}},
		{name: "return-icmp4-frag-needed", frame: frame(outIP4(seedRouter4, web4, layers.IPProtocolICMPv4), outICMP4(3, 4, 0),
			quote(outIP4(web4, seedClient4, layers.IPProtocolTCP), outTCP(2100, 443), gopacket.Payload(make([]byte, 1400)))), want: []string{"vxlan"}},
		{name: "return-icmp4-quoting-ping", frame: frame(outIP4(seedRouter4, web4, layers.IPProtocolICMPv4), outICMP4(11, 0, 0),
			quote(outIP4(web4, seedClient4, layers.IPProtocolICMPv4), outICMP4(8, 0, 1025), p)), want: []string{"vxlan"}},
		{name: "return-icmp6-packet-too-big", frame: frame(outIP6(seedRouter6, web6, layers.IPProtocolICMPv6), icmp6(layers.ICMPv6TypePacketTooBig),
			gopacket.Payload(append([]byte{0, 0, 5, 0}, quote(outIP6(web6, seedClient6, layers.IPProtocolUDP), outUDP(8000, 53), gopacket.Payload(make([]byte, 1400)))...))),
			want: []string{"vxlan"}},
		{name: "return-echo4-reply", frame: frame(outIP4(seedClient4, web4, layers.IPProtocolICMPv4), outICMP4(0, 0, 2047), p), want: []string{"vxlan"}},
		{name: "return-echo6-reply", frame: frame(outIP6(seedClient6, web6, layers.IPProtocolICMPv6), icmp6(layers.ICMPv6TypeEchoReply),
			&layers.ICMPv6Echo{Identifier: 5000, SeqNumber: 1}, p), want: []string{"vxlan"}},
		{name: "return-unallocated", frame: frame(outIP4(seedClient4, web4, layers.IPProtocolTCP), outTCP(443, 40000), p), want: []string{"drop:outbound_unallocated"}},
		{name: "return-unallocated6", frame: frame(outIP6(seedClient6, web6, layers.IPProtocolUDP), outUDP(53, 1024), p), want: []string{"drop:outbound_unallocated"}},
		{name: "return-outside-pool", frame: frame(outIP4(seedClient4, web4, layers.IPProtocolTCP), outTCP(443, 1000), p), want: []string{"drop:no_rule"}},
	}
}
