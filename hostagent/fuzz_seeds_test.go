package hostagent

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// pipelineSeed is one f.Add.
type pipelineSeed struct {
	port1  uint8
	frame1 []byte
	port2  uint8
	frame2 []byte
}

// pipelineSeeds are conversations and single frames of every kind the
// pipelines translate, and many they refuse.
func pipelineSeeds(tb testing.TB) []pipelineSeed {
	macA, macB := fuzzVMs[1].mac, fuzzVMs[2].mac
	dipA := netip.AddrPortFrom(fuzzVMs[1].dip, fuzzDIPPort)
	dipB := netip.AddrPortFrom(fuzzVMs[2].dip, fuzzDIPPort)
	clientMAC := net.HardwareAddr{2, 0, 0, 0, 0xee, 1}
	router := netip.MustParseAddr("198.18.50.1")

	// The round trip of TestPipelinesDSRRoundTrip.
	inA, inB := vxlanFrame(tb, macA, "GET /"), vxlanFrame(tb, macB, "GET /")
	replyA := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macA, dipA, pipeClient, true, true, "")...)
	replyB := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macB, dipB, pipeClient, true, true, "")...)
	finA := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macA, dipA, pipeClient, false, true, "bye")...)
	finA[14+20+13] |= 0x01 // FIN (the checksum is then wrong: a fuzzer's kind of input)
	badIPSum := append([]byte(nil), replyA...)
	badIPSum[14+10] ^= 0x5a // a wrong IPv4 header checksum stays wrong

	// Inner frames, wrapped in VXLAN like vxlanFrame's.
	client := func(syn, ack bool, payload string) []gopacket.SerializableLayer {
		return tcpLayers(macA, clientMAC, pipeClient, pipeVIP, syn, ack, payload)
	}
	ack := gpkt.Serialize(tb, client(false, true, "more data")...)
	frag1 := client(false, true, "first fragment, with the ports")
	frag1[1].(*layers.IPv4).Flags = layers.IPv4MoreFragments
	fragN := client(false, true, "")
	fragN[1].(*layers.IPv4).FragOffset = 3
	fragN[1].(*layers.IPv4).Protocol = layers.IPProtocolTCP
	fragN = append(fragN[:2], gopacket.Payload("the rest of the datagram"))
	vlan := client(false, true, "tagged")
	vlan[0].(*layers.Ethernet).EthernetType = layers.EthernetTypeDot1Q
	vlan = append([]gopacket.SerializableLayer{vlan[0], &layers.Dot1Q{VLANIdentifier: 5, Type: layers.EthernetTypeIPv4}}, vlan[1:]...)
	ect0 := client(false, true, "ect0")
	ect0[1].(*layers.IPv4).TOS = ecnECT0

	udpIn := func(csum bool) []byte {
		eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: macA, EthernetType: layers.EthernetTypeIPv4}
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: pipeClient.Addr().AsSlice(), DstIP: pipeVIP.Addr().AsSlice()}
		u := &layers.UDP{SrcPort: 40001, DstPort: 80}
		if csum {
			_ = u.SetNetworkLayerForChecksum(ip)
			return gpkt.Serialize(tb, eth, ip, u, gopacket.Payload("no UDP VIP"))
		}
		buf := gopacket.NewSerializeBuffer()
		require.NoError(tb, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, eth, ip, u, gopacket.Payload("no checksum")))
		f := append([]byte(nil), buf.Bytes()...)
		binary.BigEndian.PutUint16(f[14+10:], 0)
		binary.BigEndian.PutUint16(f[14+10:], gpkt.Checksum(f[14:34]))
		return f
	}
	ipv6In := func() []byte {
		eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: macA, EthernetType: layers.EthernetTypeIPv6}
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP,
			SrcIP: net.ParseIP("2001:db8:5::2"), DstIP: net.ParseIP("2001:db8:100::1")}
		tcp := &layers.TCP{SrcPort: 40000, DstPort: 80, SYN: true, Window: 1000}
		_ = tcp.SetNetworkLayerForChecksum(ip)
		return gpkt.Serialize(tb, eth, ip, tcp, gopacket.Payload("v6"))
	}

	// ICMP errors. Inbound: a router about the VIP's reply to the client,
	// which the Mux sends to the DIP's host. Return: the VM about the
	// client's packet, which it received translated.
	icmpErr := func(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, code uint8, quote []byte) []byte {
		eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv4}
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, code), Seq: 1400}
		return gpkt.Serialize(tb, eth, ip, icmp, gopacket.Payload(quote))
	}
	vipReply := gpkt.Serialize(tb, tcpLayers(clientMAC, macA, pipeVIP, pipeClient, true, true, "")[1:]...)
	toDIP := gpkt.Serialize(tb, tcpLayers(macA, clientMAC, pipeClient, dipA, true, false, "GET /")[1:]...)
	routerErr := icmpErr(macA, clientMAC, router, pipeVIP.Addr(), layers.ICMPv4CodeFragmentationNeeded, vipReply)
	routerErrShort := icmpErr(macA, clientMAC, router, pipeVIP.Addr(), layers.ICMPv4CodeFragmentationNeeded, vipReply[:28])
	vmErr := icmpErr(uplinkMAC, macA, dipA.Addr(), pipeClient.Addr(), layers.ICMPv4CodePort, toDIP)
	vmErrShort := icmpErr(uplinkMAC, macA, dipA.Addr(), pipeClient.Addr(), layers.ICMPv4CodePort, toDIP[:28])
	// An error from another address of the VM (its own router, say): the
	// quote names the connection, the outer source becomes the VIP too.
	vmErrOther := icmpErr(uplinkMAC, macA, netip.MustParseAddr("198.18.4.254"), pipeClient.Addr(), layers.ICMPv4CodeFragmentationNeeded, toDIP)

	// Return oddities.
	fragReply := tcpLayers(uplinkMAC, macA, dipA, pipeClient, false, true, "")
	fragReply[1].(*layers.IPv4).FragOffset = 3
	fragReply = append(fragReply[:2], gopacket.Payload("tail of a reply"))
	toInfra := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macA, dipA, netip.MustParseAddrPort("198.18.1.2:5000"), true, true, "")...)
	synOut := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macA, dipA, pipeClient, true, false, "")...)
	wrongVM := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macB, dipB, pipeClient, false, true, "from vm_b's DIP on vm_a")...)

	// Malformed VXLAN.
	noI := wrapVXLAN(tb, ack, func(_ *layers.IPv4, vx *layers.VXLAN) { vx.ValidIDFlag = false })
	shortVXLAN := func() []byte {
		p := gopacket.NewPacket(inA, layers.LayerTypeEthernet, gopacket.Default)
		eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		udp := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		_ = udp.SetNetworkLayerForChecksum(ip)
		return gpkt.Serialize(tb, eth, ip, udp, gopacket.Payload{0x08, 0, 0})
	}()
	ce := func(ip *layers.IPv4, _ *layers.VXLAN) { ip.TOS = ecnCE }
	ect1 := func(ip *layers.IPv4, _ *layers.VXLAN) { ip.TOS = ecnECT1 }

	// Spoofed clients and tunnels, expiring replies (TestPipelinesGuard).
	fromVIP := gpkt.Serialize(tb, tcpLayers(macA, clientMAC, pipeVIP, pipeVIP, true, false, "loop")...)
	fromLoopback := gpkt.Serialize(tb, tcpLayers(macA, clientMAC, netip.MustParseAddrPort("127.0.0.1:40000"), pipeVIP, true, false, "")...)
	notMux := wrapVXLAN(tb, ack, func(ip *layers.IPv4, _ *layers.VXLAN) { ip.SrcIP = pipeClient.Addr().AsSlice() })
	toVIP := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macA, dipA, pipeVIP, true, true, "")...)
	ttlReply := func(ttl uint8) []byte {
		ls := tcpLayers(uplinkMAC, macA, dipA, pipeClient, true, true, "")
		ls[1].(*layers.IPv4).TTL = ttl
		return gpkt.Serialize(tb, ls...)
	}

	up := func(frame []byte) pipelineSeed { return pipelineSeed{port1: UplinkPort, frame1: frame} }
	conv := func(frame1 []byte, vm uint8, frame2 []byte) pipelineSeed {
		return pipelineSeed{port1: UplinkPort, frame1: frame1, port2: vm, frame2: frame2}
	}
	return []pipelineSeed{
		conv(inA, 1, replyA),
		conv(inB, 2, replyB),
		conv(inA, 1, finA),
		conv(inA, 1, vmErr),
		conv(inA, 1, vmErrShort),
		conv(inA, 1, vmErrOther),
		conv(inA, 1, synOut),
		conv(inA, 1, wrongVM),
		conv(inB, 1, replyA),
		conv(wrapVXLAN(tb, ack, nil), 1, replyA),
		up(wrapVXLAN(tb, gpkt.Serialize(tb, frag1...), nil)),
		up(wrapVXLAN(tb, gpkt.Serialize(tb, fragN...), nil)),
		up(wrapVXLAN(tb, gpkt.Serialize(tb, vlan...), nil)),
		up(wrapVXLAN(tb, gpkt.Serialize(tb, ect0...), ce)),
		up(wrapVXLAN(tb, gpkt.Serialize(tb, ect0...), ect1)),
		up(wrapVXLAN(tb, ack, ce)),
		up(wrapVXLAN(tb, udpIn(true), nil)),
		up(wrapVXLAN(tb, udpIn(false), nil)),
		up(wrapVXLAN(tb, ipv6In(), nil)),
		up(wrapVXLAN(tb, routerErr, nil)),
		up(wrapVXLAN(tb, routerErrShort, nil)),
		up(wrapVXLAN(tb, ack, func(_ *layers.IPv4, vx *layers.VXLAN) { vx.VNI = 200 })),
		up(vxlanFrame(tb, net.HardwareAddr{2, 0, 0, 0, 9, 9}, "unknown inner MAC")),
		up(noI),
		up(shortVXLAN),
		up(inA[:46]),
		up(inA[:len(inA)-3]),
		up(append(append([]byte(nil), inA...), make([]byte, 20)...)), // Ethernet padding
		up(replyA), // not VXLAN
		{port1: 1, frame1: replyA},
		{port1: 2, frame1: replyB},
		{port1: 1, frame1: vmErr},
		{port1: 1, frame1: gpkt.Serialize(tb, fragReply...)},
		{port1: 1, frame1: badIPSum},
		{port1: 1, frame1: toInfra},
		{port1: 1, frame1: inA}, // VXLAN from a VM: not the VM port's business
		{port1: 2, frame1: []byte("garbage, not even an Ethernet header's worth of sense")},
		{port1: 0, frame1: []byte{}},
		{port1: 1, frame1: make([]byte, 60)},
		{port1: 0, frame1: arpRequest()},
		up(wrapVXLAN(tb, fromVIP, nil)),
		up(wrapVXLAN(tb, fromLoopback, nil)),
		up(notMux),
		conv(inA, 1, toVIP),
		conv(inA, 1, ttlReply(1)),
		conv(inA, 1, ttlReply(2)),
	}
}

// arpRequest is an ARP request on the uplink: not IP at all.
func arpRequest() []byte {
	b := make([]byte, 42)
	copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(b[6:], routerMAC)
	binary.BigEndian.PutUint16(b[12:], uint16(layers.EthernetTypeARP))
	copy(b[14:], []byte{0, 1, 8, 0, 6, 4, 0, 1}) // Ethernet, IPv4, request
	return b
}
