package pktrate_test

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/xdplb/xdplb/internal/pktrate"
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
