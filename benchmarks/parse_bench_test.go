package benchmarks

import (
	"testing"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// parseFrames is the size of the parse benchmark's frame set: small enough
// to stay in L2, so the benchmark measures parsing rather than memory.
const parseFrames = 1024

var keySink flow.Key

// viewsParse is the least our header package needs to take a frame to its
// 5-tuple, the same job as gopacketParser.parse: header views validated
// with Check (VLAN tags skipped, IPv6 extension headers walked), then the
// key filled. Unlike engine.ParsePacket it records no metadata, handles no
// fragments or ICMP, and has no Packet to reset.
func viewsParse(frame []byte, vni uint32, k *flow.Key) bool {
	et, l3, err := header.ParseEthernet(frame)
	if err != nil {
		return false
	}
	var seg []byte
	var proto uint8
	switch et {
	case header.EtherTypeIPv4:
		ip := header.IPv4(frame[l3:])
		if ip.Check() != nil || ip.IsFragment() {
			return false
		}
		proto, seg = ip.Protocol(), ip.Payload()
	case header.EtherTypeIPv6:
		ip := header.IPv6(frame[l3:])
		if ip.Check() != nil {
			return false
		}
		p, off, frag, err := ip.TransportHeader()
		if err != nil || frag.Present {
			return false
		}
		proto, seg = p, frame[l3+off:l3+header.IPv6Size+int(ip.PayloadLength())]
	default:
		return false
	}
	var sport, dport uint16
	switch proto {
	case flow.ProtoTCP:
		t := header.TCP(seg)
		if t.Check() != nil {
			return false
		}
		sport, dport = t.SrcPort(), t.DstPort()
	case flow.ProtoUDP:
		u := header.UDP(seg)
		if u.Check() != nil {
			return false
		}
		sport, dport = u.SrcPort(), u.DstPort()
	default:
		return false
	}
	if et == header.EtherTypeIPv4 {
		ip := header.IPv4(frame[l3:])
		k.SetIPv4(vni, proto, ip.SrcSlice(), ip.DstSlice(), sport, dport)
	} else {
		ip := header.IPv6(frame[l3:])
		k.SetIPv6(vni, proto, ip.SrcSlice(), ip.DstSlice(), sport, dport)
	}
	return true
}

// BenchmarkParse parses frames of parseMix (IPv4 TCP and UDP, IPv6 TCP, and
// 802.1Q-tagged IPv4 TCP) to their 5-tuple flow key: ours with
// Packet.SetBuffer and engine.ParsePacket (impl=xdplb), and with the header
// views alone (impl=xdplb-views, viewsParse); the peer with gopacket's
// DecodingLayerParser (see gopacketParser) followed by the same flow.Key
// fill. One op is one frame. The peer's row reports its ratio to both:
// ours-speedup (to impl=xdplb) and views-speedup (to impl=xdplb-views).
func BenchmarkParse(b *testing.B) {
	ts := traffic(parseFrames, parseMix, 1)
	const group, vgroup = "parse", "parse-views"
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
	b.Run("impl=xdplb-views", func(b *testing.B) {
		var k flow.Key
		bad := 0
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if !viewsParse(ts.frames[i%parseFrames], 0, &k) {
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
		recordOurs(vgroup, ns)
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
		if o := oursNs[ratioKey(vgroup)]; o > 0 && ns > 0 {
			b.ReportMetric(ns/o, "views-speedup")
		}
	})
}
