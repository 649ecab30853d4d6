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
// xdplb-hash-v1 is XXH64 (the 64-bit xxHash of Yann Collet, as implemented
// by github.com/cespare/xxhash/v2 with NewWithSeed) over the 42-byte
// canonical form of a Key, with the Hasher's seed:
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
// A TupleMode zeroes the fields it ignores before hashing (Tuple3: both
// ports; Tuple2: both ports and the protocol); the VNI and the family are
// always included, so tenants with overlapping address space hash apart.
//
// The symmetric hash is the same function over the canonical direction of
// the flow: the two (address, port) endpoints are ordered, address bytes
// first (lexicographically) then port, smaller endpoint first, after the
// mode has zeroed what it ignores. So SymmetricHash(k) == Hash(c) where c is
// whichever of k and k.Reverse() has the smaller source endpoint.
//
// Hasher computes exactly that function with a fixed-length XXH64 written
// for the 42-byte layout (one 32-byte stripe, one 8-byte lane, two single
// bytes), which runs several times faster than feeding a Digest; a test
// checks it against the cespare/xxhash Digest on random keys.
const HashVersion = "xdplb-hash-v1"

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

// Hasher computes the xdplb-hash-v1 flow hash (see HashVersion) with a
// seed. The seed is configuration and must be identical on every Mux of a
// fleet. A Hasher is a small value: copy it freely; it is safe for
// concurrent use and its methods do not allocate.
type Hasher struct {
	seed uint64
}

// NewHasher returns a Hasher with the given seed.
func NewHasher(seed uint64) Hasher { return Hasher{seed: seed} }

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

// XXH64 primes.
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579
	prime5 uint64 = 2870177450012600261
)

func xxRound(acc, input uint64) uint64 {
	acc += input * prime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * prime1
}

func xxMerge(acc, val uint64) uint64 {
	acc ^= xxRound(0, val)
	return acc*prime1 + prime4
}

// sum is XXH64(seed) over the 42-byte canonical layout built from its
// arguments, computed without materialising the bytes. Lanes are the
// little-endian reading of the layout, as XXH64 specifies.
func (h Hasher) sum(src, dst *[16]byte, sp, dp uint16, vni uint32, proto, family uint8) uint64 {
	le := binary.LittleEndian
	// One 32-byte stripe: the two addresses.
	v1 := xxRound(h.seed+prime1+prime2, le.Uint64(src[0:8]))
	v2 := xxRound(h.seed+prime2, le.Uint64(src[8:16]))
	v3 := xxRound(h.seed, le.Uint64(dst[0:8]))
	v4 := xxRound(h.seed-prime1, le.Uint64(dst[8:16]))
	x := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) +
		bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
	x = xxMerge(x, v1)
	x = xxMerge(x, v2)
	x = xxMerge(x, v3)
	x = xxMerge(x, v4)
	x += keyBytes
	// One 8-byte lane: ports and VNI, each big-endian in the layout.
	lane := uint64(bits.ReverseBytes16(sp)) |
		uint64(bits.ReverseBytes16(dp))<<16 |
		uint64(bits.ReverseBytes32(vni))<<32
	x ^= xxRound(0, lane)
	x = bits.RotateLeft64(x, 27)*prime1 + prime4
	// Two single bytes: protocol and family.
	x ^= uint64(proto) * prime5
	x = bits.RotateLeft64(x, 11) * prime1
	x ^= uint64(family) * prime5
	x = bits.RotateLeft64(x, 11) * prime1
	// Avalanche.
	x ^= x >> 33
	x *= prime2
	x ^= x >> 29
	x *= prime3
	x ^= x >> 32
	return x
}
