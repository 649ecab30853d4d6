package nat_test

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/nat"
)

// exampleTCP builds an Ethernet/IPv4/TCP frame with gopacket.
func exampleTCP(dstMAC net.HardwareAddr, src, dst netip.AddrPort, syn, ack bool) []byte {
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 0xee}, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()), SYN: syn, ACK: ack, Window: 1000}
	_ = tcp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	_ = gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, tcp)
	return buf.Bytes()
}

// describe prints a frame's TCP endpoints and whether its checksums verify.
func describe(who string, f []byte) {
	ip := header.IPv4(f[header.EthernetSize:])
	tcp := header.TCP(ip.Payload())
	src := netip.AddrPortFrom(netip.AddrFrom4(ip.Src()), tcp.SrcPort())
	dst := netip.AddrPortFrom(netip.AddrFrom4(ip.Dst()), tcp.DstPort())
	ok := ip.IsChecksumValid() && tcp.IsChecksumValid(header.PseudoHeaderChecksum(header.ProtoTCP, ip.SrcSlice(), ip.DstSlice(), uint16(len(tcp))))
	fmt.Printf("%s %v -> %v checksums ok: %v\n", who, src, dst, ok)
}

// Example runs a Host Agent's two NAT pipelines on in-memory ports: a
// client's SYN for VIP 198.18.100.1:80 reaches the VM as a SYN for its own
// address 198.19.1.1:8080, and the VM's SYN-ACK leaves the uplink from the
// VIP, straight to the client (DSR).
func Example() {
	const vni = 100
	vmMAC := net.HardwareAddr{2, 0, 0, 0, 1, 1}
	rules := flow.NewRules()
	_, _ = rules.Update(1, []flow.Rule{{
		Name: "web",
		VIP:  flow.VIP{Addr: netip.MustParseAddr("198.18.100.1"), Proto: flow.ProtoTCP, Port: 80, VNI: vni},
		Backends: []flow.Backend{
			{Name: "web-1", Addr: netip.MustParseAddr("198.19.1.1"), Port: 8080, MAC: [6]byte(vmMAC), Weight: 1},
			{Name: "web-2", Addr: netip.MustParseAddr("198.19.2.1"), Port: 8080, MAC: [6]byte{2, 0, 0, 0, 2, 1}, Weight: 1},
		},
	}})
	table, _ := nat.NewTable(nat.TableConfig{Capacity: 1 << 16})
	tr, _ := nat.New(nat.Config{
		Rules:  rules,
		Table:  table,
		DIPs:   []nat.DIP{{VNI: vni, Addr: netip.MustParseAddr("198.19.1.1")}}, // web-1 runs here
		Uplink: 0,
		Infra:  []netip.Prefix{netip.MustParsePrefix("198.18.200.0/24")},
	})

	uplink, _ := engine.NewMemPort(engine.MemPortConfig{Name: "uplink", Capture: true})
	vm, _ := engine.NewMemPort(engine.MemPortConfig{Name: "vm0", Capture: true})
	// Decapsulation would strip VXLAN, parse the inner frame with the VNI
	// and pick the VM's port; the example injects inner frames directly.
	toVM := engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			p.OutPort = 1
		}
	})
	w, _ := engine.NewWorker(engine.WorkerConfig{
		Ports: []engine.Port{uplink, vm},
		Inputs: []engine.Input{
			{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{VNI: vni}, toVM, tr.Inbound())},
			{Port: 1, Pipeline: engine.NewPipeline(engine.Parse{VNI: vni}, tr.Return())},
		},
	})

	client := netip.MustParseAddrPort("198.18.0.7:40000")
	uplink.Inject(exampleTCP(vmMAC, client, netip.MustParseAddrPort("198.18.100.1:80"), true, false))
	w.Poll()
	for _, f := range vm.Transmitted() {
		describe("VM receives", f)
	}

	vm.Inject(exampleTCP(net.HardwareAddr{2, 0, 0, 0, 0, 0xee}, netip.MustParseAddrPort("198.19.1.1:8080"), client, true, true))
	w.Poll()
	for _, f := range uplink.Transmitted() {
		describe("client receives", f)
	}
	s := tr.Stats()
	fmt.Println("inbound", s.Inbound, "return", s.Return, "connections", table.Len())
	// Output:
	// VM receives 198.18.0.7:40000 -> 198.19.1.1:8080 checksums ok: true
	// client receives 198.18.100.1:80 -> 198.18.0.7:40000 checksums ok: true
	// inbound 1 return 1 connections 1
}

// ExampleTable_Lookup shows what the Inbound stage records: the connection
// under the key of its replies (DIP:dport → client:cport), with the
// backend's stable ID and the state class of the client's TCP flags.
func ExampleTable_Lookup() {
	const vni = 100
	rules := flow.NewRules()
	snap, _ := rules.Update(1, []flow.Rule{{
		Name: "web",
		VIP:  flow.VIP{Addr: netip.MustParseAddr("198.18.100.1"), Proto: flow.ProtoTCP, Port: 80, VNI: vni},
		Backends: []flow.Backend{
			{Name: "web-1", Addr: netip.MustParseAddr("198.19.1.1"), Port: 8080, MAC: [6]byte{2, 0, 0, 0, 1, 1}, Weight: 1},
		},
	}})
	table, _ := nat.NewTable(nat.TableConfig{Capacity: 1024})
	tr, _ := nat.New(nat.Config{Rules: rules, Table: table,
		DIPs: []nat.DIP{{VNI: vni, Addr: netip.MustParseAddr("198.19.1.1")}}})

	// One decapsulated client SYN through the Inbound stage.
	client := netip.MustParseAddrPort("198.18.0.7:40000")
	frame := exampleTCP(net.HardwareAddr{2, 0, 0, 0, 1, 1}, client, netip.MustParseAddrPort("198.18.100.1:80"), true, false)
	var p engine.Packet
	p.SetBuffer(nil, 0, frame, 0, len(frame), 0)
	engine.ParsePacket(&p, vni)
	var b engine.Batch
	b.Append(&p)
	tr.Inbound().Process(&b)

	reply := flow.KeyFrom(vni, flow.ProtoTCP, netip.MustParseAddrPort("198.19.1.1:8080"), client)
	e, ok := table.Lookup(&reply, table.Now())
	r, idx, _ := snap.Backend(e.BackendID)
	fmt.Println(reply, ok)
	fmt.Println("backend", r.Backends[idx].Name, "of rule", r.Name, "class", e.Class)
	// Output:
	// vni=100 proto=6 198.19.1.1:8080->198.18.0.7:40000 true
	// backend web-1 of rule web class untrusted
}
