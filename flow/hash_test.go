package flow

import (
	"encoding/binary"
	"math"
	"math/big"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refHash is the definition of xdplb-hash-v2 written the slow, obvious way:
// zero the fields the mode ignores, lay the key out with Key.put, read the
// words and the tail from the bytes, and mix them with keys from a
// SplitMix64 written out here again, with a 128-bit product from math/big.
func refHash(seed uint64, k Key, mode TupleMode) uint64 {
	if mode != Tuple5 {
		k.SrcPort, k.DstPort = 0, 0
		if mode == Tuple2 {
			k.Proto = 0
		}
	}
	var b [keyBytes]byte
	k.put(b[:])
	var keys [8]uint64
	state := seed
	for i := range keys {
		state += 0x9e3779b97f4a7c15
		z := state
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		keys[i] = z ^ (z >> 31)
	}
	word := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	mix := func(x, y uint64) uint64 {
		p := new(big.Int).Mul(new(big.Int).SetUint64(x), new(big.Int).SetUint64(y))
		lo := new(big.Int).And(p, new(big.Int).SetUint64(math.MaxUint64)).Uint64()
		hi := new(big.Int).Rsh(p, 64).Uint64()
		return hi ^ lo
	}
	tail := uint64(binary.LittleEndian.Uint16(b[40:]))
	a := mix(word(0)^keys[0], word(1)^keys[1])
	bb := mix(word(2)^keys[2], word(3)^keys[3])
	c := mix(word(4)^keys[4], tail^keys[5])
	return mix(a^c^keys[6], bb^keys[7])
}

// randKey returns a random key of the given family (4 or 6).
func randKey(r *rand.Rand, family int) Key {
	var src, dst [16]byte
	for i := range src {
		src[i], dst[i] = byte(r.Uint32()), byte(r.Uint32())
	}
	protos := []uint8{ProtoTCP, ProtoUDP, ProtoICMP, ProtoICMPv6}
	var k Key
	vni, proto := r.Uint32()&0xffffff, protos[r.IntN(len(protos))]
	sp, dp := uint16(r.Uint32()), uint16(r.Uint32())
	if family == 4 {
		k.SetIPv4(vni, proto, src[:4], dst[:4], sp, dp)
	} else {
		k.SetIPv6(vni, proto, src[:], dst[:], sp, dp)
	}
	return k
}

var allModes = []TupleMode{Tuple5, Tuple3, Tuple2}

func TestHashMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		seed := r.Uint64()
		if i%4 == 0 {
			seed = 0
		}
		k := randKey(r, 4+2*(i%2))
		for _, m := range allModes {
			h := NewHasher(seed)
			require.Equal(t, refHash(seed, k, m), h.Hash(&k, m), "key %v mode %v seed %#x", k, m, seed)
		}
	}
}

// TestHashGolden pins xdplb-hash-v2. If this test fails the algorithm's
// output changed: every Mux of a fleet would pick differently. Do not update
// the numbers; give the new algorithm a new HashVersion instead.
func TestHashGolden(t *testing.T) {
	require.Equal(t, "xdplb-hash-v2", HashVersion)
	k4 := KeyFrom(100, ProtoTCP, netip.MustParseAddrPort("198.18.0.1:40000"), netip.MustParseAddrPort("198.19.0.10:80"))
	k6 := KeyFrom(0xabcdef, ProtoUDP, netip.MustParseAddrPort("[2001:db8::1]:5353"), netip.MustParseAddrPort("[2001:db8:1::53]:53"))
	tests := []struct {
		name string
		seed uint64
		key  Key
		mode TupleMode
		sym  bool
		want uint64
	}{
		{"v4 5-tuple seed 0", 0, k4, Tuple5, false, 0x3536c6cab869b4ed},
		{"v4 5-tuple", 0x5eed, k4, Tuple5, false, 0x233679e231f3491e},
		{"v4 3-tuple", 0x5eed, k4, Tuple3, false, 0x4e7b7b9ff6dc6e45},
		{"v4 2-tuple", 0x5eed, k4, Tuple2, false, 0x5d0e46958c6eb616},
		{"v4 symmetric", 0x5eed, k4, Tuple5, true, 0x233679e231f3491e},
		{"v6 5-tuple", 0x5eed, k6, Tuple5, false, 0xf4799bc2c26ffcb7},
		{"v6 symmetric", 0x5eed, k6, Tuple5, true, 0xf4799bc2c26ffcb7},
		{"v4 symmetric reversed", 0x5eed, k4.Reverse(), Tuple5, true, 0x233679e231f3491e},
		{"v6 symmetric reversed", 0x5eed, k6.Reverse(), Tuple5, true, 0xf4799bc2c26ffcb7},
		{"zero key", 0, Key{}, Tuple5, false, 0x702df1c5f414f065},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHasher(tt.seed)
			var got uint64
			if tt.sym {
				got = h.SymmetricHashMode(&tt.key, tt.mode)
			} else {
				got = h.Hash(&tt.key, tt.mode)
			}
			assert.Equal(t, tt.want, got, "%#x", got)
		})
	}
}

