package flow

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// MaglevVersion names the table construction and lookup implemented by
// NewMaglev and Maglev.Lookup. Two Muxes with the same backends, weights and
// size build identical tables on any machine, so they send a flow to the
// same backend. A change to either output gets a new name; the golden test
// in maglev_test.go pins the table's fingerprint and some lookups.
//
// maglev-v1, after Eisenbud et al., "Maglev: A Fast and Reliable Software
// Network Load Balancer" (NSDI '16), section 3.4, with weights:
//
//  1. The table has M slots, M prime. Backends with Weight 0 take no slot.
//     The others are taken in byte-wise order of Name (so the input order
//     does not matter); Names are unique.
//  2. A backend's permutation is derived from its Name alone:
//     h1 = XXH64(Name, seed 0x6d61676c65762d31), h2 = XXH64(Name, seed
//     0x736b69702d76312e); offset = h1 mod M; skip = h2 mod (M-1) + 1.
//     Its j-th preferred slot is (offset + j·skip) mod M, which visits
//     every slot once because M is prime.
//  3. Population runs in rounds. In each round every backend, in Name
//     order, adds its Weight to a credit; when the credit reaches maxW (the
//     largest Weight), it pays maxW and takes a turn: it claims its next
//     preferred slot that is still empty. The heaviest backends take a turn
//     every round, a backend of weight w about w/maxW of the rounds. This
//     stops as soon as every slot is filled. With equal weights it is
//     exactly the paper's round robin.
//  4. Lookup(hash) reads slot (hash · M) >> 64 (the high 64 bits of the
//     128-bit product: a multiply instead of a division, uniform for a
//     uniform 64-bit hash).
//
// Properties (tested): with equal weights the slot counts of any two
// backends differ by at most one; a backend of weight w gets
// M·w/W ± (1 + N·w/W) slots (W the total weight, N the number of weighted
// backends); removing one backend of N moves only the slots it owned plus a
// small fraction of the others (see TestMaglevDisruption for the bound).
//
// Build cost is O(M log M) probes for equal weights; with very uneven
// weights add O(N · M · maxW / W) credit steps.
const MaglevVersion = "maglev-v1"

// MaglevDefaultSize is the table size used when NewMaglev is given 0: the
// prime the Maglev paper uses, large enough that a backend's share is
// within a fraction of a percent of its weight share for up to a few
// hundred backends (M should be at least 100 times the number of backends).
const MaglevDefaultSize = 65537

// MaglevMaxSize is the largest table size NewMaglev accepts (the largest
// prime below 2^24).
const MaglevMaxSize = 16777213

// MaglevMinAutoSize is the smallest table MaglevAutoSize picks by default
// (the largest prime below 2^12): pools of up to 40 backends get it.
const MaglevMinAutoSize = 4093

// MaglevSlotsPerBackend is the number of slots per backend MaglevAutoSize
// asks for at least: the paper's M ≥ 100·N, which keeps each backend's
// share within about a percent of its weight share and the flows moved by
// a pool change close to the minimum.
const MaglevSlotsPerBackend = 100

// maglevSizes are the table sizes MaglevAutoSize chooses from: the largest
// prime below each power of two from 2^8 to 2^24.
var maglevSizes = [...]uint32{251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521,
	131071, 262139, 524287, 1048573, 2097143, 4194301, 8388593, MaglevMaxSize}

// MaglevAutoSize returns the table size for a pool of n backends when none
// is configured: the smallest of a fixed ladder of primes (the largest
// prime below each power of two, 251 to MaglevMaxSize) that is at least
// min and at least MaglevSlotsPerBackend·n; MaglevMaxSize when none is.
// min 0 means MaglevMinAutoSize.
//
// n must count every backend the configuration lists, whatever its health,
// state or weight: then a health verdict or a drain never changes the size,
// and the table keeps Maglev's minimal disruption. The size changes only
// when the configured pool grows or shrinks across a rung of the ladder (a
// doubling); that change remaps new flows as a fresh table would (flows in a
// connection table stay where they are). Pin the size (Rule.TableSize, the
// document's table_size) where that matters more than memory.
//
// Why not one size for all: a table holds 2 bytes per slot, so MaglevDefaultSize
// for each of 10k VIPs is 1.3 GB and 655M slots to fill; sized by pool, 10k
// VIPs of 10 backends take 80 MB.
func MaglevAutoSize(n int, min uint32) uint32 {
	if min == 0 {
		min = MaglevMinAutoSize
	}
	want := uint64(max(n, 0)) * MaglevSlotsPerBackend
	want = max(want, uint64(min))
	for _, p := range maglevSizes {
		if uint64(p) >= want {
			return p
		}
	}
	return MaglevMaxSize
}

