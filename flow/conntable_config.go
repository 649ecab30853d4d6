package flow

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// This file holds a ConnTable's configuration and its checks.

// ConnTableConfig is the plain, checkable configuration of a ConnTable.
type ConnTableConfig struct {
	// Capacity is the number of IPv4 flows the table is sized for; fixed at
	// construction. The table allocates at least 1.75 slots per flow (a
	// power of two of buckets, so up to 3.5), so that a table filled to
	// Capacity with hashed keys almost never finds both candidate buckets
	// of a new key full (see ConnTable).
	Capacity int
	// IPv6Capacity is the number of IPv6 flows the separate IPv6 table is
	// sized for; 0 selects Capacity/8 (IPv6 slots are twice as large).
	IPv6Capacity int
	// Timeouts are the idle timeouts per state class.
	Timeouts Timeouts
	// ProveAfter is how long an untrusted flow must have had its entry
	// before a packet can prove it (ConnTable.Next); 0 selects
	// DefaultProveAfter (or half of Timeouts.Untrusted if that is
	// shorter). It must be below Timeouts.Untrusted.
	ProveAfter time.Duration
	// ProvenShare limits the entries of proven classes (established,
	// closing, UDP) to this share of Capacity (of IPv6Capacity in the
	// IPv6 table), in (0, 1]; 0 selects 1. A promotion past the limit is
	// refused (Stats.PromoteRefused) and the flow stays untrusted. The
	// table has 1.75 slots per flow of Capacity, so with the default at
	// least 0.75 × Capacity slots always remain for untrusted entries,
	// which new flows may take: connections that prove themselves, however
	// many, do not shut new flows out. (Room is per key: a new key whose
	// two buckets both hold only live proven entries moves one of them to
	// its other bucket, into a free slot or over an entry an insert may
	// take there (Stats.Moves), and is refused only if none can move,
	// Stats.Refused. With the proven entries at their limit, no key of
	// 200,000 was refused; about one in 30,000 was before moves:
	// TestConnTableMovesOverUntrusted.)
	ProvenShare float64
	// Hasher, when set, is the flow hash the table places keys by:
	// Hasher.Hash(k, Tuple5), mixed once more with a random key of the
	// table's own, so that where a key lands stays secret even to someone
	// who knows the fleet's seed. Give it the fleet's Hasher and a stage
	// that has already hashed a packet's whole key (a 5-tuple rule's
	// Maglev hash) hands that hash to PrepareHashed: the key is hashed
	// once per packet instead of twice. Nil: the table hashes keys with a
	// cheaper keyed mix of its own, and PrepareHashed is Prepare.
	Hasher *Hasher
	// Preallocate puts the whole table in use from the start, at exactly
	// 1.75 slots per flow: the least memory at full load (56 bytes per
	// flow of Capacity, see ConnTable, Memory), with every flow's entry
	// anywhere in it. By default the part of the table in use starts at
	// 32 KiB and grows with the flows stored (ConnTable, Growth), so that
	// a table sized for a million flows that holds a thousand keeps them
	// in a few dozen pages instead of spreading them over the whole
	// allocation; the price is the buckets rounded up to a power of two
	// (up to twice the memory when full) and a few microseconds of
	// splitting every few dozen inserts until the table is fully grown.
	Preallocate bool
	// Seed, if not 0, is the table's placement key instead of a random
	// one: two tables with the same Seed, Hasher and sizes given the same
	// operations place every key alike, and so store, evict and refuse
	// alike (for tests that compare two pipelines, and reproducible
	// benchmarks). Leave it 0 in a node: a sender who knows the key can
	// aim its flows at one bucket pair.
	Seed uint64

	// start, for tests: the buckets of each family a growing table starts
	// with in use (a power of two); 0 selects ctGrowFrom bytes' worth.
	start int
}