func TestSymmetricHash(t *testing.T) {
	h := NewHasher(0x1234)
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 20000; i++ {
		k := randKey(r, 4+2*(i%2))
		switch i % 10 {
		case 1: // same address, different ports
			k.Dst = k.Src
		case 2: // same port, different addresses
			k.DstPort = k.SrcPort
		case 3: // addresses differing only in the last byte
			k.Dst = k.Src
			k.Dst[15] ^= 1
			if k.Family == FamilyIPv4 {
				k.Dst[15], k.Dst[3] = 0, k.Dst[3]^1
			}
		}
		rev := k.Reverse()
		require.Equal(t, h.SymmetricHash(&k), h.SymmetricHash(&rev), "key %v", k)
		for _, m := range allModes {
			s := h.SymmetricHashMode(&k, m)
			require.Equal(t, s, h.SymmetricHashMode(&rev, m), "key %v mode %v", k, m)
			// The symmetric hash is the directional hash of one of the
			// two directions (the canonical one).
			require.True(t, s == h.Hash(&k, m) || s == h.Hash(&rev, m), "key %v mode %v", k, m)
		}
	}
}

func TestSymmetricHashCanonicalDirection(t *testing.T) {
	h := NewHasher(7)
	lo := KeyFrom(1, ProtoTCP, netip.MustParseAddrPort("198.18.0.1:5000"), netip.MustParseAddrPort("198.18.0.2:80"))
	hi := lo.Reverse()
	assert.Equal(t, h.Hash(&lo, Tuple5), h.SymmetricHash(&hi), "smaller source endpoint is hashed first")
	assert.Equal(t, h.Hash(&lo, Tuple5), h.SymmetricHash(&lo))
	// Same address: the port orders.
	same := KeyFrom(1, ProtoTCP, netip.MustParseAddrPort("198.18.0.1:9000"), netip.MustParseAddrPort("198.18.0.1:80"))
	rev := same.Reverse()
	assert.Equal(t, h.Hash(&rev, Tuple5), h.SymmetricHash(&same))
	// Symmetric must not collapse distinct flows: (a,b) != (a,c).
	other := KeyFrom(1, ProtoTCP, netip.MustParseAddrPort("198.18.0.1:5000"), netip.MustParseAddrPort("198.18.0.3:80"))
	assert.NotEqual(t, h.SymmetricHash(&lo), h.SymmetricHash(&other))
}

