package balance_test

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// query is a DNS-sized UDP datagram from a client port to the VIP
// 198.18.100.1:53: a 20-byte IPv4 header, 8 bytes of UDP and 72 of
// payload, a 100-byte IP packet.
func query(sport uint16) []byte {
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IP{198, 18, 0, 10}, DstIP: net.IP{198, 18, 100, 1}}
	udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: 53}
	_ = udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	_ = gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, udp, gopacket.Payload(make([]byte, 72)))
	return buf.Bytes()
}

// ExampleAccount counts a worker's traffic per backend and per VIP: an
// Account stage after the balancing stage (in a Mux, after encapsulation
// and next hop, with Encapsulated set), read with SumAccounts — what a
// metrics collector does at scrape time, naming backend IDs with the
// current snapshot.
func ExampleAccount() {
	rules := flow.NewRules()
	_, err := rules.Update(1, []flow.Rule{{
		Name: "dns",
		VIP:  flow.VIP{Addr: netip.MustParseAddr("198.18.100.1"), Proto: flow.ProtoUDP, Port: 53},
		// A pinned table size keeps the example's picks (both DIPs used)
		// whatever the default size is.
		TableSize: flow.MaglevDefaultSize,
		Backends: []flow.Backend{
			{Name: "dip1", Addr: netip.MustParseAddr("10.0.0.1"), Weight: 1},
			{Name: "dip2", Addr: netip.MustParseAddr("10.0.0.2"), Weight: 1},
		},
	}})
	if err != nil {
		panic(err)
	}
	conns, _ := flow.NewConnTable(flow.ConnTableConfig{Capacity: 1024})
	bal, _ := balance.New(balance.Config{Rules: rules, Conns: conns, Hasher: flow.NewHasher(1)})
	acct := balance.NewAccount(balance.AccountConfig{Rules: rules})

	port, _ := engine.NewMemPort(engine.MemPortConfig{})
	w, _ := engine.NewWorker(engine.WorkerConfig{
		Ports:  []engine.Port{port},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{}, bal, acct)}},
	})
	// Three flows, the first of them sending twice.
	port.Inject(query(1000), query(1000), query(1001), query(1002))
	w.Poll()

	st := balance.SumAccounts(acct) // one Account per worker
	for _, r := range rules.Load().Rules() {
		fmt.Printf("%s: %+v\n", r.Name, st.VIP(r.VIP))
		for _, b := range r.Backends {
			fmt.Printf("  %s: %+v\n", b.Name, st.Backend(b.ID))
		}
	}
	// Output:
	// dns: {Packets:4 Bytes:400 NewFlows:3}
	//   dip1: {Packets:3 Bytes:300 NewFlows:2}
	//   dip2: {Packets:1 Bytes:100 NewFlows:1}
}
