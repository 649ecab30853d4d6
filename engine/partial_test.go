package engine_test

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// partialFrame is a golden frame built by gopacket (complete checksum) and
// where its transport checksum lives.
type partialFrame struct {
	name     string
	frame    []byte
	l3, l4   int // offsets of the IP header and the transport segment
	csum     int // offset of the checksum field in the frame
	segEnd   int // end of the IP datagram (Ethernet padding follows)
	proto    uint8
	v6       bool
	fragment bool
}

// partialFrames: TCP and UDP over IPv4 and IPv6, a VLAN tag, an IPv6
// Hop-by-Hop header, Ethernet padding, a full-size segment.
func partialFrames(t testing.TB) []partialFrame {
	data := func(n int) gopacket.Payload {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*13 + 5)
		}
		return b
	}
	var fs []partialFrame
	add := func(name string, frame []byte, l3, l4 int, proto uint8, v6 bool) {
		end := len(frame)
		if !v6 {
			end = l3 + int(binary.BigEndian.Uint16(frame[l3+2:]))
		}
		off := 16
		if proto == 17 {
			off = 6
		}
		fs = append(fs, partialFrame{name: name, frame: frame, l3: l3, l4: l4, csum: l4 + off, segEnd: end, proto: proto, v6: v6})
	}
	for _, n := range []int{0, 5, 64, 1400} {
		ip4, ip6 := gpIPv4(layers.IPProtocolTCP), gpIPv6(layers.IPProtocolTCP)
		tcp4, tcp6 := gpTCP(ip4, 40000, 80), gpTCP(ip6, 40000, 80)
		tcp4.SYN, tcp4.ACK, tcp6.SYN, tcp6.ACK = false, true, false, true
		add(name("tcp4", n), gpkt.Serialize(t, gpEth(layers.EthernetTypeIPv4), ip4, tcp4, data(n)), 14, 34, 6, false)
		add(name("tcp6", n), gpkt.Serialize(t, gpEth(layers.EthernetTypeIPv6), ip6, tcp6, data(n)), 14, 54, 6, true)
		ip4, ip6 = gpIPv4(layers.IPProtocolUDP), gpIPv6(layers.IPProtocolUDP)
		add(name("udp4", n), gpkt.Serialize(t, gpEth(layers.EthernetTypeIPv4), ip4, gpUDP(ip4, 40000, 53), data(n)), 14, 34, 17, false)
		add(name("udp6", n), gpkt.Serialize(t, gpEth(layers.EthernetTypeIPv6), ip6, gpUDP(ip6, 40000, 53), data(n)), 14, 54, 17, true)
	}
	// 802.1Q.
	ip4 := gpIPv4(layers.IPProtocolTCP)
	add("tcp4-vlan", gpkt.Serialize(t, &layers.Ethernet{SrcMAC: pMACa, DstMAC: pMACb, EthernetType: layers.EthernetTypeDot1Q},
		&layers.Dot1Q{VLANIdentifier: 7, Type: layers.EthernetTypeIPv4}, ip4, gpTCP(ip4, 1, 2), data(33)), 18, 38, 6, false)
	// IPv6 with a Hop-by-Hop header spliced in front of the segment: the
	// pseudo-header (addresses, upper-layer length) is unchanged by it.
	ip6 := gpIPv6(layers.IPProtocolUDP)
	plain := gpkt.Serialize(t, gpEth(layers.EthernetTypeIPv6), ip6, gpUDP(ip6, 5, 6), data(100))
	ext := slices.Concat(plain[:54], ipv6Ext(layers.IPProtocolUDP), plain[54:])
	ext[14+6] = 0 // next header: Hop-by-Hop
	binary.BigEndian.PutUint16(ext[14+4:], binary.BigEndian.Uint16(ext[14+4:])+8)
	add("udp6-hopbyhop", ext, 14, 62, 17, true)
	// Ethernet padding after a short IPv4 datagram: not part of the segment.
	ip4 = gpIPv4(layers.IPProtocolUDP)
	short := gpkt.Serialize(t, gpEth(layers.EthernetTypeIPv4), ip4, gpUDP(ip4, 7, 8), data(2))
	add("udp4-padded", append(short, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee), 14, 34, 17, false)
	return fs
}

func name(s string, n int) string { return fmt.Sprintf("%s/%dB", s, n) }

// pseudoSum is the folded pseudo-header sum, written out from RFC 768/793
// and RFC 8200 with the plain reference sum.
func (f partialFrame) pseudoSum() uint16 {
	l3, n := f.frame[f.l3:], f.segEnd-f.l4
	var b []byte
	if f.v6 {
		b = slices.Concat(l3[8:40], []byte{0, 0, byte(n >> 8), byte(n), 0, 0, 0, f.proto})
	} else {
		b = slices.Concat(l3[12:20], []byte{0, f.proto, byte(n >> 8), byte(n)})
	}
	return gpkt.Sum(b, 0)
}

// partial returns f's frame as a sender with checksum offload hands it
// over: the checksum field holds the pseudo-header sum.
func (f partialFrame) partial() []byte {
	b := slices.Clone(f.frame)
	binary.BigEndian.PutUint16(b[f.csum:], f.pseudoSum())
	return b
}

// valid reports whether frame's transport checksum verifies (gopacket's
// layout, reference sum).
func (f partialFrame) valid(frame []byte) bool {
	return gpkt.Sum(frame[f.l4:f.segEnd], f.pseudoSum()) == 0xffff
}

