package flow

import (
	"encoding/binary"
	"math/bits"
)

// This file holds how ConnTable turns a Key into machine words and a hash:
// its own keyed mix, or the fleet's flow hash (ConnTableConfig.Hasher)
// mixed once more with the table's key.

// mum is a multiply-mix: the two halves of the 128-bit product folded.
func ctMum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// ctPortWord packs ports, protocol and VNI into one key word.
func ctPortWord(k *Key) uint64 {
	return uint64(k.SrcPort) | uint64(k.DstPort)<<16 | uint64(k.Proto)<<32 | uint64(k.VNI)<<40
}

// pack4 packs an IPv4 key into two words (only the first four bytes of
// Src and Dst are used: Key guarantees the rest are zero) and hashes it.
func (t *ConnTable) pack4(k *Key, p *ctKey) uint64 {
	t.put4(k, p)
	if t.fleet != nil {
		return t.spread(t.fleet.Hash(k, Tuple5))
	}
	return t.mix4(p)
}

// mix4 is the table's own hash of a packed IPv4 key.
func (t *ConnTable) mix4(p *ctKey) uint64 {
	return ctMum(ctMum(p[0]^t.seed[0], p[1]^t.seed[1]), t.seed[2])
}

// put4 packs an IPv4 key into two words.
func (t *ConnTable) put4(k *Key, p *ctKey) {
	p[0] = uint64(binary.LittleEndian.Uint32(k.Src[:4])) | uint64(binary.LittleEndian.Uint32(k.Dst[:4]))<<32
	p[1] = ctPortWord(k)
}

// pack6 packs an IPv6 key into five words and hashes it.
func (t *ConnTable) pack6(k *Key, p *ctKey) uint64 {
	t.put6(k, p)
	if t.fleet != nil {
		return t.spread(t.fleet.Hash(k, Tuple5))
	}
	return t.mix6(p)
}

// mix6 is the table's own hash of a packed IPv6 key.
func (t *ConnTable) mix6(p *ctKey) uint64 {
	h := ctMum(p[0]^t.seed[0], p[1]^t.seed[1])
	h = ctMum(h^p[2]^t.seed[2], p[3]^t.seed[3])
	return ctMum(h^p[4], t.seed[0]^t.seed[2])
}

// hashPacked returns the hash of a stored key, as pack4 or pack6 hashed
// it when it was stored: for a split, which finds a stored key's
// candidates under the next geometry. (With the fleet's Hasher that holds
// for keys that keep Key's rule that an IPv4 address's other twelve bytes
// are zero, as every key the parser builds does: the packed key keeps
// only its first four.)
func (t *ConnTable) hashPacked(p *ctKey, v6 bool) uint64 {
	if t.fleet != nil {
		k := ctUnpack4(p)
		if v6 {
			k = ctUnpack6(p)
		}
		return t.spread(t.fleet.Hash(&k, Tuple5))
	}
	if v6 {
		return t.mix6(p)
	}
	return t.mix4(p)
}

// put6 packs an IPv6 key into five words.
func (t *ConnTable) put6(k *Key, p *ctKey) {
	p[0] = binary.LittleEndian.Uint64(k.Src[:8])
	p[1] = binary.LittleEndian.Uint64(k.Src[8:])
	p[2] = binary.LittleEndian.Uint64(k.Dst[:8])
	p[3] = binary.LittleEndian.Uint64(k.Dst[8:])
	p[4] = ctPortWord(k)
}

// spread turns the fleet's hash of a key into the table's: one multiply-mix
// keyed by the table's random seed, so that the buckets a key takes are
// not predictable from the fleet's hash (whose seed is configuration).
func (t *ConnTable) spread(h uint64) uint64 { return ctMum(h^t.seed[0], t.seed[1]) }

// Hasher returns the fleet hash the table places keys by
// (ConnTableConfig.Hasher), or nil when it uses its own.
func (t *ConnTable) Hasher() *Hasher {
	if t.fleet == nil {
		return nil
	}
	h := *t.fleet
	return &h
}

// family classifies a key: 4, 6, or 0 for one the table cannot hold.
func ctFamily(k *Key) uint8 {
	if k.VNI>>24 != 0 {
		return 0
	}
	switch k.Family {
	case FamilyIPv4, FamilyIPv6:
		return k.Family
	}
	return 0
}
