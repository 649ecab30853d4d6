package header

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// partialCase is an IP packet built by gopacket with a complete checksum,
// and where its transport segment and checksum field are.
type partialCase struct {
	name     string
	pkt      []byte // the whole IP packet, complete checksum (gopacket's)
	proto    uint8
	src, dst []byte
	l4, off  int // segment start in pkt, checksum offset in the segment
}

func partialCases(t *testing.T) []partialCase {
	t.Helper()
	var cs []partialCase
	for _, n := range []int{0, 1, 7, 64, 1400, 1441} {
		for _, fam := range []int{4, 6} {
			for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
				var ip gopacket.SerializableLayer
				var src, dst net.IP
				l4 := 20
				if fam == 4 {
					src, dst = v4A, v4B
					ip = &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: src, DstIP: dst}
				} else {
					src, dst, l4 = v6A, v6B, 40
					ip = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: src, DstIP: dst}
				}
				var tl gopacket.SerializableLayer
				off := 6
				if proto == layers.IPProtocolTCP {
					tl, off = &layers.TCP{SrcPort: 40000, DstPort: 80, Seq: 7, Ack: 9, ACK: true, PSH: true, Window: 512}, 16
				} else {
					tl = &layers.UDP{SrcPort: 40000, DstPort: 53}
				}
				pkt := gpkt.Serialize(t, ip, tl, payload(n))
				cs = append(cs, partialCase{name: fmt.Sprintf("ipv%d/%v/%dB", fam, proto, n), pkt: pkt, proto: uint8(proto),
					src: src.To16()[16-len(addrBytes(fam)):], dst: dst.To16()[16-len(addrBytes(fam)):], l4: l4, off: off})
			}
		}
	}
	return cs
}

func addrBytes(fam int) []byte {
	if fam == 4 {
		return make([]byte, 4)
	}
	return make([]byte, 16)
}

// refPseudo is the pseudo-header sum written out from the RFCs with the
// plain reference sum: addresses, zero, protocol, upper-layer length.
func refPseudo(proto uint8, src, dst []byte, n int) uint16 {
	b := append(append([]byte{}, src...), dst...)
	if len(src) == 4 {
		b = append(b, 0, proto, byte(n>>8), byte(n))
	} else {
		b = append(b, 0, 0, byte(n>>8), byte(n), 0, 0, 0, proto)
	}
	return gpkt.Sum(b, 0)
}

// verifies reports whether the segment's checksum is right, by the plain
// reference sum.
func verifies(c partialCase, pkt []byte) bool {
	seg := pkt[c.l4:]
	return gpkt.Sum(seg, refPseudo(c.proto, c.src, c.dst, len(seg))) == 0xffff
}

func TestCompletePartialChecksum(t *testing.T) {
	for _, c := range partialCases(t) {
		t.Run(c.name, func(t *testing.T) {
			require := func(ok bool, format string, args ...any) {
				t.Helper()
				if !ok {
					t.Fatalf(format, args...)
				}
			}
			require(verifies(c, c.pkt), "gopacket's packet does not verify")
			seg := func(p []byte) []byte { return p[c.l4:] }

			// Partial, as a sender with checksum offload leaves it: the
			// field holds the folded pseudo-header sum.
			partial := bytes.Clone(c.pkt)
			binary.BigEndian.PutUint16(seg(partial)[c.off:], refPseudo(c.proto, c.src, c.dst, len(seg(partial))))
			got := CompletePartialChecksum(c.proto, c.src, c.dst, seg(partial))
			require(got == PartialCompleted, "partial: got %d, want PartialCompleted", got)
			require(bytes.Equal(partial, c.pkt), "partial: completed packet differs from gopacket's:\n got %x\nwant %x", partial, c.pkt)

			// Complete and right: untouched.
			whole := bytes.Clone(c.pkt)
			got = CompletePartialChecksum(c.proto, c.src, c.dst, seg(whole))
			require(got == NotPartial, "complete: got %d, want NotPartial", got)
			require(bytes.Equal(whole, c.pkt), "complete: packet changed")

			// Complete but corrupted (a payload or header bit flipped in
			// transit): not repaired, stays wrong.
			bad := bytes.Clone(c.pkt)
			seg(bad)[len(seg(bad))-1] ^= 0x10
			if len(seg(bad)) == c.off+2 {
				seg(bad)[0] ^= 0x10
			}
			before := bytes.Clone(bad)
			got = CompletePartialChecksum(c.proto, c.src, c.dst, seg(bad))
			require(got == NotPartial, "corrupted: got %d, want NotPartial", got)
			require(bytes.Equal(bad, before) && !verifies(c, bad), "corrupted: changed, or made valid")

			// A wrong checksum field that is not the pseudo-header sum.
			badField := bytes.Clone(c.pkt)
			binary.BigEndian.PutUint16(seg(badField)[c.off:], refPseudo(c.proto, c.src, c.dst, len(seg(badField)))^0x0100)
			before = bytes.Clone(badField)
			got = CompletePartialChecksum(c.proto, c.src, c.dst, seg(badField))
			require(got == NotPartial && bytes.Equal(badField, before), "wrong field: got %d or changed", got)
		})
	}
}

