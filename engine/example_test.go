package engine_test

import (
	"fmt"
	"net"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/header"
)

// udpFrame builds an Ethernet/IPv4/UDP frame with gopacket (test helper).
func udpFrame(src, dst string, sport, dport uint16) []byte {
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.ParseIP(src), DstIP: net.ParseIP(dst)}
	udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
	_ = udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	_ = gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, udp, gopacket.Payload("ping"))
	return buf.Bytes()
}

var dropPort9 = engine.RegisterDropReason("example_port_9")

// Example assembles a pipeline from stages — the engine's parser, a filter
// and a stage that swaps the MAC addresses — and runs it over an in-memory
// port.
func Example() {
	port, _ := engine.NewMemPort(engine.MemPortConfig{Name: "mem0", Capture: true})

	filter := engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			if p.Key.DstPort == 9 {
				b.Drop(p, dropPort9)
			}
		}
	})
	swapMAC := engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			eth := header.Ethernet(p.Data())
			src, dst := eth.Src(), eth.Dst()
			eth.SetSrc(dst)
			eth.SetDst(src)
		}
	})
	pl := engine.NewPipeline(engine.Parse{}, filter, swapMAC)

	w, _ := engine.NewWorker(engine.WorkerConfig{
		Ports:  []engine.Port{port},
		Inputs: []engine.Input{{Port: 0, Pipeline: pl}},
	})
	port.Inject(
		udpFrame("198.18.0.1", "198.18.1.1", 1000, 53),
		udpFrame("198.18.0.1", "198.18.1.1", 1000, 9),
		[]byte{1, 2, 3}, // runt
	)
	w.Poll()

	for _, f := range port.Transmitted() {
		eth := header.Ethernet(f)
		fmt.Println("sent to", eth.Dst(), "from", eth.Src())
	}
	var s engine.Stats
	w.Counters().Snapshot(&s)
	fmt.Println("rx", s.RX, "tx", s.TX, "drops", s.DropsByName())
	// Output:
	// sent to 02:00:00:00:00:01 from 02:00:00:00:00:02
	// rx 3 tx 1 drops map[example_port_9:1 truncated:1]
}

// hopCounter is one stage shared by every worker of an engine; each worker
// counts in its own slot, with no locks and no shared cache line.
type hopCounter struct {
	perWorker engine.PerWorker[int]
}

func (s *hopCounter) Process(b *engine.Batch) {
	if n := s.perWorker.Get(b.Worker); n != nil {
		*n += b.Len()
	}
}

func ExamplePerWorker() {
	st := &hopCounter{}
	var b engine.Batch
	pkts := make([]engine.Packet, 3)
	for i := range pkts {
		b.Append(&pkts[i])
	}
	b.Worker = 2 // what the worker with ID 2 sets on its batches
	st.Process(&b)
	st.Process(&b)
	st.perWorker.Range(func(w int, n *int) bool {
		fmt.Println("worker", w, "counted", *n)
		return true
	})
	// Output:
	// worker 2 counted 6
}