// DefaultProveAfter is the default ConnTableConfig.ProveAfter: 200 ms,
// Linux's minimum TCP retransmission timeout. A spoofing sender's packets
// of one flow come in a burst (a SYN, a FIN, an RST, a pair of ACKs, a few
// datagrams) and never prove it; a real connection that lasts longer than
// this sends again (its data, its ACKs, a retransmission, a keep-alive)
// and is promoted. It is short so that a new flow's evictable entry
// survives until its proof under a heavy flood: the table keeps
// promoting real flows while a flood stores fewer than about
// (slots − proven entries) / ProveAfter new flows per second (at
// Capacity 1M with half of it proven, ≈ 6M new flows per second).
const DefaultProveAfter = 200 * time.Millisecond

// ErrConnTableConfig is wrapped by every error NewConnTable returns.
var ErrConnTableConfig = errors.New("flow: invalid ConnTable config")

// maxConnCapacity bounds Capacity so that sizes cannot overflow.
const maxConnCapacity = 1 << 30

// Check reports whether NewConnTable would accept cfg, without
// allocating the table: a node can refuse a bad configuration at once
// and build the table later, when what it is built with (the fleet's
// Hasher) is known.
func (cfg ConnTableConfig) Check() error {
	_, err := cfg.withDefaults()
	return err
}

// withDefaults validates cfg and returns it with its defaults filled in.
func (cfg ConnTableConfig) withDefaults() (ConnTableConfig, error) {
	if cfg.Capacity <= 0 || cfg.Capacity > maxConnCapacity {
		return cfg, fmt.Errorf("%w: Capacity must be in [1, %d], got %d", ErrConnTableConfig, maxConnCapacity, cfg.Capacity)
	}
	if cfg.IPv6Capacity < 0 || cfg.IPv6Capacity > maxConnCapacity {
		return cfg, fmt.Errorf("%w: IPv6Capacity must be in [0, %d], got %d", ErrConnTableConfig, maxConnCapacity, cfg.IPv6Capacity)
	}
	if cfg.IPv6Capacity == 0 {
		cfg.IPv6Capacity = max(cfg.Capacity/8, 1)
	}
	if size := uint64(ctBucketsFor(cfg.Capacity, !cfg.Preallocate))*128 + uint64(ctBucketsFor(cfg.IPv6Capacity, !cfg.Preallocate))*256; size > math.MaxInt/2 {
		return cfg, fmt.Errorf("%w: %d bytes of buckets do not fit this platform's address space", ErrConnTableConfig, size)
	}
	def := DefaultTimeouts()
	to := []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{"Untrusted", &cfg.Timeouts.Untrusted, def.Untrusted},
		{"Established", &cfg.Timeouts.Established, def.Established},
		{"Closing", &cfg.Timeouts.Closing, def.Closing},
		{"UDP", &cfg.Timeouts.UDP, def.UDP},
	}
	for _, f := range to {
		switch {
		case *f.d == 0:
			*f.d = f.def
		case *f.d < time.Millisecond || *f.d > MaxConnTimeout:
			return cfg, fmt.Errorf("%w: Timeouts.%s must be in [1ms, %v] (or 0 for the default), got %v",
				ErrConnTableConfig, f.name, MaxConnTimeout, *f.d)
		}
	}
	switch {
	case cfg.ProveAfter == 0:
		cfg.ProveAfter = min(DefaultProveAfter, cfg.Timeouts.Untrusted/2)
	case cfg.ProveAfter < 0 || cfg.ProveAfter >= cfg.Timeouts.Untrusted:
		return cfg, fmt.Errorf("%w: ProveAfter must be in [0, Timeouts.Untrusted = %v), got %v",
			ErrConnTableConfig, cfg.Timeouts.Untrusted, cfg.ProveAfter)
	}
	if !(cfg.ProvenShare >= 0 && cfg.ProvenShare <= 1) {
		return cfg, fmt.Errorf("%w: ProvenShare must be in (0, 1] (or 0 for 1), got %v", ErrConnTableConfig, cfg.ProvenShare)
	}
	return cfg, nil
}
