package mux

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// TestICMPRateOverWorkers: the ICMP the Mux sends — echo replies from a
// VIP (balance.ICMPConfig.EchoRate: "how many echo requests per second
// the Mux answers") and fragmentation-needed errors (encap.EncapConfig.
// ICMPRate: "over all its workers") — is limited once for the Mux, not
// once per worker: spread over two workers, a burst is answered no more
// than one worker alone would answer it. The bound is the limit's burst
// plus what its rate refills in the time the test took.
func TestICMPRateOverWorkers(t *testing.T) {
	client := netip.MustParseAddr("198.18.0.10")
	dns4 := netip.MustParseAddr("198.19.255.2") // metricsDoc's UDP VIP
	eth := func(et layers.EthernetType) *layers.Ethernet {
		return &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: et}
	}
	echo := gpkt.MustSerialize(eth(layers.EthernetTypeIPv4),
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: client.AsSlice(), DstIP: dns4.AsSlice()},
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 1},
		gopacket.Payload("ping"))
	ip := &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
		SrcIP: client.AsSlice(), DstIP: dns4.AsSlice()}
	udp := &layers.UDP{SrcPort: 40000, DstPort: 53}
	_ = udp.SetNetworkLayerForChecksum(ip)
	big := gpkt.MustSerialize(eth(layers.EthernetTypeIPv4), ip, udp, gopacket.Payload(make([]byte, 1472))) // 1500 bytes of IP: too big for the tunnel

	for _, tc := range []struct {
		name        string
		frame       []byte
		burst, rate float64
		icmpType    uint8 // of the answers
	}{
		{"echo replies", echo, 1000, 1000, layers.ICMPv4TypeEchoReply},
		{"fragmentation needed", big, encap.DefaultICMPRate / 10, encap.DefaultICMPRate, layers.ICMPv4TypeDestinationUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newMetricsRig(t, 2)
			n := 2 * (int(tc.burst) + int(tc.burst)/5) // each worker alone gets more than the burst
			frames := make([][]byte, n)
			for i := range frames {
				frames[i] = tc.frame
			}
			start := time.Now()
			out := r.send(frames)
			elapsed := time.Since(start).Seconds()
			answered := 0
			for _, f := range out {
				pk := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
				if ic, ok := pk.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok && ic.TypeCode.Type() == tc.icmpType {
					answered++
				}
			}
			require.NotZero(t, answered)
			limit := int(tc.burst + tc.rate*elapsed + 1)
			require.LessOrEqual(t, answered, limit,
				"%d of %d answered over 2 workers in %.3fs: the limit is the Mux's, not each worker's", answered, n, elapsed)
			if tc.icmpType == layers.ICMPv4TypeEchoReply {
				require.NotZero(t, r.stats().Drops[balance.DropICMPRate])
			}
		})
	}
}