func TestHashModesIgnoreFields(t *testing.T) {
	h := NewHasher(99)
	base := KeyFrom(7, ProtoTCP, netip.MustParseAddrPort("198.18.1.1:1234"), netip.MustParseAddrPort("198.18.2.2:443"))
	mut := func(f func(*Key)) Key { k := base; f(&k); return k }
	var (
		sport  = mut(func(k *Key) { k.SrcPort++ })
		dport  = mut(func(k *Key) { k.DstPort++ })
		proto  = mut(func(k *Key) { k.Proto = ProtoUDP })
		vni    = mut(func(k *Key) { k.VNI++ })
		src    = mut(func(k *Key) { k.Src[3]++ })
		dst    = mut(func(k *Key) { k.Dst[0]++ })
		family = mut(func(k *Key) { k.Family = FamilyIPv6 })
	)
	tests := []struct {
		name    string
		k       Key
		changes map[TupleMode]bool
	}{
		{"src port", sport, map[TupleMode]bool{Tuple5: true, Tuple3: false, Tuple2: false}},
		{"dst port", dport, map[TupleMode]bool{Tuple5: true, Tuple3: false, Tuple2: false}},
		{"proto", proto, map[TupleMode]bool{Tuple5: true, Tuple3: true, Tuple2: false}},
		{"vni", vni, map[TupleMode]bool{Tuple5: true, Tuple3: true, Tuple2: true}},
		{"src addr", src, map[TupleMode]bool{Tuple5: true, Tuple3: true, Tuple2: true}},
		{"dst addr", dst, map[TupleMode]bool{Tuple5: true, Tuple3: true, Tuple2: true}},
		{"family", family, map[TupleMode]bool{Tuple5: true, Tuple3: true, Tuple2: true}},
	}
	for _, tt := range tests {
		for _, m := range allModes {
			t.Run(tt.name+"/"+m.String(), func(t *testing.T) {
				for _, sym := range []bool{false, true} {
					a, b := h.Hash(&base, m), h.Hash(&tt.k, m)
					if sym {
						a, b = h.SymmetricHashMode(&base, m), h.SymmetricHashMode(&tt.k, m)
					}
					assert.Equal(t, tt.changes[m], a != b, "symmetric=%v", sym)
				}
			})
		}
	}
	// Different seeds give different hashes.
	assert.NotEqual(t, NewHasher(1).Hash(&base, Tuple5), NewHasher(2).Hash(&base, Tuple5))
}

// chiSquare returns the chi-square statistic of counts against a uniform
// expectation.
func chiSquare(counts []int, total int) float64 {
	exp := float64(total) / float64(len(counts))
	var x float64
	for _, c := range counts {
		d := float64(c) - exp
		x += d * d / exp
	}
	return x
}

// TestHashDistribution puts keys into 1024 buckets by the low 10 bits and by
// the high 10 bits of the hash (tables index by either) and checks the
// chi-square statistic. With 1023 degrees of freedom the statistic of a
// uniform hash has mean 1023 and standard deviation sqrt(2*1023) ≈ 45; the
// bound is mean + 6 standard deviations (≈ 1294), which a good hash fails
// with probability below 1e-8 and a biased one (a skewed bit, a lost field)
// exceeds by far. Key sets: random v4/v6, and the adversarial realistic case
// of sequential clients (a /16 of sources, sequential source ports) to one
// VIP.
func TestHashDistribution(t *testing.T) {
	const buckets, n = 1024, 1 << 18
	bound := float64(buckets-1) + 6*math.Sqrt(2*float64(buckets-1))
	sets := map[string]func(i int, r *rand.Rand) Key{
		"random v4": func(_ int, r *rand.Rand) Key { return randKey(r, 4) },
		"random v6": func(_ int, r *rand.Rand) Key { return randKey(r, 6) },
		"sequential clients v4": func(i int, _ *rand.Rand) Key {
			var k Key
			src := []byte{198, 18, byte(i >> 10), byte(i >> 2)}
			k.SetIPv4(1, ProtoTCP, src, []byte{198, 19, 0, 1}, uint16(32768+i&3), 443)
			return k
		},
		"sequential ports v6": func(i int, _ *rand.Rand) Key {
			a := netip.MustParseAddr("2001:db8::1").As16()
			b := netip.MustParseAddr("2001:db8:ffff::1").As16()
			a[15] = byte(i >> 16)
			var k Key
			k.SetIPv6(1, ProtoUDP, a[:], b[:], uint16(i), 53)
			return k
		},
	}
	h := NewHasher(0xfeedface)
	for name, gen := range sets {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(5, 6))
			lo, hi, sym := make([]int, buckets), make([]int, buckets), make([]int, buckets)
			for i := 0; i < n; i++ {
				k := gen(i, r)
				x := h.Hash(&k, Tuple5)
				lo[x%buckets]++
				hi[x>>54]++
				sym[h.SymmetricHash(&k)%buckets]++
			}
			assert.Less(t, chiSquare(lo, n), bound, "low bits")
			assert.Less(t, chiSquare(hi, n), bound, "high bits")
			assert.Less(t, chiSquare(sym, n), bound, "symmetric")
		})
	}
}

