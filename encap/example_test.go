package encap_test

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// clientFrame is a UDP datagram from a client to a VIP, as the router
// hands it to the Mux.
func clientFrame() []byte {
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
		SrcIP: net.IP{198, 18, 0, 10}, DstIP: net.IP{198, 18, 100, 1}}
	udp := &layers.UDP{SrcPort: 40000, DstPort: 53}
	_ = udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	_ = gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, udp, gopacket.Payload("query"))
	return buf.Bytes()
}

// Example runs the Mux's pipeline — parse, balance, VXLAN encapsulation,
// next hop — over an in-memory uplink and prints the tunnel packet it
// sends.
func Example() {
	rules := flow.NewRules()
	_, err := rules.Update(1, []flow.Rule{{
		Name: "dns",
		VIP:  flow.VIP{Addr: netip.MustParseAddr("198.18.100.1"), Proto: flow.ProtoUDP, Port: 53, VNI: 7001},
		Backends: []flow.Backend{{
			Name:   "dip1",
			Addr:   netip.MustParseAddr("10.0.0.5"), // the tenant's address space
			MAC:    [6]byte{2, 0, 0, 0, 0xaa, 1},
			Host:   netip.MustParseAddr("198.19.2.2"),
			Weight: 1,
		}},
	}})
	if err != nil {
		panic(err)
	}
	bal, _ := balance.New(balance.Config{Rules: rules, Hasher: flow.NewHasher(1)})
	enc, err := encap.NewEncap(encap.EncapConfig{SourceV4: netip.MustParseAddr("198.18.1.1")})
	if err != nil {
		panic(err)
	}
	// Fixed next hops; a Mux uses a *nexthop.Resolver, which follows the
	// kernel's routes and neighbours.
	hops := nexthop.Static{Hops: map[netip.Addr]nexthop.Hop{netip.MustParseAddr("198.19.2.2"): {
		IfIndex: 2, SrcMAC: [6]byte{2, 0, 0, 0, 0, 2}, DstMAC: [6]byte{2, 0, 0, 0, 0, 0xfe}}}}
	nh, err := nexthop.NewStage(nexthop.StageConfig{Mode: nexthop.OuterDst, Ports: map[int]uint16{2: 0}}, hops)
	if err != nil {
		panic(err)
	}

	uplink, _ := engine.NewMemPort(engine.MemPortConfig{Name: "uplink", Capture: true})
	w, _ := engine.NewWorker(engine.WorkerConfig{
		Ports: []engine.Port{uplink},
		// flow.Snapshot.Lookup matches a VIP within the flow key's VNI,
		// which the parser sets.
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{VNI: 7001}, bal, enc, nh)}},
	})
	uplink.Inject(clientFrame())
	w.Poll()

	for _, f := range uplink.Transmitted() {
		eth := header.Ethernet(f)
		ip := header.IPv4(f[header.EthernetSize:])
		udp := header.UDP(ip.Payload())
		vx := header.VXLAN(udp.Payload())
		inner := header.Ethernet(vx.Payload())
		fmt.Println("outer ethernet:", eth.Src(), "->", eth.Dst())
		fmt.Println("outer ip:", netip.AddrFrom4(ip.Src()), "->", netip.AddrFrom4(ip.Dst()),
			"DF:", ip.DontFragment(), "checksum ok:", ip.IsChecksumValid(), "length:", ip.TotalLength())
		fmt.Println("outer udp: dst port", udp.DstPort(), "src port in 49152-65535:", udp.SrcPort() >= 49152)
		fmt.Println("vxlan: vni", vx.VNI())
		fmt.Println("inner ethernet:", inner.Src(), "->", inner.Dst())
	}
	// Output:
	// outer ethernet: 02:00:00:00:00:02 -> 02:00:00:00:00:fe
	// outer ip: 198.18.1.1 -> 198.19.2.2 DF: true checksum ok: true length: 83
	// outer udp: dst port 4789 src port in 49152-65535: true
	// vxlan: vni 7001
	// inner ethernet: 02:00:00:00:00:01 -> 02:00:00:00:aa:01
}

// Example_hostAgent ends the tunnel on the host: Decap checks the outer
// headers, finds the endpoint by (VNI, inner MAC), strips the encapsulation
// and parses the inner frame.
func Example_hostAgent() {
	locals, err := encap.NewEndpoints([]encap.Endpoint{
		{VNI: 7001, MAC: header.MAC{2, 0, 0, 0, 0xaa, 1}, Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}, OutPort: 1, Name: "vm1"},
	})
	if err != nil {
		panic(err)
	}
	var table encap.EndpointTable
	table.Store(locals)
	dec, err := encap.NewDecap(encap.DecapConfig{Addrs: []netip.Addr{netip.MustParseAddr("198.19.2.2")}}, &table)
	if err != nil {
		panic(err)
	}

	// The frame a Mux sent (built here with the Encap stage alone).
	enc, _ := encap.NewEncap(encap.EncapConfig{SourceV4: netip.MustParseAddr("198.18.1.1")})
	rule := &flow.Rule{VIP: flow.VIP{VNI: 7001}, Backends: []flow.Backend{{
		MAC: [6]byte{2, 0, 0, 0, 0xaa, 1}, Host: netip.MustParseAddr("198.19.2.2")}}}
	frame := clientFrame()
	buf := make([]byte, 2048)
	copy(buf[engine.DefaultHeadroom:], frame)
	var p engine.Packet
	p.SetBuffer(nil, 0, buf, engine.DefaultHeadroom, len(frame), 0)
	engine.ParsePacket(&p, 0)
	p.Rule, p.Backend = rule, 0
	var b engine.Batch
	b.Append(&p)
	enc.Process(&b)
	fmt.Println("tunnel frame:", p.Len(), "bytes")

	dec.Process(&b)
	l, _ := table.Load().Of(&p)
	fmt.Println("delivered to", l.Name, "on port", p.OutPort, "frame:", p.Len(), "bytes")
	fmt.Println("flow:", p.Key)
	// Output:
	// tunnel frame: 97 bytes
	// delivered to vm1 on port 1 frame: 47 bytes
	// flow: vni=7001 proto=17 198.18.0.10:40000->198.18.100.1:53
}
