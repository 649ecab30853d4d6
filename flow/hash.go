package flow

import (
	"encoding/binary"
	"errors"
	"math/bits"
)

// HashVersion names the flow hash algorithm implemented by Hasher. Every Mux
// of a fleet must run the same version with the same seed, or they pick
// different backends for the same flow. A change to the algorithm's output,
// however small, gets a new name; the golden test in hash_test.go pins it.
//
// xdplb-hash-v2 reads the 42-byte canonical form of a Key
//
//	offset size field
//	     0   16 source address (IPv4: 4 bytes then 12 zero bytes)
//	    16   16 destination address (same layout)
//	    32    2 source port, big-endian
//	    34    2 destination port, big-endian
//	    36    4 VNI, big-endian
//	    40    1 IP protocol number
//	    41    1 address family (4 or 6)
//
// as five little-endian 64-bit words w0..w4 (bytes 0..39) and a 16-bit
// tail t (bytes 40..41), and mixes them with eight keys k0..k7 drawn from
// the seed by SplitMix64 (k_i is the i-th output of SplitMix64 started at
// the seed) through mum(a, b), the high 64 bits of the 128-bit product
// a·b XOR its low 64 bits:
//
//	a = mum(w0^k0, w1^k1)    b = mum(w2^k2, w3^k3)    c = mum(w4^k4, t^k5)
//	hash = mum(a^c^k6, b^k7)
//
// Three independent multiplies and a fourth that joins them: a few
// nanoseconds of latency, where the XXH64 of xdplb-hash-v1 (same layout)
// was a chain of a dozen dependent multiplies and the largest single cost
// of the Mux's pipeline. The construction is wyhash's; the keys are secret
// with the seed, so a client cannot aim flows at one backend or steer the
// products to zero.
//
// A TupleMode zeroes the fields it ignores before hashing (Tuple3: both
// ports; Tuple2: both ports and the protocol); the VNI and the family are
// always included, so tenants with overlapping address space hash apart.
//
// The symmetric hash is the same function over the canonical direction of
// the flow: the two (address, port) endpoints are ordered, address bytes
// first (lexicographically) then port, smaller endpoint first, after the
// mode has zeroed what it ignores. So SymmetricHash(k) == Hash(c) where c is
// whichever of k and k.Reverse() has the smaller source endpoint.
const HashVersion = "xdplb-hash-v2"

// TupleMode says which fields of a Key a rule's hash covers.
type TupleMode uint8

const (
	// Tuple5 hashes VNI, protocol, both addresses and both ports.
	Tuple5 TupleMode = iota
	// Tuple3 hashes VNI, protocol and both addresses: all connections
	// between two hosts on one protocol map together.
	Tuple3
	// Tuple2 hashes VNI and both addresses: all traffic between two
	// hosts maps together, whatever the protocol (useful when fragments
	// or ICMP errors must follow their flow).
	Tuple2
)

// String returns the configuration spelling of m ("5-tuple", "3-tuple",
// "2-tuple").
func (m TupleMode) String() string {
	switch m {
	case Tuple5:
		return "5-tuple"
	case Tuple3:
		return "3-tuple"
	case Tuple2:
		return "2-tuple"
	}
	return "TupleMode(" + itoa(uint64(m)) + ")"
}

// IsValid reports whether m is one of the defined modes.
func (m TupleMode) IsValid() bool { return m <= Tuple2 }

// ErrTupleMode is returned by ParseTupleMode for an unknown spelling.
var ErrTupleMode = errors.New(`flow: unknown tuple mode (want "5-tuple", "3-tuple" or "2-tuple")`)

// ParseTupleMode parses the configuration spelling of a TupleMode:
// "5-tuple", "3-tuple" or "2-tuple" (also "5", "3", "2"). The empty string
// means the default, Tuple5.
func ParseTupleMode(s string) (TupleMode, error) {
	switch s {
	case "", "5-tuple", "5":
		return Tuple5, nil
	case "3-tuple", "3":
		return Tuple3, nil
	case "2-tuple", "2":
		return Tuple2, nil
	}
	return Tuple5, ErrTupleMode
}