func TestHashNoAllocs(t *testing.T) {
	h := NewHasher(1)
	k := KeyFrom(1, ProtoTCP, netip.MustParseAddrPort("198.18.0.1:1"), netip.MustParseAddrPort("198.18.0.2:2"))
	var sink uint64
	tests := map[string]func(){
		"Hash":              func() { sink += h.Hash(&k, Tuple5) },
		"SymmetricHash":     func() { sink += h.SymmetricHash(&k) },
		"SymmetricHashMode": func() { sink += h.SymmetricHashMode(&k, Tuple3) },
	}
	for name, f := range tests {
		assert.Zero(t, testing.AllocsPerRun(1000, f), name)
	}
	_ = sink
}

func TestParseTupleMode(t *testing.T) {
	for _, m := range allModes {
		got, err := ParseTupleMode(m.String())
		require.NoError(t, err)
		assert.Equal(t, m, got)
		b, err := m.MarshalText()
		require.NoError(t, err)
		var back TupleMode
		require.NoError(t, back.UnmarshalText(b))
		assert.Equal(t, m, back)
	}
	got, err := ParseTupleMode("")
	require.NoError(t, err)
	assert.Equal(t, Tuple5, got)
	_, err = ParseTupleMode("4-tuple")
	assert.ErrorIs(t, err, ErrTupleMode)
	assert.Equal(t, "TupleMode(9)", TupleMode(9).String())
	_, err = TupleMode(9).MarshalText()
	assert.ErrorIs(t, err, ErrTupleMode)
}

// FuzzSymmetricHash checks, for arbitrary keys, that the symmetric hash
// ignores direction in every mode and that Hash agrees with the reference
// definition.
func FuzzSymmetricHash(f *testing.F) {
	f.Add([]byte{198, 18, 0, 1}, []byte{198, 18, 0, 2}, uint16(1000), uint16(80), uint32(1), uint8(6), uint64(0))
	f.Add([]byte{198, 18, 0, 1}, []byte{198, 18, 0, 1}, uint16(80), uint16(1000), uint32(0), uint8(17), uint64(42))
	a6 := netip.MustParseAddr("2001:db8::1").As16()
	b6 := netip.MustParseAddr("2001:db8::2").As16()
	f.Add(a6[:], b6[:], uint16(1), uint16(1), uint32(0xffffff), uint8(58), uint64(1<<63))
	f.Add(a6[:], a6[:], uint16(7), uint16(7), uint32(5), uint8(6), uint64(3))
	f.Fuzz(func(t *testing.T, src, dst []byte, sp, dp uint16, vni uint32, proto uint8, seed uint64) {
		var k Key
		switch {
		case len(src) >= 16 && len(dst) >= 16:
			k.SetIPv6(vni, proto, src, dst, sp, dp)
		case len(src) >= 4 && len(dst) >= 4:
			k.SetIPv4(vni, proto, src, dst, sp, dp)
		default:
			return
		}
		h := NewHasher(seed)
		rev := k.Reverse()
		for _, m := range allModes {
			if h.SymmetricHashMode(&k, m) != h.SymmetricHashMode(&rev, m) {
				t.Fatalf("asymmetric: %v mode %v", k, m)
			}
			if got, want := h.Hash(&k, m), refHash(seed, k, m); got != want {
				t.Fatalf("Hash(%v, %v) = %#x, reference %#x", k, m, got, want)
			}
		}
	})
}

