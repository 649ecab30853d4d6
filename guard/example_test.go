package guard_test

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/guard"
)

// udpFrom returns a UDP datagram from src to the VIP 198.18.100.1:53.
func udpFrom(src string) []byte {
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP,
		SrcIP: net.ParseIP(src).To4(), DstIP: net.IP{198, 18, 100, 1}}
	udp := &layers.UDP{SrcPort: 7, DstPort: 53}
	_ = udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	_ = gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, udp, gopacket.Payload("query"))
	return buf.Bytes()
}

// The source filter in front of a Mux's balancer: a client passes; a
// packet claiming to come from a VIP (the start of a loop: the backend
// would answer the VIP), from a martian address, from the node itself or
// from the infrastructure is dropped with its reason.
func ExampleSources() {
	rules := flow.NewRules()
	_, err := rules.Update(1, []flow.Rule{{
		Name: "dns",
		VIP:  flow.VIP{Addr: netip.MustParseAddr("198.18.100.1"), Proto: flow.ProtoUDP, Port: 53},
		Backends: []flow.Backend{{Name: "dip1", Addr: netip.MustParseAddr("198.19.1.1"),
			Host: netip.MustParseAddr("198.19.0.1"), Weight: 1}},
	}})
	if err != nil {
		panic(err)
	}
	src, err := guard.NewSources(guard.SourcesConfig{
		Rules: rules,
		Node:  []netip.Addr{netip.MustParseAddr("198.18.1.1")},
		Infra: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24")},
	})
	if err != nil {
		panic(err)
	}

	var b engine.Batch
	b.Snapshot = rules.Load() // a worker loads it once per batch
	for _, from := range []string{"198.18.5.7", "198.18.100.1", "127.0.0.1", "198.18.1.1", "198.18.0.9"} {
		frame := udpFrom(from)
		buf := make([]byte, 2048)
		copy(buf[engine.DefaultHeadroom:], frame)
		p := new(engine.Packet)
		p.SetBuffer(nil, 0, buf, engine.DefaultHeadroom, len(frame), 0)
		engine.ParsePacket(p, 0)
		b.Append(p)
	}
	src.Process(&b)
	for _, p := range b.Packets() {
		if p.Verdict == engine.VerdictDrop {
			fmt.Printf("%-13s dropped: %v\n", netip.AddrFrom4([4]byte(p.Key.Src[:4])), p.Reason)
		} else {
			fmt.Printf("%-13s passes\n", netip.AddrFrom4([4]byte(p.Key.Src[:4])))
		}
	}
	// Output:
	// 198.18.5.7    passes
	// 198.18.100.1  dropped: src_vip
	// 127.0.0.1     dropped: src_martian
	// 198.18.1.1    dropped: src_node
	// 198.18.0.9    dropped: src_infra
}
