package header

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

func TestChecksumKnownValues(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
		init uint16
		want uint16
	}{
		{"empty", nil, 0, 0},
		{"empty keeps initial", nil, 0x1234, 0x1234},
		{"one byte is high byte", []byte{0xab}, 0, 0xab00},
		{"two bytes", []byte{0x12, 0x34}, 0, 0x1234},
		{"carry folds", []byte{0xff, 0xff, 0x00, 0x01}, 0, 0x0001},
		// RFC 1071 section 3 example: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
		{"rfc1071 example", []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}, 0, 0xddf2},
		{"all ones stays -0", []byte{0xff, 0xff, 0xff, 0xff}, 0, 0xffff},
		{"initial carries", []byte{0xff, 0xff}, 0x0001, 0x0001},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			equal(t, tt.want, Checksum(tt.b, tt.init))
			equal(t, tt.want, gpkt.Sum(tt.b, tt.init))
		})
	}
}

// TestChecksumRandomAlignments compares the optimised sum with the
// reference over thousands of random buffers of random lengths, each placed
// at every alignment offset 0..7 of a larger allocation.
func TestChecksumRandomAlignments(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	backing := make([]byte, 4096+8)
	for i := 0; i < 3000; i++ {
		n := rng.IntN(2000)
		if i%4 == 0 {
			n = rng.IntN(80) // many short buffers: all tail paths
		}
		initial := uint16(rng.Uint32())
		for align := 0; align < 8; align++ {
			b := backing[align : align+n]
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			if i%10 == 0 { // long runs of 0xff stress the carries
				for j := range b {
					b[j] = 0xff
				}
			}
			got, want := Checksum(b, initial), gpkt.Sum(b, initial)
			if got != want {
				t.Fatalf("len %d align %d initial %#x: Checksum=%#04x reference=%#04x", n, align, initial, got, want)
			}
		}
	}
}

func TestChecksumComposes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	b := make([]byte, 1500)
	for j := range b {
		b[j] = byte(rng.Uint32())
	}
	whole := Checksum(b, 0)
	for split := 0; split <= len(b); split += 2 {
		equal(t, whole, Checksum(b[split:], Checksum(b[:split], 0)), "split %d", split)
	}
	// Combine agrees with summing the parts separately.
	for split := 0; split <= len(b); split += 14 {
		equal(t, whole, ChecksumCombine(Checksum(b[:split], 0), Checksum(b[split:], 0)), "combine split %d", split)
	}
}

// TestChecksumUpdateMatchesRecomputation changes random aligned words and
// runs of random buffers and checks that the incremental update of the
// stored checksum equals a full recomputation.
func TestChecksumUpdateMatchesRecomputation(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	store := func(b []byte) uint16 { return ^Checksum(b, 0) }
	for i := 0; i < 20000; i++ {
		n := 2 * (2 + rng.IntN(40))
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if i%7 == 0 { // sums near -0
			for j := range b {
				b[j] = 0xff
			}
			b[rng.IntN(n)] = byte(rng.Uint32())
		}
		check := store(b)

		// One 16-bit word.
		w := 2 * rng.IntN(n/2)
		old := binary.BigEndian.Uint16(b[w:])
		nw := uint16(rng.Uint32())
		switch i % 5 {
		case 0:
			nw = old
		case 1:
			nw = 0
		case 2:
			nw = 0xffff
		}
		binary.BigEndian.PutUint16(b[w:], nw)
		if allZero(b) {
			continue
		}
		got := ChecksumUpdate16(check, old, nw)
		want := store(b)
		if got != want {
			t.Fatalf("word: data %x word@%d %#x->%#x: update %#04x full %#04x", b, w, old, nw, got, want)
		}

		// A run of words (an address), 4 or 16 bytes.
		size := 4
		if i%2 == 1 && n >= 16 {
			size = 16
		}
		at := 2 * rng.IntN((n-size)/2+1)
		oldRun := append([]byte(nil), b[at:at+size]...)
		newRun := make([]byte, size)
		for j := range newRun {
			newRun[j] = byte(rng.Uint32())
		}
		check = store(b)
		copy(b[at:], newRun)
		if allZero(b) {
			continue
		}
		got = ChecksumUpdate(check, oldRun, newRun)
		want = store(b)
		if got != want {
			t.Fatalf("run: data %x run@%d: update %#04x full %#04x", b, at, got, want)
		}
	}
}

func allZero(b []byte) bool {
	for _, v := range b {
		if v != 0 {
			return false
		}
	}
	return true
}

func TestPseudoHeaderChecksum(t *testing.T) {
	src4, dst4 := []byte{198, 18, 0, 1}, []byte{198, 18, 0, 2}
	// Reference: lay out the RFC 768 pseudo-header and sum it.
	ph := append(append(append([]byte{}, src4...), dst4...), 0, ProtoUDP, 0x01, 0x23)
	equal(t, gpkt.Sum(ph, 0), PseudoHeaderChecksum(ProtoUDP, src4, dst4, 0x0123))

	src6 := []byte{0x20, 0x01, 0x0d, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	dst6 := []byte{0x20, 0x01, 0x0d, 0xb8, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa, 0xf9, 0xf8, 0xf7, 0xf6, 0xf5, 0xf4}
	// RFC 8200 section 8.1: 32-bit length, 3 zero bytes, next header.
	ph6 := append(append(append([]byte{}, src6...), dst6...), 0, 0, 0x05, 0xdc, 0, 0, 0, ProtoTCP)
	equal(t, gpkt.Sum(ph6, 0), PseudoHeaderChecksum(ProtoTCP, src6, dst6, 1500))
}