// Seeds of the two name hashes of maglev-v1 ("maglev-1" and "skip-v1.").
const (
	maglevSeedOffset = 0x6d61676c65762d31
	maglevSeedSkip   = 0x736b69702d76312e
)

// Errors returned by NewMaglev, wrapped with detail.
var (
	ErrMaglevSize    = errors.New("flow: invalid maglev table size")
	ErrMaglevBackend = errors.New("flow: invalid maglev backend")
)

// MaglevBackend is one entry of a Maglev table's input.
type MaglevBackend struct {
	// Name is the backend's stable identity, e.g. "10.0.0.1:80". Its
	// permutation depends only on Name, so a backend keeps its slots
	// while others come and go. Must be non-empty and unique.
	Name string
	// Weight is the backend's relative share of the table. 0 keeps the
	// backend out of the table (a graceful drain: new flows go elsewhere
	// while a connection table keeps existing ones).
	Weight uint32
}

// Maglev is a built Maglev lookup table. It is immutable once NewMaglev
// returns and safe for concurrent Lookup from any number of goroutines.
type Maglev struct {
	size  uint64
	t16   []uint16 // slot → caller's backend index, when len(backends) <= 65536
	t32   []uint32 // otherwise
	slots []uint32 // slot count per caller index
	h1    []uint64 // XXH64(Name, offset seed) per caller index (fingerprint)
}

// NewMaglev builds the maglev-v1 table of the given size over backends.
// size must be a prime no larger than MaglevMaxSize and no smaller than
// len(backends); 0 means MaglevDefaultSize. Names must be non-empty and
// unique. backends is only read; Lookup returns indices into it. If no
// backend has a Weight above 0 the table is empty and Lookup returns -1.
func NewMaglev(backends []MaglevBackend, size uint32) (*Maglev, error) {
	if size == 0 {
		size = MaglevDefaultSize
	}
	if size > MaglevMaxSize {
		return nil, fmt.Errorf("%w: %d is larger than %d", ErrMaglevSize, size, MaglevMaxSize)
	}
	if !isPrime32(size) {
		return nil, fmt.Errorf("%w: %d is not prime", ErrMaglevSize, size)
	}
	if len(backends) > int(size) {
		return nil, fmt.Errorf("%w: %d backends do not fit a table of %d slots", ErrMaglevSize, len(backends), size)
	}
	n := len(backends)
	// Name order, independent of the caller's order.
	order := make([]int32, n)
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int { return strings.Compare(backends[a].Name, backends[b].Name) })
	for i, idx := range order {
		name := backends[idx].Name
		if name == "" {
			return nil, fmt.Errorf("%w: backend %d has an empty name", ErrMaglevBackend, idx)
		}
		if i > 0 && backends[order[i-1]].Name == name {
			return nil, fmt.Errorf("%w: duplicate name %q", ErrMaglevBackend, name)
		}
	}

	m := &Maglev{
		size:  uint64(size),
		slots: make([]uint32, n),
		h1:    make([]uint64, n),
	}
	// Per weighted backend state, in Name order.
	type turn struct {
		pos, skip uint32
		weight    uint32
		idx       uint32 // caller's index
		credit    uint64
	}
	turns := make([]turn, 0, n)
	var maxW uint32
	for _, idx := range order {
		b := &backends[idx]
		m.h1[idx] = nameHash(b.Name, maglevSeedOffset)
		if b.Weight == 0 {
			continue
		}
		h2 := nameHash(b.Name, maglevSeedSkip)
		turns = append(turns, turn{
			pos:    uint32(m.h1[idx] % uint64(size)),
			skip:   uint32(h2%uint64(size-1)) + 1,
			weight: b.Weight,
			idx:    uint32(idx),
		})
		maxW = max(maxW, b.Weight)
	}
	if len(turns) == 0 {
		return m, nil
	}

	if n <= 1<<16 {
		m.t16 = make([]uint16, size)
	} else {
		m.t32 = make([]uint32, size)
	}
	filled := make([]uint64, (size+63)/64)
	mw := uint64(maxW)
	for left := size; ; {
		for j := range turns {
			t := &turns[j]
			t.credit += uint64(t.weight)
			if t.credit < mw {
				continue
			}
			t.credit -= mw
			p := t.pos
			for filled[p>>6]&(1<<(p&63)) != 0 {
				if p += t.skip; p >= size {
					p -= size
				}
			}
			filled[p>>6] |= 1 << (p & 63)
			if m.t16 != nil {
				m.t16[p] = uint16(t.idx)
			} else {
				m.t32[p] = t.idx
			}
			m.slots[t.idx]++
			if left--; left == 0 {
				return m, nil
			}
			if p += t.skip; p >= size {
				p -= size
			}
			t.pos = p
		}
	}
}