// MarshalText implements encoding.TextMarshaler.
func (m TupleMode) MarshalText() ([]byte, error) {
	if !m.IsValid() {
		return nil, ErrTupleMode
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler (for YAML/JSON config).
func (m *TupleMode) UnmarshalText(b []byte) error {
	v, err := ParseTupleMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Hasher computes the xdplb-hash-v2 flow hash (see HashVersion) with a
// seed. The seed is configuration and must be identical on every Mux of a
// fleet. A Hasher is a small value (the seed and a pointer to its keys,
// which never change): copy it freely; it is safe for concurrent use and
// its methods do not allocate. The zero Hasher is NewHasher(0).
type Hasher struct {
	seed uint64
	k    *[8]uint64 // nil in the zero Hasher: the keys of seed 0
}

// NewHasher returns a Hasher with the given seed.
func NewHasher(seed uint64) Hasher {
	k := hashKeys(seed)
	return Hasher{seed: seed, k: &k}
}

// hashKeys returns the eight keys of a seed: SplitMix64's first outputs.
func hashKeys(seed uint64) [8]uint64 {
	var k [8]uint64
	x := seed
	for i := range k {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		k[i] = z ^ z>>31
	}
	return k
}

// Seed returns the seed h was made with.
func (h Hasher) Seed() uint64 { return h.seed }

// Hash returns the hash of k over the fields mode selects. It is the
// directional hash: Hash(k) and Hash(k.Reverse()) differ in general. An
// undefined mode hashes like Tuple3 (Rules reject undefined modes).
func (h Hasher) Hash(k *Key, mode TupleMode) uint64 {
	sp, dp, proto := k.SrcPort, k.DstPort, k.Proto
	if mode != Tuple5 {
		sp, dp = 0, 0
		if mode == Tuple2 {
			proto = 0
		}
	}
	return h.sum(&k.Src, &k.Dst, sp, dp, k.VNI, proto, k.Family)
}

// SymmetricHash returns the 5-tuple hash of the canonical direction of k,
// so SymmetricHash(k) == SymmetricHash(k.Reverse()) for every key. Both
// directions of a connection land in the same place (a connection table
// bucket, a worker) without storing the flow twice.
//
// The endpoints are ordered, not combined: XOR-ing or adding the two halves
// would also be symmetric, but maps every flow whose two endpoints are equal
// to one value and makes (a,b) collide with any (c,d) whose halves XOR
// alike, throwing away entropy the hash needs.
func (h Hasher) SymmetricHash(k *Key) uint64 { return h.SymmetricHashMode(k, Tuple5) }

// SymmetricHashMode is SymmetricHash over the fields mode selects. With
// Tuple3 and Tuple2 only the addresses order the endpoints, since the ports
// are not hashed.
func (h Hasher) SymmetricHashMode(k *Key, mode TupleMode) uint64 {
	sp, dp, proto := k.SrcPort, k.DstPort, k.Proto
	if mode != Tuple5 {
		sp, dp = 0, 0
		if mode == Tuple2 {
			proto = 0
		}
	}
	if endpointLess(&k.Dst, dp, &k.Src, sp) {
		return h.sum(&k.Dst, &k.Src, dp, sp, k.VNI, proto, k.Family)
	}
	return h.sum(&k.Src, &k.Dst, sp, dp, k.VNI, proto, k.Family)
}

// endpointLess orders endpoints by address bytes, then port.
func endpointLess(a *[16]byte, ap uint16, b *[16]byte, bp uint16) bool {
	a0, b0 := binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(b[:8])
	if a0 != b0 {
		return a0 < b0
	}
	a1, b1 := binary.BigEndian.Uint64(a[8:]), binary.BigEndian.Uint64(b[8:])
	if a1 != b1 {
		return a1 < b1
	}
	return ap < bp
}

// mum is the multiply-mix of xdplb-hash-v2: the two halves of the 128-bit
// product, XORed.
func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// sum is xdplb-hash-v2 over the 42-byte canonical layout built from its
// arguments, computed without materialising the bytes: w4 is the
// little-endian reading of the big-endian ports and VNI.
func (h Hasher) sum(src, dst *[16]byte, sp, dp uint16, vni uint32, proto, family uint8) uint64 {
	k := h.k
	if k == nil {
		k = &zeroSeedKeys
	}
	le := binary.LittleEndian
	w4 := uint64(bits.ReverseBytes16(sp)) |
		uint64(bits.ReverseBytes16(dp))<<16 |
		uint64(bits.ReverseBytes32(vni))<<32
	a := mum(le.Uint64(src[0:8])^k[0], le.Uint64(src[8:16])^k[1])
	b := mum(le.Uint64(dst[0:8])^k[2], le.Uint64(dst[8:16])^k[3])
	c := mum(w4^k[4], (uint64(proto)|uint64(family)<<8)^k[5])
	return mum(a^c^k[6], b^k[7])
}

// zeroSeedKeys are the keys of seed 0, for the zero Hasher.
var zeroSeedKeys = hashKeys(0)
