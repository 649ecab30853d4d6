package engine

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// commonFrames are well-formed frames of the shapes parseCommon takes:
// untagged IPv4 without options and IPv6 without extension headers,
// carrying TCP (with options) or UDP, some with Ethernet padding.
func commonFrames() [][]byte {
	var out [][]byte
	for _, v6 := range []bool{false, true} {
		for _, proto := range []uint8{flow.ProtoTCP, flow.ProtoUDP} {
			for _, pad := range []int{0, 6} {
				out = append(out, commonFrame(v6, proto, 10, pad))
			}
		}
	}
	return out
}

// commonFrame builds one with gopacket: payload bytes of data after the
// transport header (TCP with 4 bytes of options), pad bytes of Ethernet
// padding.
func commonFrame(v6 bool, proto uint8, payload, pad int) []byte {
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1},
		EthernetType: layers.EthernetTypeIPv4}
	var nl gopacket.SerializableLayer
	if v6 {
		eth.EthernetType = layers.EthernetTypeIPv6
		nl = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocol(proto),
			SrcIP: net.ParseIP("2001:db8::1"), DstIP: net.ParseIP("2001:db8::2")}
	} else {
		nl = &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocol(proto),
			SrcIP: net.IP{198, 18, 0, 1}, DstIP: net.IP{198, 19, 0, 2}}
	}
	var l4 gopacket.SerializableLayer = &layers.UDP{SrcPort: 40000, DstPort: 443}
	if proto == flow.ProtoTCP {
		l4 = &layers.TCP{SrcPort: 40000, DstPort: 443, ACK: true, Window: 512,
			Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop}, {OptionType: layers.TCPOptionKindNop},
				{OptionType: layers.TCPOptionKindNop}, {OptionType: layers.TCPOptionKindNop}}}
	}
	f := gpkt.MustSerialize(eth, nl, l4, gopacket.Payload(make([]byte, payload)))
	return append(f, make([]byte, pad)...)
}

// checkCommonAgrees checks that whenever parseCommon takes frame, the
// general parser accepts it too and fills every field alike.
func checkCommonAgrees(t *testing.T, frame []byte) bool {
	t.Helper()
	var a, b Packet
	a.SetBuffer(nil, 0, frame, 0, len(frame), 0)
	b.SetBuffer(nil, 0, frame, 0, len(frame), 0)
	a.Flags, b.Flags = 0xffff, 0xffff // what a reused packet may hold
	a.TCPFlags, b.TCPFlags = 0xff, 0xff
	if !parseCommon(&a, a.Data(), 5) {
		return false
	}
	if r := parseGeneral(&b, b.Data(), 5); r != 0 {
		t.Fatalf("parseCommon took a frame the general parser drops (%v): % x", r, frame)
	}
	if a.Flags != b.Flags || a.EtherType != b.EtherType || a.L3Off != b.L3Off || a.L4Off != b.L4Off ||
		a.L4Proto != b.L4Proto || a.TCPFlags != b.TCPFlags || a.Key != b.Key {
		t.Fatalf("parseCommon and the general parser differ on % x:\n%+v\n%+v", frame, a, b)
	}
	return true
}

// TestParseCommonAgrees runs parseCommon against the general parser on
// the frames it is for and on every one-byte change and every truncation
// of them: where it takes a frame, the general parser must accept it and
// fill every field alike; it must take the well-formed ones (else it is
// no fast path); and it must leave the rest to the general parser.
func TestParseCommonAgrees(t *testing.T) {
	for _, f := range commonFrames() {
		if !checkCommonAgrees(t, f) {
			t.Fatalf("parseCommon does not take a common frame: % x", f)
		}
		for n := range len(f) {
			checkCommonAgrees(t, f[:n])
		}
		// Every value of the length fields up to past the frame: IPv4
		// total length, IPv6 payload length, UDP length (TCP's data
		// offset is one byte, changed below).
		for _, at := range []int{16, 18, 34 + 4, 54 + 4} {
			for v := range len(f) + 8 {
				if at+2 > len(f) {
					break
				}
				g := append([]byte(nil), f...)
				binary.BigEndian.PutUint16(g[at:], uint16(v))
				checkCommonAgrees(t, g)
			}
		}
		for i := range f {
			for _, x := range []byte{0x01, 0x08, 0x10, 0x40, 0x80, 0xff} {
				g := append([]byte(nil), f...)
				g[i] ^= x
				checkCommonAgrees(t, g)
			}
		}
	}
}

// FuzzParseCommon is TestParseCommonAgrees's check for any frame.
func FuzzParseCommon(f *testing.F) {
	for _, fr := range commonFrames() {
		f.Add(fr)
	}
	f.Fuzz(func(t *testing.T, frame []byte) { checkCommonAgrees(t, frame) })
}

// BenchmarkParse parses the common frames (commonFrames, in turn) with
// ParsePacket, which takes them in parseCommon, and with the general
// parser alone, which parsed them before parseCommon: ns/op is per
// frame, the packet reused as a worker reuses its packets.
//
//	go test ./engine -run '^$' -bench Parse -cpu 1
func BenchmarkParse(b *testing.B) {
	frames := commonFrames()
	for _, path := range []struct {
		name  string
		parse func(p *Packet, data []byte) DropReason
	}{
		{"ParsePacket", func(p *Packet, _ []byte) DropReason { return ParsePacket(p, 5) }},
		{"general", func(p *Packet, data []byte) DropReason { return parseGeneral(p, data, 5) }},
	} {
		b.Run("path="+path.name, func(b *testing.B) {
			pkts := make([]Packet, len(frames))
			for i, f := range frames {
				pkts[i].SetBuffer(nil, 0, f, 0, len(f), 0)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				p := &pkts[i]
				if path.parse(p, p.Data()) != 0 {
					b.Fatal("drop")
				}
				if i++; i == len(pkts) {
					i = 0
				}
			}
		})
	}
}
