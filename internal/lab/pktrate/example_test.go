package pktrate_test

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/xdplb/xdplb/internal/lab/pktrate"
)

// A FrameSpec describes the test traffic; Frame writes one flow's frame
// and SetFlow turns a frame into another flow's in place.
func ExampleFrameSpec() {
	spec := pktrate.FrameSpec{
		SrcMAC:  net.HardwareAddr{0x02, 0, 0, 0, 0, 1},
		DstMAC:  net.HardwareAddr{0x02, 0, 0, 0, 0, 2},
		Src:     netip.MustParseAddr("198.18.0.128"),
		Dst:     netip.MustParseAddr("198.18.1.2"),
		DstPort: 9,
		Size:    64, // on the wire, with FCS
		Flows:   1 << 20,
	}
	if err := spec.Validate(); err != nil {
		panic(err)
	}
	frame := spec.Frame(make([]byte, 2048), 0)
	fmt.Println(len(frame), "bytes in memory")
	for _, i := range []int{0, 1, pktrate.FlowPortsPerAddr, spec.Flows - 1} {
		src, port := spec.Flow(i)
		fmt.Printf("flow %d: %v:%d\n", i, src, port)
	}
	spec.SetFlow(frame, spec.Flows-1)
	// Output:
	// 60 bytes in memory
	// flow 0: 198.18.0.128:32768
	// flow 1: 198.18.0.128:32769
	// flow 32768: 198.18.0.129:32768
	// flow 1048575: 198.18.0.159:65535
}

// Summarize takes the median of each figure over a point's trials.
func ExampleSummarize() {
	trial := func(received uint64, dutCPU time.Duration) pktrate.Sample {
		return pktrate.Sample{
			Window: time.Second, WindowSent: 1_000_000, WindowReceived: received,
			Sent: 1_500_000, Received: 1_500_000 * received / 1_000_000,
			DUTCPU: dutCPU,
		}
	}
	s := pktrate.Summarize([]pktrate.Sample{
		trial(900_000, 450*time.Millisecond),
		trial(1_000_000, 400*time.Millisecond),
		trial(600_000, 600*time.Millisecond), // a noisy trial
	})
	fmt.Printf("delivered %.2f Mpps (%.2f-%.2f), loss %.0f%%, %v per packet\n",
		s.DeliveredPPS/1e6, s.MinDelivered/1e6, s.MaxDelivered/1e6, s.Loss*100, s.CPUPerPacket)
	// Output:
	// delivered 0.90 Mpps (0.60-1.00), loss 10%, 500ns per packet
}

// With VXLAN set, the frame the spec describes is the inner one, behind
// outer headers as a Mux writes them; flows differ in the outer UDP source
// port too.
func ExampleFrameSpec_vxlan() {
	spec := pktrate.FrameSpec{
		SrcMAC:  net.HardwareAddr{0x02, 0, 0, 0, 0, 1},
		DstMAC:  net.HardwareAddr{0x02, 0, 0, 0, 0, 3}, // the VM's
		Src:     netip.MustParseAddr("198.18.0.128"),
		Dst:     pktrate.VIPAddr,
		DstPort: pktrate.DstPort,
		Size:    64,
		Flows:   1000,
		VXLAN: &pktrate.VXLANSpec{
			SrcMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 1},
			DstMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 2}, // the host's
			Src:    netip.MustParseAddr("198.18.0.1"),
			Dst:    netip.MustParseAddr("198.18.0.2"),
			VNI:    pktrate.TunnelVNI,
		},
	}
	if err := spec.Validate(); err != nil {
		panic(err)
	}
	frame := spec.Frame(make([]byte, 2048), 7)
	fmt.Println(len(frame), "bytes in memory,", pktrate.VXLANOverhead, "of them outer headers")
	fmt.Println("outer source port of flow 7:", pktrate.VXLANSourcePort(7))
	// Output:
	// 110 bytes in memory, 50 of them outer headers
	// outer source port of flow 7: 54497
}

// The Mux under test serves one VIP from eight backends on four hosts,
// without probes (backends without one count as healthy) and without BGP.
func ExampleMuxDocument() {
	fmt.Print(pktrate.MuxDocument())
	// Output:
	// # Written by internal/lab/pktrate for the Mux under test.
	// version: 1
	// hash_seed: 0x5eed1234
	// vips:
	//   - name: bench
	//     address: 198.18.2.1
	//     protocol: udp
	//     port: 9
	//     vni: 100
	//     backends:
	//       - {name: dip1, address: 198.18.5.1, port: 7009, mac: "02:00:00:00:05:01", host: 198.18.4.1}
	//       - {name: dip2, address: 198.18.5.2, port: 7009, mac: "02:00:00:00:05:02", host: 198.18.4.1}
	//       - {name: dip3, address: 198.18.5.3, port: 7009, mac: "02:00:00:00:05:03", host: 198.18.4.2}
	//       - {name: dip4, address: 198.18.5.4, port: 7009, mac: "02:00:00:00:05:04", host: 198.18.4.2}
	//       - {name: dip5, address: 198.18.5.5, port: 7009, mac: "02:00:00:00:05:05", host: 198.18.4.3}
	//       - {name: dip6, address: 198.18.5.6, port: 7009, mac: "02:00:00:00:05:06", host: 198.18.4.3}
	//       - {name: dip7, address: 198.18.5.7, port: 7009, mac: "02:00:00:00:05:07", host: 198.18.4.4}
	//       - {name: dip8, address: 198.18.5.8, port: 7009, mac: "02:00:00:00:05:08", host: 198.18.4.4}
}