// isPrime32 reports whether n is prime: Miller–Rabin with the bases 2, 7
// and 61, which is exact for every n below 4759123141 (Jaeschke, 1993).
// (math/big's ProbablyPrime seeds a random source on every call, which
// was a tenth of building 10k small tables.)
func isPrime32(n uint32) bool {
	if n < 2 {
		return false
	}
	for _, p := range [...]uint32{2, 3, 5, 7, 61} {
		if n%p == 0 {
			return n == p
		}
	}
	d, r := uint64(n-1), 0
	for d%2 == 0 {
		d /= 2
		r++
	}
	m := uint64(n)
	for _, a := range [...]uint64{2, 7, 61} {
		x := powMod(a, d, m)
		if x == 1 || x == m-1 {
			continue
		}
		composite := true
		for i := 1; i < r; i++ {
			if x = x * x % m; x == m-1 {
				composite = false
				break
			}
		}
		if composite {
			return false
		}
	}
	return true
}

// powMod returns b^e mod m for m < 2^32 (products fit 64 bits).
func powMod(b, e, m uint64) uint64 {
	x := uint64(1)
	for b %= m; e > 0; e >>= 1 {
		if e&1 != 0 {
			x = x * b % m
		}
		b = b * b % m
	}
	return x
}

// nameHash is XXH64(name) with a seed.
func nameHash(name string, seed uint64) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	_, _ = d.WriteString(name)
	return d.Sum64()
}

// Lookup returns the index, in the slice given to NewMaglev, of the backend
// that owns hash's slot, or -1 if no backend has a Weight above 0. It does
// not allocate.
func (m *Maglev) Lookup(hash uint64) int {
	s, _ := bits.Mul64(hash, m.size)
	if m.t16 != nil {
		return int(m.t16[s])
	}
	if m.t32 != nil {
		return int(m.t32[s])
	}
	return -1
}

// Size returns the number of slots M.
func (m *Maglev) Size() int { return int(m.size) }

// Len returns the number of backends given to NewMaglev (weighted or not).
func (m *Maglev) Len() int { return len(m.slots) }

// Slots returns how many slots backend i (an index into the slice given to
// NewMaglev) owns; 0 for a backend of Weight 0.
func (m *Maglev) Slots(i int) int { return int(m.slots[i]) }

// Empty reports whether no backend owns a slot (Lookup always returns -1).
func (m *Maglev) Empty() bool { return m.t16 == nil && m.t32 == nil }

// Version returns MaglevVersion.
func (m *Maglev) Version() string { return MaglevVersion }

// Owner returns the backend index that owns slot s (0 <= s < Size()), or
// -1 for an empty table. For tests and diagnostics.
func (m *Maglev) Owner(s int) int {
	if m.t16 != nil {
		return int(m.t16[s])
	}
	if m.t32 != nil {
		return int(m.t32[s])
	}
	return -1
}

// Fingerprint identifies the table's content independently of the order in
// which backends were given: XXH64 (seed 0) over, for each slot in order,
// the big-endian 8 bytes of XXH64(owner's Name, maglevSeedOffset); the
// empty table hashes no bytes. Two nodes that report the same fingerprint
// and version send every hash to the same backend Name. It costs a pass
// over the table: for reports, not the data path.
func (m *Maglev) Fingerprint() uint64 {
	d := xxhash.New()
	if m.Empty() {
		return d.Sum64()
	}
	var buf [8 * 512]byte
	for s := 0; s < int(m.size); {
		b := buf[:0]
		for ; s < int(m.size) && len(b) < len(buf); s++ {
			b = binary.BigEndian.AppendUint64(b, m.h1[m.Owner(s)])
		}
		_, _ = d.Write(b)
	}
	return d.Sum64()
}