var hashSink uint64

func benchKeys(n int) []Key {
	r := rand.New(rand.NewPCG(7, 8))
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = randKey(r, 4+2*(i%2))
	}
	return keys
}

func BenchmarkHash(b *testing.B) {
	keys := benchKeys(1024)
	h := NewHasher(1)
	b.Run("Hash", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			hashSink += h.Hash(&keys[i&1023], Tuple5)
		}
	})
	b.Run("SymmetricHash", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			hashSink += h.SymmetricHash(&keys[i&1023])
		}
	})
	// XXH64 of the same layout through a seeded cespare/xxhash Digest:
	// xdplb-hash-v1's function, for comparison.
	b.Run("xxhash.Digest", func(b *testing.B) {
		b.ReportAllocs()
		var d xxhash.Digest
		var buf [keyBytes]byte
		for i := 0; b.Loop(); i++ {
			keys[i&1023].put(buf[:])
			d.ResetWithSeed(1)
			_, _ = d.Write(buf[:])
			hashSink += d.Sum64()
		}
	})
}

// TestHashAvalanche flips each bit of the canonical layout that a key can
// set and requires every output bit to flip with probability near 1/2:
// over n random keys per input bit, each output bit's flip count is
// Binomial(n, 1/2) for an ideal hash, and the bound, 6 standard deviations
// (n/2 ± 3·sqrt(n)), fails for an ideal hash with probability below 1e-7
// per (input, output) pair. A weak mix (an input bit reaching only some
// output bits) misses it by far.
func TestHashAvalanche(t *testing.T) {
	const n = 2000
	dev := 3 * math.Sqrt(n)
	r := rand.New(rand.NewPCG(9, 10))
	h := NewHasher(0xa5a5)
	type flip struct {
		name string
		mut  func(k *Key, bit int)
		bits int
	}
	flips := []flip{
		{"src", func(k *Key, b int) { k.Src[b/8] ^= 1 << (b % 8) }, 128},
		{"dst", func(k *Key, b int) { k.Dst[b/8] ^= 1 << (b % 8) }, 128},
		{"sport", func(k *Key, b int) { k.SrcPort ^= 1 << b }, 16},
		{"dport", func(k *Key, b int) { k.DstPort ^= 1 << b }, 16},
		{"vni", func(k *Key, b int) { k.VNI ^= 1 << b }, 24},
		{"proto", func(k *Key, b int) { k.Proto ^= 1 << b }, 8},
	}
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = randKey(r, 6)
	}
	for _, f := range flips {
		for bit := 0; bit < f.bits; bit++ {
			var count [64]int
			for i := range keys {
				k := keys[i]
				x := h.Hash(&k, Tuple5)
				f.mut(&k, bit)
				d := x ^ h.Hash(&k, Tuple5)
				for o := 0; o < 64; o++ {
					count[o] += int(d >> o & 1)
				}
			}
			for o, c := range count {
				if math.Abs(float64(c)-n/2) > dev {
					t.Fatalf("%s bit %d flips output bit %d in %d of %d keys (want %d ± %.0f)", f.name, bit, o, c, n, n/2, dev)
				}
			}
		}
	}
}

// TestZeroHasher: the zero Hasher is NewHasher(0).
func TestZeroHasher(t *testing.T) {
	var z Hasher
	h := NewHasher(0)
	k := KeyFrom(1, ProtoTCP, netip.MustParseAddrPort("198.18.0.1:1"), netip.MustParseAddrPort("198.18.0.2:2"))
	require.Equal(t, h.Hash(&k, Tuple5), z.Hash(&k, Tuple5))
	require.Equal(t, h.SymmetricHash(&k), z.SymmetricHash(&k))
}
