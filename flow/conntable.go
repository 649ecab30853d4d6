package flow

import (
	"encoding/binary"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// InsertResult says what Insert did.
type InsertResult uint8

// Insert results.
const (
	// InsertNew: the flow was stored in a free slot, or over an entry of
	// the same key that had expired.
	InsertNew InsertResult = iota
	// InsertUpdated: the flow was present; its backend and class were
	// overwritten and its last-seen refreshed.
	InsertUpdated
	// InsertEvicted: the flow was stored over another flow's entry because
	// both candidate buckets were full: an expired entry if there was one
	// (counted in Stats.Expired), else the least recently seen untrusted
	// entry (counted in Stats.Evictions).
	InsertEvicted
	// InsertRefused: both candidate buckets were full of live entries that
	// are not untrusted; nothing was stored (Stats.Refused).
	InsertRefused
	// InsertBusy: another writer held a candidate bucket for longer than a
	// data-path insert waits (it was descheduled); nothing was stored
	// (Stats.Busy).
	InsertBusy
	// InsertInvalid: the key is not a valid IPv4 or IPv6 flow, its VNI
	// does not fit in 24 bits, or the class is not one of the four;
	// nothing was stored.
	InsertInvalid
	// InsertTaken: ClaimPrepared found the flow present and live; its
	// entry was left as it was.
	InsertTaken
)

// Stored reports whether the flow is in the table after the insert.
func (r InsertResult) Stored() bool { return r <= InsertEvicted }

// String returns the result's name.
func (r InsertResult) String() string {
	switch r {
	case InsertNew:
		return "new"
	case InsertUpdated:
		return "updated"
	case InsertEvicted:
		return "evicted"
	case InsertRefused:
		return "refused"
	case InsertBusy:
		return "busy"
	case InsertInvalid:
		return "invalid"
	case InsertTaken:
		return "taken"
	}
	return "result(" + itoa(uint64(r)) + ")"
}

// ConnTableStats are the table's counters since construction.
type ConnTableStats struct {
	Entries   int    // flows stored, including idle ones Age has not removed yet
	Inserts   uint64 // flows stored by Insert (new, over an expired entry, or by eviction)
	Updates   uint64 // Inserts of a present flow
	Deletes   uint64 // flows removed by Delete
	Evictions uint64 // live untrusted entries replaced by an Insert
	Refused   uint64 // Inserts refused because both buckets were full
	Moves     uint64 // entries moved to their other bucket to make room for an Insert
	Expired   uint64 // idle entries removed by Age or reused by Insert
	Busy      uint64 // Inserts and SetClasses given up on a held bucket
	Contended uint64 // Lookups that gave up on a bucket held by a descheduled writer (a miss)
	// Proven is the number of entries of a proven class (established,
	// closing, UDP), including idle ones; Entries − Proven are untrusted.
	Proven int
	// PromoteRefused counts promotions (SetClass from untrusted to a
	// proven class) refused because the proven entries were at their
	// limit (ConnTableConfig.ProvenShare); the flow stays untrusted.
	PromoteRefused uint64
}

// ctStripes is the number of counter stripes. A writer counts into the
// stripe of the bucket it worked on, so writers on different buckets rarely
// share a counter cache line; readers (Lookup) count nothing on success.
const ctStripes = 64

// connStripe is one cache line of counters.
type connStripe struct {
	inserts, updates, deletes, evictions, refused, expired, busy, contended atomic.Uint64
}

// ConnTable maps flows to backends: the Mux's connection table, which keeps
// an established flow on its backend (DIP) when the VIP's pool changes
// under it (Ananta, Katran). It is safe for concurrent use by any number
// of goroutines; Lookup never locks, never allocates and never waits for a
// writer that is not running.
//
// # Layout
//
// Two arrays of buckets, allocated once at construction, a power of two
// of buckets each: one for IPv4 keys and one for IPv6 keys. A bucket holds a 64-bit header and five
// slots and is cache-line aligned. An IPv4 slot is three words: the key
// packed into two (source and destination address; ports, protocol and the
// 24-bit VNI) and a value word (backend<<32 | last-seen tick), so an IPv4
// bucket is 128 bytes, two cache lines. An IPv6 slot has five key words,
// and its bucket is 256 bytes. The header holds a 32-bit sequence, a 4-bit
// tag per slot (0 for a free slot, else 1..15 from the key's hash) and
// each slot's 2-bit StateClass.
//
// A key hashes (a multiply-mix keyed at random per table, over the fleet's
// flow hash when ConnTableConfig.Hasher is set) to two candidate buckets
// of the part of the array in use; it is stored in whichever held fewer
// entries when it was inserted, and moves only when growth splits its
// bucket. Lookup loads both headers
// first, so that both cache misses overlap, then, in the first bucket and
// if need be the second, compares the key only with the slots whose tag
// matches (found with a few SWAR operations on the header): usually just
// the right one, so a hit reads one or two cache lines. With two choices of
// five slots the fullest bucket stays close to the mean: at 1.75 slots per
// flow of Capacity, filling a table to Capacity with random keys leaves
// both candidate buckets of a new key full for only a few keys per million
// (simulated: about 3 per million at 100% of Capacity, the first near 94%).
//
// # Seqlock protocol
//
// Every shared word is read and written with sync/atomic. A writer claims
// a bucket by CAS of its header from an even sequence s to s+1, writes the
// slots, and publishes the new tags and classes with sequence s+2 in a
// single store. A reader loads the header (again while it is odd),
// compares the slots whose tag matches, loads the value word of a match,
// and loads the header again: if it changed, the read raced a writer and
// is retried. An
// Insert claims both candidate buckets, lower index first, so two inserts
// of the same key cannot both place it and writers cannot deadlock; Delete,
// SetClass and Age claim only the bucket that holds the entry. Data-path
// writers give up after a bounded number of attempts (InsertBusy) and
// readers after a bounded number of retries (a miss, counted in
// Stats.Contended); either only happens when the writer holding the bucket
// was descheduled mid-write.
//
// Lookup refreshes last-seen only when it lags now by more than 1/32 of
// the class's timeout, so a busy flow dirties its cache line a few dozen
// times per timeout rather than per packet, at the price of expiring up to
// 3% early. The refresh is a CAS on the value word, not a store: if a
// writer replaced the slot after the read, the CAS fails rather than
// writing this flow's backend into another flow's entry.
//
// # Growth
//
// The part of each array in use starts at 32 KiB and grows with the
// entries stored, by linear hashing: a bucket index is the key's hash
// modulo m or, for buckets below the split pointer s, modulo 2m; splitting
// bucket s moves the entries of s whose candidate is now s+m there (at most
// five, into a bucket never used before) and advances s, doubling m when s
// reaches it. An insert that finds the table holding fewer than 5 slots
// in use per entry (a look at the counters every 16 inserts of a stripe,
// and whenever an insert finds both its buckets full) splits up to 32
// buckets, one writer at a time, until the array is in use
// (ConnTableConfig.Preallocate starts it so). 5 is about three times a
// full table's 1.75 because linear hashing loads the buckets a round has
// not split yet twice as much as those it has, and because a growing
// table puts a new key in its second bucket only when that holds two
// entries fewer than the first (so that lookups read one bucket more
// often): at 5 slots per entry the fullest buckets have room for both.
// So a table sized for a million flows that holds a thousand keeps them
// in a few dozen pages: on a machine whose memory is mapped in small
// pages its lookups do not pay a page walk each, which a thousand flows
// spread over 45 MiB did.
//
// A split holds both buckets, and publishes the new geometry (one atomic
// word) before it lets them go. A lookup that misses loads the geometry
// again and, if it changed, looks again under the new one: a key moved
// out of a bucket the reader read after the split was published is found
// where it went. A writer checks, holding its buckets, that the geometry
// is still the one it found them by, else it starts again; a split cannot
// run on a bucket a writer holds. A hit needs no second look. A table
// never shrinks: the part in use stays as large as the most entries it
// held.
//
// One writer grows the table at a time; writers that find it behind
// meanwhile leave a request, which the grower serves before it stops (up
// to 128 splits a call). An insert that finds both its buckets full while
// the table is still growing grows it first — 32 buckets more than the
// count asks for, since the ones the count would split next may not be
// its own — or waits, up to 64 yields, for the grower in progress, and
// looks again, up to 8 times. Should the grower be descheduled
// mid-growth, the others go on inserting into the part in use, which then
// fills as a full table does (see Eviction) until it runs again. Range
// holds growth and moves off while it walks: it reports every entry once.
//
// # Eviction
//
// An Insert whose two buckets are full takes, in order: an entry idle past
// its class's timeout (the longest idle first), else the least recently
// seen ClassUntrusted entry, else the slot of an entry it moves to that
// entry's other bucket, into a free slot or over the entry an insert
// there would take (the first of its ten entries that can move;
// Stats.Moves; lookups look again after a move as after a split), else it
// refuses. Established, closing and UDP flows are never
// evicted while live. Nothing loops unboundedly and nothing allocates.
// Age removes idle entries in the background, a bounded number of slots
// per call.
//
// # Memory
//
// 128 bytes per 5 IPv4 slots is 25.6 bytes per slot, 44.8 bytes per flow of
// Capacity at 1.75 slots per flow; the default IPv6 table (Capacity/8
// flows at 51.2 bytes per slot) adds 11.2, so MemoryBytes/Capacity is 56
// bytes with Preallocate, and 56 to 112 for a growing table (whose
// buckets are rounded up to a power of two: 84 at a Capacity of 1M), plus
// 4 KiB of counter stripes. MemoryBytes is what the table reserves; a
// growing table touches only the part in use, about 128 bytes per IPv4
// entry stored (5 slots per entry) until it is fully grown.
type ConnTable struct {
	v4      ctTable[[3]atomic.Uint64, [0]uint64]
	v6      ctTable[[6]atomic.Uint64, [1]uint64]
	seed    [4]uint64
	fleet   *Hasher           // ConnTableConfig.Hasher (copied); nil: the table's own hash
	timeout [ctClasses]uint32 // ticks, indexed by StateClass
	slack   [ctClasses]uint32 // how stale last-seen may get before Lookup refreshes it: timeout/32 (never for untrusted)
	prove   uint32            // ProveAfter in ticks
	cfg     ConnTableConfig
	epoch   time.Time
	stripes []connStripe

	// cursor is Age's next bucket in v4 and in v6. It is written by the
	// ager, so it lives on a cache line of its own, away from the
	// read-only fields above that every Lookup reads.
	_      [ctCacheLine]byte
	cursor [2]atomic.Uint64
	_      [ctCacheLine - 16]byte
}

// NewConnTable validates cfg and allocates the table.
func NewConnTable(cfg ConnTableConfig) (*ConnTable, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &ConnTable{}
	for i, d := range []time.Duration{cfg.Timeouts.Untrusted, cfg.Timeouts.Established, cfg.Timeouts.Closing, cfg.Timeouts.UDP} {
		t.timeout[i] = uint32(Ticks(d))
		t.slack[i] = t.timeout[i] / 32
	}
	t.prove = uint32(Ticks(cfg.ProveAfter))
	// Untrusted entries are never refreshed by a lookup: their last-seen
	// is when they were stored, which Next reads as their age, and their
	// lifetime without proof is the untrusted timeout.
	t.slack[ClassUntrusted] = math.MaxInt32
	t.cfg = cfg
	if cfg.ProvenShare == 0 {
		cfg.ProvenShare = 1
	}
	grow := !cfg.Preallocate
	t.v4.init(ctBucketsFor(cfg.Capacity, grow), cfg.Preallocate, cfg.start, provenLimit(cfg.Capacity, cfg.ProvenShare), 0)
	t.v6.init(ctBucketsFor(cfg.IPv6Capacity, grow), cfg.Preallocate, cfg.start, provenLimit(cfg.IPv6Capacity, cfg.ProvenShare), ctStripes/2)
	t.stripes = ctAligned[connStripe](ctStripes)
	seed := cfg.Seed
	for i := range t.seed {
		if cfg.Seed == 0 {
			t.seed[i] = rand.Uint64() | 1
			continue
		}
		seed += 0x9e3779b97f4a7c15 // golden-ratio steps: distinct, odd words
		t.seed[i] = ctMum(seed, 0xbf58476d1ce4e5b9) | 1
	}
	if cfg.Hasher != nil {
		h := *cfg.Hasher
		t.fleet = &h
	}
	t.epoch = time.Now()
	return t, nil
}

// provenLimit is the most proven entries a table sized for n flows holds.
func provenLimit(n int, share float64) int64 { return max(int64(float64(n)*share), 1) }

// ctBucketsFor returns the buckets for n flows: 1.75 slots per flow, at
// least two so that every key has two distinct candidates, rounded up to
// a power of two for a table that grows (by splitting buckets in two, see
// ConnTable).
func ctBucketsFor(n int, grow bool) int {
	b := max(int((uint64(n)*7+4*ctSlots-1)/(4*ctSlots)), 2)
	if grow {
		b = 1 << bits.Len(uint(b-1))
	}
	return b
}

// Config returns the configuration in force, defaults filled in.
func (t *ConnTable) Config() ConnTableConfig { return t.cfg }

// Now returns the current tick. Call it once per batch, not per packet.
// It reads the monotonic clock alone (time.Since of the table's
// construction): half the cost of time.Now, which reads the wall clock
// too.
func (t *ConnTable) Now() Tick { return Tick(time.Since(t.epoch) / time.Millisecond) }

// TickAt converts a wall-clock reading to a tick of this table. Times
// before the table's construction wrap around.
func (t *ConnTable) TickAt(tm time.Time) Tick { return Tick(tm.Sub(t.epoch) / time.Millisecond) }

// Lookup returns the backend and class of flow k if it is present and not
// idle past its timeout at now, and refreshes its last-seen tick (lazily:
// see ConnTable). It never locks and never allocates.
func (t *ConnTable) Lookup(k *Key, now Tick) (backend uint32, class StateClass, ok bool) {
	var p ctKey
	switch ctFamily(k) {
	case FamilyIPv4:
		return t.v4.lookup(&p, t.pack4(k, &p), now, t)
	case FamilyIPv6:
		return t.v6.lookup(&p, t.pack6(k, &p), now, t)
	}
	return 0, 0, false
}

// ConnQuery is one flow's connection-table operations split in two, so a
// stage can begin the lookups of a whole batch before it finishes any:
// Prepare packs and hashes the key, finds its two buckets and prefetches
// them — issuing the cache misses of every flow of the batch back to
// back, so they overlap (a prefetch instruction on amd64 and arm64, which
// does not wait for its line) — and LookupPrepared, SetClassPrepared and
// InsertPrepared then work from the query without packing or hashing
// again.
//
// A query belongs to the table that prepared it and stays valid while the
// table lives: it holds where the key lives, not what the buckets held,
// so writes between Prepare and its use cost nothing but the cache lines
// they took. The zero ConnQuery is a key the table cannot hold.
type ConnQuery struct {
	p      ctKey
	hash   uint64
	geo    uint64 // the table's geometry i1 and i2 were found under
	i1, i2 uint64 // candidate buckets
	family uint8
}

// Prepare makes q the query of flow k. It never locks, writes or
// allocates.
func (t *ConnTable) Prepare(q *ConnQuery, k *Key) {
	q.family = ctFamily(k)
	switch q.family {
	case FamilyIPv4:
		q.hash = t.pack4(k, &q.p)
		t.v4.prepare(q)
	case FamilyIPv6:
		q.hash = t.pack6(k, &q.p)
		t.v6.prepare(q)
	}
}

// PrepareHashed is Prepare with the key's hash already computed: hash
// must be Hasher().Hash(k, Tuple5), the fleet hash the table was built
// with (ConnTableConfig.Hasher), which a balancing stage has in hand for a
// 5-tuple rule; the table then does not hash k again. A table without a
// Hasher ignores hash and hashes k itself (Prepare), so a query is never
// placed by a hash the table's other methods would not compute.
func (t *ConnTable) PrepareHashed(q *ConnQuery, k *Key, hash uint64) {
	if t.fleet == nil {
		t.Prepare(q, k)
		return
	}
	q.family = ctFamily(k)
	switch q.family {
	case FamilyIPv4:
		t.put4(k, &q.p)
		q.hash = t.spread(hash)
		t.v4.prepare(q)
	case FamilyIPv6:
		t.put6(k, &q.p)
		q.hash = t.spread(hash)
		t.v6.prepare(q)
	}
}

// LookupPrepared is Lookup of the flow q was prepared for.
func (t *ConnTable) LookupPrepared(q *ConnQuery, now Tick) (backend uint32, class StateClass, ok bool) {
	backend, class, _, ok = t.LookupPreparedAge(q, now)
	return backend, class, ok
}

// LookupPreparedAge is LookupPrepared that also returns how long ago the
// entry was last written or refreshed: for an untrusted entry, which
// lookups never refresh, how long ago it was stored. Pass it to Next.
func (t *ConnTable) LookupPreparedAge(q *ConnQuery, now Tick) (backend uint32, class StateClass, age Tick, ok bool) {
	backend, class, age, _, ok = t.lookupPrepared(q, now, true)
	return backend, class, age, ok
}

// PeekPrepared is LookupPrepared without the refresh: it tells whether
// the flow is live without keeping it alive. For a caller that asks about
// flows other than the packet's own — a source NAT probing candidate
// ports for a free one must not extend the lives of the connections it
// finds.
func (t *ConnTable) PeekPrepared(q *ConnQuery, now Tick) (backend uint32, class StateClass, ok bool) {
	backend, class, _, _, ok = t.lookupPrepared(q, now, false)
	return backend, class, ok
}

func (t *ConnTable) lookupPrepared(q *ConnQuery, now Tick, refresh bool) (backend uint32, class StateClass, age Tick, refreshed, ok bool) {
	var seen Tick
	switch q.family {
	case FamilyIPv4:
		backend, class, seen, refreshed, ok = t.v4.lookupFrom(&q.p, q.hash, q.geo, q.i1, q.i2, now, t, refresh)
	case FamilyIPv6:
		backend, class, seen, refreshed, ok = t.v6.lookupFrom(&q.p, q.hash, q.geo, q.i1, q.i2, now, t, refresh)
	}
	if !ok {
		return 0, 0, 0, false, false
	}
	if age = now - seen; int32(age) < 0 {
		age = 0 // written after the caller read its clock
	}
	return backend, class, age, refreshed, true
}

// Next returns the class a flow of class cur moves to when a packet
// suggesting class seen (engine.Packet.StateClass) hits its entry, age
// ticks after the entry was stored (LookupPreparedAge): the trust rule.
//
// Every new flow is stored untrusted, whatever its first packet (SYN, FIN,
// RST, a stray ACK, a datagram): evictable, and with the short untrusted
// lifetime, which lookups do not extend. It earns its long-lived class —
// established for TCP, UDP for the rest — only from a non-SYN packet that
// arrives at least ProveAfter after the entry was stored, something a
// sender of spoofed packets does not do for flows it floods (their
// evictable entries make room for new ones long before), and every live
// connection does. Until then a SYN, FIN or RST leaves it untrusted. A
// proven flow moves as Advance says (closing on FIN or RST, a new SYN after
// closing starts over).
//
// The Mux sees one direction only, so this is the proof it can have; a
// short connection that ends before ProveAfter lives out its life
// untrusted, which costs it nothing while the table has room, and at most
// a re-placement by the same Maglev pick when its entry is evicted. A
// spoofer that keeps state and sends each flow's packets again ProveAfter
// later looks like a client to one-way eyes; what it can hold is bounded by
// ConnTableConfig.ProvenShare, which keeps room for new flows, not by this
// rule.
func (t *ConnTable) Next(cur, seen StateClass, age Tick) StateClass {
	if cur != ClassUntrusted {
		return cur.Advance(seen)
	}
	if seen == ClassUntrusted || seen == ClassClosing || uint32(age) < t.prove {
		return ClassUntrusted
	}
	return seen
}

// ProveAfter returns the ProveAfter in force, in ticks.
func (t *ConnTable) ProveAfter() Tick { return Tick(t.prove) }

// InsertPrepared is Insert of the flow q was prepared for.
func (t *ConnTable) InsertPrepared(q *ConnQuery, backend uint32, class StateClass, now Tick) InsertResult {
	if class >= ctClasses {
		return InsertInvalid
	}
	switch q.family {
	case FamilyIPv4:
		return t.v4.insert(&q.p, q.hash, backend, class, now, t, false)
	case FamilyIPv6:
		return t.v6.insert(&q.p, q.hash, backend, class, now, t, false)
	}
	return InsertInvalid
}

// ClaimPrepared is InsertPrepared that never overwrites a live entry: when
// the flow is present and not idle past its timeout it returns InsertTaken
// and changes nothing. The check and the store happen under the same
// bucket locks, so of several writers claiming one key at once exactly
// one gets it: a key used as a lock (a source NAT's port towards one
// remote endpoint, see nat.SNAT) is handed out once.
func (t *ConnTable) ClaimPrepared(q *ConnQuery, backend uint32, class StateClass, now Tick) InsertResult {
	if class >= ctClasses {
		return InsertInvalid
	}
	switch q.family {
	case FamilyIPv4:
		return t.v4.insert(&q.p, q.hash, backend, class, now, t, true)
	case FamilyIPv6:
		return t.v6.insert(&q.p, q.hash, backend, class, now, t, true)
	}
	return InsertInvalid
}

// SetClassPrepared is SetClass of the flow q was prepared for.
func (t *ConnTable) SetClassPrepared(q *ConnQuery, class StateClass, now Tick) bool {
	if class >= ctClasses {
		return false
	}
	switch q.family {
	case FamilyIPv4:
		return t.v4.setClass(&q.p, q.hash, class, now, t)
	case FamilyIPv6:
		return t.v6.setClass(&q.p, q.hash, class, now, t)
	}
	return false
}

// Insert stores flow k → backend with the given class, last seen at now,
// or overwrites it if present. When both candidate buckets are full it
// reuses an expired entry, else evicts the least recently seen untrusted
// one, else refuses. It never blocks the data path: if another writer holds
// a bucket too long it returns InsertBusy.
func (t *ConnTable) Insert(k *Key, backend uint32, class StateClass, now Tick) InsertResult {
	var p ctKey
	if class >= ctClasses {
		return InsertInvalid
	}
	switch ctFamily(k) {
	case FamilyIPv4:
		return t.v4.insert(&p, t.pack4(k, &p), backend, class, now, t, false)
	case FamilyIPv6:
		return t.v6.insert(&p, t.pack6(k, &p), backend, class, now, t, false)
	}
	return InsertInvalid
}

// SetClass changes the class of flow k and refreshes its last-seen tick.
// It reports false if k is absent or expired, if class is not one of the
// four (or, rarely, if its bucket was held by a descheduled writer;
// Stats.Busy).
func (t *ConnTable) SetClass(k *Key, class StateClass, now Tick) bool {
	var p ctKey
	if class >= ctClasses {
		return false
	}
	switch ctFamily(k) {
	case FamilyIPv4:
		return t.v4.setClass(&p, t.pack4(k, &p), class, now, t)
	case FamilyIPv6:
		return t.v6.setClass(&p, t.pack6(k, &p), class, now, t)
	}
	return false
}

// Delete removes flow k and reports whether it was present (expired or
// not). It may yield the processor while another writer holds the bucket,
// so it is meant for control and maintenance paths.
func (t *ConnTable) Delete(k *Key) bool {
	var p ctKey
	switch ctFamily(k) {
	case FamilyIPv4:
		return t.v4.remove(&p, t.pack4(k, &p), t)
	case FamilyIPv6:
		return t.v6.remove(&p, t.pack6(k, &p), t)
	}
	return false
}

// Age is the incremental ager: it examines the next budget slots (rounded
// up to whole buckets, at most the part of the table in use) and removes
// entries idle past their timeout at now. The budget is shared between the
// IPv4 and the IPv6 table in proportion to their parts in use, each share
// rounded up (so scanned may exceed the budget by a bucket), each swept
// from a cursor of its own, so that one family's growth never holds the
// other's sweep back. Run it from a goroutine with a budget that sweeps the table well
// within the shortest timeout, e.g. Cap()/10 every second. Several agers
// may run at once; each takes its own range of buckets. A bucket a writer
// holds is skipped until the next sweep.
func (t *ConnTable) Age(now Tick, budget int) (scanned, expired int) {
	n4, n6 := ctActive(t.v4.geo.Load()), ctActive(t.v6.geo.Load())
	nb := min(uint64((max(budget, 1)+ctSlots-1)/ctSlots), n4+n6)
	// Each family's share rounded up (so one bucket more than the budget
	// at most): after calls whose budgets add up to the part in use, each
	// family has been swept whole.
	nb4 := min((nb*n4+n4+n6-1)/(n4+n6), n4)
	nb6 := min((nb*n6+n4+n6-1)/(n4+n6), n6)
	expired = t.v4.sweep(&t.cursor[0], n4, nb4, now, t) + t.v6.sweep(&t.cursor[1], n6, nb6, now, t)
	return int(nb4+nb6) * ctSlots, expired
}

// Len returns the number of flows stored (including idle ones not yet
// aged out). Under concurrent writes it is a close estimate.
func (t *ConnTable) Len() int { return t.Stats().Entries }

// Cap returns the number of slots, IPv4 and IPv6: the most flows the table
// can ever hold. It is 1.75 × Capacity and 1.75 × IPv6Capacity, each
// rounded up to whole buckets, and for a growing table (the default) to a
// power of two of them.
func (t *ConnTable) Cap() int { return int(t.v4.n+t.v6.n) * ctSlots }

// InUse returns the number of slots in the part of the table in use: Cap
// once the table is fully grown (see ConnTable, Growth). Age sweeps these.
func (t *ConnTable) InUse() int {
	return int(ctActive(t.v4.geo.Load())+ctActive(t.v6.geo.Load())) * ctSlots
}

// Stats sums the counters. It is for metrics, not the data path.
func (t *ConnTable) Stats() ConnTableStats {
	var s ConnTableStats
	for i := range t.stripes {
		c := &t.stripes[i]
		s.Inserts += c.inserts.Load()
		s.Updates += c.updates.Load()
		s.Deletes += c.deletes.Load()
		s.Evictions += c.evictions.Load()
		s.Refused += c.refused.Load()
		s.Expired += c.expired.Load()
		s.Busy += c.busy.Load()
		s.Contended += c.contended.Load()
	}
	s.PromoteRefused = t.v4.promoteRefused.Load() + t.v6.promoteRefused.Load()
	s.Moves = t.v4.moves.Load() + t.v6.moves.Load()
	s.Proven = max(int(t.v4.proven.Load()+t.v6.proven.Load()), 0)
	s.Entries = max(int(s.Inserts-s.Deletes-s.Expired-s.Evictions), 0)
	return s
}

// MemoryBytes returns the bytes the table allocated for its buckets and
// counters; MemoryBytes()/Len() is its memory per flow.
func (t *ConnTable) MemoryBytes() int {
	return ctBytes(t.v4.b) + ctBytes(t.v6.b) + ctBytes(t.stripes)
}

// Range calls fn for every stored flow, idle ones included, until fn
// returns false. Each bucket is read consistently; the table as a whole is
// not a snapshot. It is for debugging and metrics, not the data path: the
// table does not grow while it runs (a split would move entries from
// buckets it has not read to buckets past those it reads), so inserts
// meanwhile fill the part in use further, and it catches up after.
func (t *ConnTable) Range(fn func(k Key, backend uint32, class StateClass, lastSeen Tick) bool) {
	t.v4.holdGrowth()
	defer t.v4.releaseGrowth()
	t.v6.holdGrowth()
	defer t.v6.releaseGrowth()
	var es [ctSlots]ctEntry
	n4, n6 := ctActive(t.v4.geo.Load()), ctActive(t.v6.geo.Load())
	for i := range n4 {
		for _, e := range es[:t.v4.snapshot(i, &es)] {
			if !fn(ctUnpack4(&e.k), ctBackend(e.v), e.cls, ctSeen(e.v)) {
				return
			}
		}
	}
	for i := range n6 {
		for _, e := range es[:t.v6.snapshot(i, &es)] {
			if !fn(ctUnpack6(&e.k), ctBackend(e.v), e.cls, ctSeen(e.v)) {
				return
			}
		}
	}
}

func ctUnpackPorts(k *Key, w uint64) {
	k.SrcPort = uint16(w)
	k.DstPort = uint16(w >> 16)
	k.Proto = uint8(w >> 32)
	k.VNI = uint32(w >> 40)
}

func ctUnpack4(p *ctKey) Key {
	k := Key{Family: FamilyIPv4}
	binary.LittleEndian.PutUint32(k.Src[:4], uint32(p[0]))
	binary.LittleEndian.PutUint32(k.Dst[:4], uint32(p[0]>>32))
	ctUnpackPorts(&k, p[1])
	return k
}

func ctUnpack6(p *ctKey) Key {
	k := Key{Family: FamilyIPv6}
	binary.LittleEndian.PutUint64(k.Src[:8], p[0])
	binary.LittleEndian.PutUint64(k.Src[8:], p[1])
	binary.LittleEndian.PutUint64(k.Dst[:8], p[2])
	binary.LittleEndian.PutUint64(k.Dst[8:], p[3])
	ctUnpackPorts(&k, p[4])
	return k
}