// runPartial runs frames through Parse and PartialChecksums in one batch.
func runPartial(t *testing.T, s *engine.PartialChecksums, frames [][]byte) []*engine.Packet {
	t.Helper()
	var b engine.Batch
	b.Worker = 3
	pkts := make([]*engine.Packet, len(frames))
	for i, fr := range frames {
		p := new(engine.Packet)
		buf := make([]byte, engine.DefaultHeadroom+len(fr))
		copy(buf[engine.DefaultHeadroom:], fr)
		p.SetBuffer(nil, 0, buf, engine.DefaultHeadroom, len(fr), 0)
		pkts[i] = p
		require.True(t, b.Append(p))
	}
	engine.NewPipeline(engine.Parse{}, s).Process(&b)
	return pkts
}

// TestPartialChecksums: partial frames leave complete, byte for byte the
// frame gopacket builds; complete frames are untouched; a corrupted
// checksum stays wrong; only completed frames are counted.
func TestPartialChecksums(t *testing.T) {
	fs := partialFrames(t)
	s := engine.NewPartialChecksums()
	var frames [][]byte
	for _, f := range fs {
		require.True(t, f.valid(f.frame), "%s: gopacket's frame does not verify", f.name)
		bad := slices.Clone(f.frame)
		bad[f.segEnd-1] ^= 0x40 // a flipped bit in transit
		if f.segEnd-1 == f.csum+1 {
			bad[f.l4] ^= 0x40
		}
		frames = append(frames, f.partial(), slices.Clone(f.frame), bad)
	}
	pkts := runPartial(t, s, frames)
	for i, f := range fs {
		partial, whole, bad := pkts[3*i], pkts[3*i+1], pkts[3*i+2]
		for _, p := range []*engine.Packet{partial, whole, bad} {
			require.Equal(t, engine.VerdictTX, p.Verdict, f.name)
		}
		require.Equal(t, f.frame, partial.Data(), "%s: completed frame differs from gopacket's", f.name)
		require.Equal(t, f.frame, whole.Data(), "%s: complete frame changed", f.name)
		require.Equal(t, frames[3*i+2], bad.Data(), "%s: corrupted frame changed", f.name)
		require.False(t, f.valid(bad.Data()), "%s: corrupted frame was repaired", f.name)
	}
	require.EqualValues(t, len(fs), s.Completed())
}

// TestPartialChecksumsSkips: fragments and other protocols are left alone,
// even when their bytes look partial.
func TestPartialChecksumsSkips(t *testing.T) {
	f := partialFrames(t)[2] // udp4, no payload
	frag := f.partial()
	binary.BigEndian.PutUint16(frag[f.l3+6:], 0x2000) // MF: a first fragment
	// Fix the IPv4 header checksum for the new flags.
	binary.BigEndian.PutUint16(frag[f.l3+10:], 0)
	binary.BigEndian.PutUint16(frag[f.l3+10:], ^gpkt.Sum(frag[f.l3:f.l3+20], 0))
	s := engine.NewPartialChecksums()
	pkts := runPartial(t, s, [][]byte{frag})
	require.Equal(t, frag, pkts[0].Data())
	require.Zero(t, s.Completed())
}

func TestPartialChecksumsNoAllocs(t *testing.T) {
	fs := partialFrames(t)
	s := engine.NewPartialChecksums()
	var b engine.Batch
	for _, f := range fs {
		p := new(engine.Packet)
		fr := f.partial()
		p.SetBuffer(nil, 0, fr, 0, len(fr), 0)
		require.Zero(t, engine.ParsePacket(p, 0))
		b.Append(p)
	}
	s.Process(&b) // first batch of worker 0 makes its counter
	allocs := testing.AllocsPerRun(100, func() { s.Process(&b) })
	require.Zero(t, allocs)
}

// BenchmarkPartialChecksums: the stage's cost per frame on frames from a
// NIC (complete checksums: one pseudo-header sum each) and on partial
// frames from a local sender (one pass over the segment), at 64 and 1500
// bytes, TCP over IPv4. Every sub-benchmark restores the checksum field of
// its 64 frames before each batch; "harness" is that loop with an empty
// stage, to subtract.
func BenchmarkPartialChecksums(b *testing.B) {
	for _, size := range []int{64, 1500} {
		for _, kind := range []string{"harness", "complete", "partial"} {
			b.Run(fmt.Sprintf("size=%d/%s", size, kind), func(b *testing.B) {
				ip := gpIPv4(layers.IPProtocolTCP)
				tcp := gpTCP(ip, 40000, 80)
				tcp.SYN, tcp.ACK = false, true
				frame := gpkt.Serialize(b, gpEth(layers.EthernetTypeIPv4), ip, tcp, make(gopacket.Payload, size-54))
				f := partialFrame{frame: frame, l3: 14, l4: 34, csum: 50, segEnd: len(frame), proto: 6}
				src := frame
				if kind == "partial" {
					src = f.partial()
				}
				var stage engine.Stage = engine.NewPartialChecksums()
				if kind == "harness" {
					stage = engine.StageFunc(func(*engine.Batch) {}) // the loop alone, for subtraction
				}
				var batch engine.Batch
				pkts := make([]engine.Packet, engine.MaxBatch)
				bufs := make([][]byte, engine.MaxBatch)
				for i := range pkts {
					bufs[i] = slices.Clone(src)
					pkts[i].SetBuffer(nil, 0, bufs[i], 0, len(src), 0)
					require.Zero(b, engine.ParsePacket(&pkts[i], 0))
					batch.Append(&pkts[i])
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for n := 0; n < b.N; n += engine.MaxBatch {
					for i := range bufs {
						copy(bufs[i][f.csum:f.csum+2], src[f.csum:f.csum+2])
					}
					stage.Process(&batch)
				}
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/frame")
			})
		}
	}
}
