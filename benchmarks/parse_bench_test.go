package benchmarks

import (
	"testing"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// parseFrames is the size of the parse benchmark's frame set: small enough
// to stay in L2, so the benchmark measures parsing rather than memory.
const parseFrames = 1024

var keySink flow.Key

// BenchmarkParse parses frames of parseMix (IPv4 TCP and UDP, IPv6 TCP, and
// 802.1Q-tagged IPv4 TCP) to their 5-tuple flow key: ours with
// Packet.SetBuffer and engine.ParsePacket, the peer with gopacket's DecodingLayerParser (see
// gopacketParser) followed by the same flow.Key fill. One op is one frame.
func BenchmarkParse(b *testing.B) {
	ts := traffic(parseFrames, parseMix, 1)
	const group = "parse"
	b.Run("impl=xdplb", func(b *testing.B) {
		// A worker's pool of MaxBatch packets, each pointed at the next
		// frame as a port's Receive does (Packet.SetBuffer, which resets
		// the metadata: included in the time), then ParsePacket.
		var pool [engine.MaxBatch]engine.Packet
		bad := 0
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			p := &pool[i%engine.MaxBatch]
			f := ts.frames[i%parseFrames]
			p.SetBuffer(nil, 0, f, 0, len(f), 0)
			if engine.ParsePacket(p, 0) != 0 {
				bad++
			}
		}
		b.StopTimer()
		if bad != 0 {
			b.Fatalf("%d frames refused", bad)
		}
		keySink = pool[0].Key
		ns := nsPer(b, b.N)
		b.ReportMetric(ns, "ns/frame")
		recordOurs(group, ns)
	})
	b.Run("impl=gopacket", func(b *testing.B) {
		g := newGopacketParser()
		var k flow.Key
		bad := 0
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if !g.parse(ts.frames[i%parseFrames], 0, &k) {
				bad++
			}
		}
		b.StopTimer()
		if bad != 0 {
			b.Fatalf("%d frames refused", bad)
		}
		keySink = k
		ns := nsPer(b, b.N)
		b.ReportMetric(ns, "ns/frame")
		reportPeer(b, group, ns)
	})
}