// TestCompletePartialChecksumAlreadyValid: a complete checksum that happens
// to equal the pseudo-header sum is left alone.
func TestCompletePartialChecksumAlreadyValid(t *testing.T) {
	for _, c := range partialCases(t) {
		seg := c.pkt[c.l4:]
		if len(seg)-c.off < 4 || (len(seg)-c.off)%2 != 0 {
			continue // needs an aligned payload word to tune
		}
		t.Run(c.name, func(t *testing.T) {
			p := bytes.Clone(c.pkt)
			s := p[c.l4:]
			pseudo := refPseudo(c.proto, c.src, c.dst, len(s))
			binary.BigEndian.PutUint16(s[c.off:], pseudo)
			// Tune the last payload word so that pseudo is also the right
			// complete checksum: pseudo + sum(s) must be 0xFFFF.
			w := len(s) - 2
			binary.BigEndian.PutUint16(s[w:], 0)
			binary.BigEndian.PutUint16(s[w:], ^gpkt.Sum(s, pseudo))
			if !verifies(c, p) {
				t.Fatal("could not build a segment whose checksum equals the pseudo-header sum")
			}
			before := bytes.Clone(p)
			if got := CompletePartialChecksum(c.proto, c.src, c.dst, s); got != PartialValid {
				t.Fatalf("got %d, want PartialValid", got)
			}
			if !bytes.Equal(p, before) {
				t.Fatal("a valid segment was changed")
			}
		})
	}
}

func TestCompletePartialChecksumUnsupported(t *testing.T) {
	src, dst := []byte{198, 18, 0, 1}, []byte{198, 18, 0, 2}
	for _, tc := range []struct {
		name  string
		proto uint8
		seg   []byte
	}{
		{"icmp", 1, make([]byte, 40)},
		{"short tcp", 6, make([]byte, 19)},
		{"short udp", 17, make([]byte, 7)},
		{"jumbo", 17, make([]byte, 0x10000)},
	} {
		if got := CompletePartialChecksum(tc.proto, src, dst, tc.seg); got != PartialUnsupported {
			t.Errorf("%s: got %d, want PartialUnsupported", tc.name, got)
		}
	}
}

// FuzzCompletePartialChecksum: whatever the bytes, a completed segment
// verifies and differs from the input only in the checksum field; any
// other outcome changes nothing.
func FuzzCompletePartialChecksum(f *testing.F) {
	f.Add(uint8(6), false, []byte("0123456789abcdefghijklmnop"), true)
	f.Add(uint8(17), true, []byte("01234567"), true)
	f.Add(uint8(17), false, []byte("0123456789"), false)
	f.Fuzz(func(t *testing.T, proto uint8, v6 bool, seg []byte, makePartial bool) {
		src, dst := []byte{198, 18, 0, 1}, []byte{198, 19, 0, 2}
		if v6 {
			src, dst = net.ParseIP("2001:db8::1").To16(), net.ParseIP("2001:db8::2").To16()
		}
		off := map[uint8]int{6: 16, 17: 6}[proto]
		if makePartial && off != 0 && len(seg) >= off+2 && len(seg) <= 0xffff {
			binary.BigEndian.PutUint16(seg[off:], refPseudo(proto, src, dst, len(seg)))
		}
		before := bytes.Clone(seg)
		got := CompletePartialChecksum(proto, src, dst, seg)
		if got != PartialCompleted {
			if !bytes.Equal(seg, before) {
				t.Fatalf("outcome %d changed the segment", got)
			}
			return
		}
		if gpkt.Sum(seg, refPseudo(proto, src, dst, len(seg))) != 0xffff {
			t.Fatal("completed segment does not verify")
		}
		if !bytes.Equal(seg[:off], before[:off]) || !bytes.Equal(seg[off+2:], before[off+2:]) {
			t.Fatal("bytes outside the checksum field changed")
		}
	})
}
