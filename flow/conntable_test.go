package flow

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ctKey4 returns a distinct IPv4 TCP key for each id.
func ctKey4(id uint32) Key {
	var k Key
	var src, dst [4]byte
	binary.BigEndian.PutUint32(src[:], 0xc6120000|id>>16) // 198.18.x.x
	binary.BigEndian.PutUint32(dst[:], 0xc6130000|id&0xffff)
	k.SetIPv4(id&0xffffff, ProtoTCP, src[:], dst[:], uint16(id), 443)
	return k
}

// ctKey6 returns a distinct IPv6 UDP key for each id.
func ctKey6(id uint32) Key {
	var k Key
	src := [16]byte{0x20, 0x01, 0x0d, 0xb8, 1}
	dst := [16]byte{0x20, 0x01, 0x0d, 0xb8, 2}
	binary.BigEndian.PutUint32(src[12:], id)
	binary.BigEndian.PutUint32(dst[12:], ^id)
	k.SetIPv6(7, ProtoUDP, src[:], dst[:], uint16(id>>3), 53)
	return k
}

func ctKeyOf(family int, id uint32) Key {
	if family == 6 {
		return ctKey6(id)
	}
	return ctKey4(id)
}

func newCT(t testing.TB, cfg ConnTableConfig) *ConnTable {
	t.Helper()
	ct, err := NewConnTable(cfg)
	require.NoError(t, err)
	return ct
}

// ctSeed fixes the table's hash seed so that placement is reproducible.
func ctSeed(ct *ConnTable, s uint64) {
	for i := range ct.seed {
		s += 0x9e3779b97f4a7c15
		ct.seed[i] = s | 1
	}
}

func TestConnTableConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  ConnTableConfig
		err  string // substring; empty for success
	}{
		{"ok", ConnTableConfig{Capacity: 100}, ""},
		{"zero capacity", ConnTableConfig{}, "Capacity must be"},
		{"negative capacity", ConnTableConfig{Capacity: -1}, "Capacity must be"},
		{"huge capacity", ConnTableConfig{Capacity: maxConnCapacity + 1}, "Capacity must be"},
		{"negative v6", ConnTableConfig{Capacity: 1, IPv6Capacity: -5}, "IPv6Capacity must be"},
		{"negative timeout", ConnTableConfig{Capacity: 1, Timeouts: Timeouts{Closing: -time.Second}}, "Timeouts.Closing"},
		{"sub-ms timeout", ConnTableConfig{Capacity: 1, Timeouts: Timeouts{UDP: time.Microsecond}}, "Timeouts.UDP"},
		{"too long timeout", ConnTableConfig{Capacity: 1, Timeouts: Timeouts{Established: 8 * 24 * time.Hour}}, "Timeouts.Established"},
		{"max timeout", ConnTableConfig{Capacity: 1, Timeouts: Timeouts{Established: MaxConnTimeout}}, ""},
		{"prove after too long", ConnTableConfig{Capacity: 1, Timeouts: Timeouts{Untrusted: time.Second}, ProveAfter: time.Second}, "ProveAfter must be"},
		{"proven share", ConnTableConfig{Capacity: 1, ProvenShare: 1.5}, "ProvenShare must be"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Check answers as NewConnTable does, without the table.
			check := tt.cfg.Check()
			ct, err := NewConnTable(tt.cfg)
			if tt.err == "" {
				require.NoError(t, check)
				require.NoError(t, err)
				require.NotNil(t, ct)
				return
			}
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrConnTableConfig))
			assert.Contains(t, err.Error(), tt.err)
			assert.Nil(t, ct)
			require.Equal(t, err, check)
		})
	}
}

func TestConnTableDefaults(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 800, Timeouts: Timeouts{UDP: 5 * time.Second}})
	cfg := ct.Config()
	assert.Equal(t, 100, cfg.IPv6Capacity)
	want := DefaultTimeouts()
	want.UDP = 5 * time.Second
	assert.Equal(t, want, cfg.Timeouts)
	// 1.75 slots per flow, rounded up to a power of two of buckets:
	// 800 → 280 → 512 buckets, 100 → 35 → 64.
	assert.Equal(t, (512+64)*ctSlots, ct.Cap())
	assert.Equal(t, 512*128+64*256+ctStripes*64, ct.MemoryBytes())
	// In use from the start: 32 KiB of each, 256 IPv4 buckets, and all 64
	// IPv6 buckets (16 KiB).
	assert.Equal(t, (256+64)*ctSlots, ct.InUse())
	// Preallocated: exactly 1.75 slots per flow in whole buckets, all in
	// use: 800 → 280 buckets, 100 → 35.
	pre := newCT(t, ConnTableConfig{Capacity: 800, Preallocate: true})
	assert.Equal(t, (280+35)*ctSlots, pre.Cap())
	assert.Equal(t, pre.Cap(), pre.InUse())
	assert.Equal(t, 280*128+35*256+ctStripes*64, pre.MemoryBytes())
	assert.Equal(t, 0, ct.Len())
}

func TestConnTableLayout(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 1000})
	assert.Equal(t, 128, ctBytes(ct.v4.b[:1]), "IPv4 bucket is two cache lines")
	assert.Equal(t, 256, ctBytes(ct.v6.b[:1]), "IPv6 bucket is four cache lines")
	assert.Equal(t, 64, ctBytes(ct.stripes[:1]), "a counter stripe is one cache line")
	for _, p := range []uintptr{addrOf(&ct.v4.b[0]), addrOf(&ct.v6.b[0]), addrOf(&ct.stripes[0])} {
		assert.Zero(t, p%ctCacheLine, "cache-line aligned")
	}
}

func TestConnTableBasic(t *testing.T) {
	for _, fam := range []int{4, 6} {
		t.Run("IPv"+itoa(uint64(fam)), func(t *testing.T) {
			ct := newCT(t, ConnTableConfig{Capacity: 64})
			a, b := ctKeyOf(fam, 1), ctKeyOf(fam, 2)
			now := Tick(1000)
			type step struct {
				name    string
				do      func() any
				want    any
				backend uint32 // expected Lookup of a afterwards; 0 = miss
				class   StateClass
			}
			steps := []step{
				{"miss on empty", func() any { _, _, ok := ct.Lookup(&a, now); return ok }, false, 0, 0},
				{"insert", func() any { return ct.Insert(&a, 10, ClassUntrusted, now) }, InsertNew, 10, ClassUntrusted},
				{"insert other", func() any { return ct.Insert(&b, 20, ClassUDP, now) }, InsertNew, 10, ClassUntrusted},
				{"update", func() any { return ct.Insert(&a, 11, ClassUntrusted, now) }, InsertUpdated, 11, ClassUntrusted},
				{"set class", func() any { return ct.SetClass(&a, ClassEstablished, now) }, true, 11, ClassEstablished},
				{"len", func() any { return ct.Len() }, 2, 11, ClassEstablished},
				{"delete", func() any { return ct.Delete(&a) }, true, 0, 0},
				{"delete again", func() any { return ct.Delete(&a) }, false, 0, 0},
				{"set class absent", func() any { return ct.SetClass(&a, ClassClosing, now) }, false, 0, 0},
				{"reinsert", func() any { return ct.Insert(&a, 12, ClassClosing, now) }, InsertNew, 12, ClassClosing},
			}
			for _, s := range steps {
				require.Equal(t, s.want, s.do(), s.name)
				be, cl, ok := ct.Lookup(&a, now)
				require.Equal(t, s.backend != 0, ok, s.name)
				require.Equal(t, s.backend, be, s.name)
				require.Equal(t, s.class, cl, s.name)
			}
			be, cl, ok := ct.Lookup(&b, now)
			require.True(t, ok)
			assert.Equal(t, uint32(20), be)
			assert.Equal(t, ClassUDP, cl)
			st := ct.Stats()
			assert.Equal(t, ConnTableStats{Entries: 2, Inserts: 3, Updates: 1, Deletes: 1, Proven: 2}, st)
		})
	}
}

func TestConnTableInvalidKeys(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 64})
	wide := ctKey4(1)
	wide.VNI = 1 << 24
	for name, k := range map[string]Key{"zero": {}, "family 5": {Family: 5}, "VNI over 24 bits": wide} {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, InsertInvalid, ct.Insert(&k, 1, ClassUDP, 0))
			_, _, ok := ct.Lookup(&k, 0)
			assert.False(t, ok)
			assert.False(t, ct.SetClass(&k, ClassUDP, 0))
			assert.False(t, ct.Delete(&k))
		})
	}
	k := ctKey4(1)
	assert.Equal(t, InsertInvalid, ct.Insert(&k, 1, ClassUDP+1, 0), "unknown class")
	require.Equal(t, InsertNew, ct.Insert(&k, 1, ClassUDP, 0))
	assert.False(t, ct.SetClass(&k, 200, 0), "unknown class")
	_, cl, _ := ct.Lookup(&k, 0)
	assert.Equal(t, ClassUDP, cl)
}

// TestConnTableKeyFields checks that every field of the key matters: keys
// differing in one field are different flows, and IPv4 and IPv6 keys with
// the same bytes are different flows.
func TestConnTableKeyFields(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 256})
	base4, base6 := ctKey4(5), ctKey6(5)
	var keys []Key
	for _, base := range []Key{base4, base6} {
		mods := []func(*Key){
			func(*Key) {},
			func(k *Key) { k.Src[0] ^= 1 },
			func(k *Key) { k.Src[3] ^= 0x80 },
			func(k *Key) { k.Dst[0] ^= 1 },
			func(k *Key) { k.Dst[3] ^= 0x80 },
			func(k *Key) { k.SrcPort ^= 1 },
			func(k *Key) { k.DstPort ^= 0x8000 },
			func(k *Key) { k.Proto = ProtoUDP + ProtoTCP - k.Proto },
			func(k *Key) { k.VNI ^= 1 << 23 },
			func(k *Key) { *k = k.Reverse() },
		}
		if base.Family == FamilyIPv6 {
			mods = append(mods, func(k *Key) { k.Src[15] ^= 1 }, func(k *Key) { k.Dst[8] ^= 1 })
		}
		for _, m := range mods {
			k := base
			m(&k)
			keys = append(keys, k)
		}
	}
	// Same address bytes, other family.
	k := base4
	k.Family = FamilyIPv6
	keys = append(keys, k)
	for i := range keys {
		require.Equal(t, InsertNew, ct.Insert(&keys[i], uint32(i), ClassUDP, 0), keys[i].String())
	}
	for i := range keys {
		be, _, ok := ct.Lookup(&keys[i], 0)
		require.True(t, ok)
		require.Equal(t, uint32(i), be, keys[i].String())
	}
	// Range gives back exactly the keys inserted.
	got := map[Key]uint32{}
	ct.Range(func(k Key, backend uint32, _ StateClass, _ Tick) bool {
		got[k] = backend
		return true
	})
	require.Len(t, got, len(keys))
	for i, k := range keys {
		assert.Equal(t, uint32(i), got[k], k.String())
	}
}

func TestConnTableTimeouts(t *testing.T) {
	to := Timeouts{Untrusted: time.Second, Established: time.Minute, Closing: 2 * time.Second, UDP: 30 * time.Second}
	timeouts := map[StateClass]time.Duration{
		ClassUntrusted: to.Untrusted, ClassEstablished: to.Established, ClassClosing: to.Closing, ClassUDP: to.UDP,
	}
	// Start close to the wrap of the 32-bit tick to check wrap handling too.
	for _, start := range []Tick{0, 1<<32 - 500} {
		for cls, d := range timeouts {
			t.Run(cls.String()+"@"+itoa(uint64(start)), func(t *testing.T) {
				ct := newCT(t, ConnTableConfig{Capacity: 16, Timeouts: to})
				k := ctKey4(9)
				require.Equal(t, InsertNew, ct.Insert(&k, 3, cls, start))
				// Idle for exactly the timeout: still there.
				_, _, ok := ct.Lookup(&k, start+Ticks(d))
				require.True(t, ok, "at the timeout")
				now := start + 2*Ticks(d)
				if cls == ClassUntrusted {
					// Lookups never extend an untrusted entry's life:
					// it ends one timeout after it was stored.
					_, _, ok = ct.Lookup(&k, now)
					require.False(t, ok, "an untrusted entry refreshed by a lookup")
					_, n := ct.Age(now, ct.Cap())
					require.Equal(t, 1, n)
					return
				}
				// That lookup refreshed it: another full timeout from there.
				_, _, ok = ct.Lookup(&k, now)
				require.True(t, ok, "refreshed by the lookup")
				// Age at the same moment removes nothing.
				_, n := ct.Age(now, ct.Cap())
				require.Zero(t, n)
				// One tick past the timeout: a miss, though still stored.
				now += Ticks(d) + 1
				_, _, ok = ct.Lookup(&k, now)
				require.False(t, ok, "past the timeout")
				require.False(t, ct.SetClass(&k, ClassEstablished, now), "SetClass of an expired flow")
				require.Equal(t, 1, ct.Len())
				// The ager removes it.
				scanned, n := ct.Age(now, ct.Cap())
				require.Equal(t, ct.Cap(), scanned)
				require.Equal(t, 1, n)
				require.Equal(t, 0, ct.Len())
				require.Equal(t, uint64(1), ct.Stats().Expired)
			})
		}
	}
}

// TestConnTableClockSkew: a worker whose batch tick is slightly older than
// the entry's last-seen (another worker refreshed it) sees a fresh entry,
// and does not move last-seen backwards.
func TestConnTableClockSkew(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 16, Timeouts: Timeouts{Untrusted: time.Second}})
	k := ctKey4(1)
	ct.Insert(&k, 1, ClassUntrusted, 5000)
	_, _, ok := ct.Lookup(&k, 4990)
	require.True(t, ok)
	_, _, ok = ct.Lookup(&k, 6000)
	require.True(t, ok, "last-seen must still be 5000")
	_, _, ok = ct.Lookup(&k, 7001)
	require.False(t, ok)
}

func TestConnTableSetClassRefreshes(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 16, Timeouts: Timeouts{Untrusted: time.Second, Closing: 10 * time.Second}})
	k := ctKey6(1)
	ct.Insert(&k, 1, ClassUntrusted, 0)
	require.True(t, ct.SetClass(&k, ClassClosing, 900))
	be, cl, ok := ct.Lookup(&k, 5000)
	require.True(t, ok)
	assert.Equal(t, uint32(1), be)
	assert.Equal(t, ClassClosing, cl)
}

// TestConnTableInsertOverExpired: inserting a key whose old entry expired
// is a new flow, and counts the old one as expired.
func TestConnTableInsertOverExpired(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 16, Timeouts: Timeouts{UDP: time.Second}})
	k := ctKey4(1)
	ct.Insert(&k, 1, ClassUDP, 0)
	require.Equal(t, InsertNew, ct.Insert(&k, 2, ClassUDP, 5000))
	st := ct.Stats()
	assert.Equal(t, ConnTableStats{Entries: 1, Inserts: 2, Expired: 1, Proven: 1}, st)
	be, _, ok := ct.Lookup(&k, 5000)
	require.True(t, ok)
	assert.Equal(t, uint32(2), be)
}

func addrOf[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }

// TestConnTableHeader checks the SWAR header helpers against a plain
// per-slot model over random headers.
func TestConnTableHeader(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var tags [ctSlots]uint64
		var cls [ctSlots]StateClass
		h := r.Uint64() & ctSeqMask
		for j := range ctSlots {
			if r.IntN(3) > 0 {
				tags[j] = 1 + r.Uint64N(15)
				cls[j] = StateClass(r.IntN(4))
				h = ctSet(h, j, tags[j], cls[j])
			}
		}
		tag := 1 + r.Uint64N(15)
		var occ, match uint64
		for j := range ctSlots {
			if tags[j] != 0 {
				occ |= 1 << (4 * j)
				require.Equal(t, cls[j], ctClass(h, j))
			}
			if tags[j] == tag {
				match |= 1 << (4 * j)
			}
		}
		require.Equal(t, occ, ctOcc(h))
		require.Equal(t, match, ctMatch(h, tag))
		j := r.IntN(ctSlots)
		c := ctClear(h, j)
		require.Zero(t, ctOcc(c)&(1<<(4*j)))
		require.Equal(t, ctOcc(h)&^(1<<(4*j)), ctOcc(c))
		require.Equal(t, h&ctSeqMask, c&ctSeqMask)
		if tags[j] != 0 {
			s := ctSetClass(h, j, ClassClosing)
			require.Equal(t, ClassClosing, ctClass(s, j))
			require.Equal(t, ctOcc(h), ctOcc(s))
			require.Equal(t, ctMatch(h, tag), ctMatch(s, tag))
		}
	}
	for hash := range uint64(1 << 12) {
		tg := ctTag(hash * 0x9e3779b97f4a7c15)
		require.True(t, tg >= 1 && tg <= 15)
	}
}

// TestConnTableFillToCapacity checks the sizing claim: a table filled to
// its Capacity with distinct flows stores all but a few of them, growing
// (the default) or preallocated. (Seeded, so deterministic; a simulation
// of the preallocated placement gives about 3 refusals per million at
// 100% and essentially none below 85%.)
func TestConnTableFillToCapacity(t *testing.T) {
	for _, pre := range []bool{false, true} {
		t.Run(fmt.Sprint("Preallocate=", pre), func(t *testing.T) {
			testConnTableFillToCapacity(t, pre)
		})
	}
}

func testConnTableFillToCapacity(t *testing.T, pre bool) {
	const n = 200_000
	ct := newCT(t, ConnTableConfig{Capacity: n, Preallocate: pre})
	ctSeed(ct, 3)
	refusedAt80 := uint64(0)
	for i := range uint32(n) {
		if i == n*8/10 {
			refusedAt80 = ct.Stats().Refused
		}
		k := ctBenchKey(i)
		r := ct.Insert(&k, i, ClassEstablished, 0)
		require.Contains(t, []InsertResult{InsertNew, InsertRefused}, r)
	}
	st := ct.Stats()
	assert.Zero(t, refusedAt80, "refused before 80% of Capacity")
	assert.LessOrEqual(t, st.Refused, uint64(10), "refused at 100%% of Capacity")
	assert.Equal(t, n-int(st.Refused), ct.Len())
	assert.Equal(t, ct.v4.n, ctActive(ct.v4.geo.Load()), "fully grown")
	if pre {
		assert.LessOrEqual(t, float64(ct.MemoryBytes())/float64(ct.Len()), 64.0, "B/flow")
	} else {
		// Up to twice that as the buckets are rounded up to a power of
		// two (here 70,000 → 131,072 IPv4).
		assert.LessOrEqual(t, float64(ct.MemoryBytes())/float64(ct.Len()), 112.0, "B/flow")
	}
	t.Logf("refused %d of %d; %.1f B/flow", st.Refused, n, float64(ct.MemoryBytes())/float64(ct.Len()))
}

// TestConnTablePrepared: the prepared operations agree with the plain
// ones, in both directions and for both families, also when the table
// changed between Prepare and the operation (a stale header), and a query
// of an invalid key fails like the plain calls. With a fleet Hasher the
// same holds for queries prepared with the key's hash (PrepareHashed); a
// table without one ignores the hash it is handed.
func TestConnTablePrepared(t *testing.T) {
	fleet := NewHasher(99)
	tests := []struct {
		name   string
		hasher *Hasher
		hashed bool   // prepare with PrepareHashed
		bogus  uint64 // XORed into the hash handed to PrepareHashed
	}{
		{"own hash", nil, false, 0},
		{"fleet hash, Prepare", &fleet, false, 0},
		{"fleet hash, PrepareHashed", &fleet, true, 0},
		{"own hash, PrepareHashed ignores the hash", nil, true, 0xdead_beef},
	}
	for _, tt := range tests {
		for _, fam := range []int{4, 6} {
			t.Run(fmt.Sprintf("%s/IPv%d", tt.name, fam), func(t *testing.T) {
				// 500 flows of each family, at most half of Capacity: a
				// table near its Capacity may refuse a few (see ConnTable),
				// and this test is about queries, not room.
				cfg := ConnTableConfig{Capacity: 4096, IPv6Capacity: 1024, Hasher: tt.hasher}
				testConnTablePrepared(t, cfg, fam, func(ct *ConnTable, q *ConnQuery, k *Key) {
					if tt.hashed {
						ct.PrepareHashed(q, k, fleet.Hash(k, Tuple5)^tt.bogus)
					} else {
						ct.Prepare(q, k)
					}
				})
			})
		}
	}
	ct := newCT(t, ConnTableConfig{Capacity: 64})
	var q ConnQuery
	_, _, ok := ct.LookupPrepared(&q, 1)
	require.False(t, ok, "the zero query")
	bad := ctKey4(1)
	bad.VNI = 1 << 24
	for _, prep := range []func(){func() { ct.Prepare(&q, &bad) }, func() { ct.PrepareHashed(&q, &bad, 1) }} {
		prep()
		require.Equal(t, InsertInvalid, ct.InsertPrepared(&q, 1, ClassUDP, 1))
		_, _, ok = ct.LookupPrepared(&q, 1)
		require.False(t, ok)
		require.False(t, ct.SetClassPrepared(&q, ClassUDP, 1))
	}
	require.Nil(t, ct.Hasher())
	require.Equal(t, fleet.Seed(), newCT(t, ConnTableConfig{Capacity: 64, Hasher: &fleet}).Hasher().Seed())
}

func testConnTablePrepared(t *testing.T, cfg ConnTableConfig, fam int, prepare func(*ConnTable, *ConnQuery, *Key)) {
	ct := newCT(t, cfg)
	const n = 500
	qs := make([]ConnQuery, n)
	for i := range n {
		k := ctKeyOf(fam, uint32(i))
		prepare(ct, &qs[i], &k)
	}
	// Half inserted through queries, half plainly, after every
	// query was prepared: all headers the queries hold are stale.
	for i := range n {
		k := ctKeyOf(fam, uint32(i))
		if i%2 == 0 {
			require.True(t, ct.InsertPrepared(&qs[i], uint32(i+1), ClassUDP, 10).Stored())
		} else {
			require.True(t, ct.Insert(&k, uint32(i+1), ClassUDP, 10).Stored())
		}
	}
	for i := range n {
		k := ctKeyOf(fam, uint32(i))
		b, c, ok := ct.LookupPrepared(&qs[i], 11)
		require.True(t, ok, i)
		require.Equal(t, uint32(i+1), b)
		require.Equal(t, ClassUDP, c)
		b2, _, ok := ct.Lookup(&k, 11)
		require.True(t, ok)
		require.Equal(t, b, b2)
	}
	require.True(t, ct.SetClassPrepared(&qs[7], ClassClosing, 12))
	k := ctKeyOf(fam, 7)
	_, c, _ := ct.Lookup(&k, 12)
	require.Equal(t, ClassClosing, c)
	require.True(t, ct.Delete(&k))
	_, _, ok := ct.LookupPrepared(&qs[7], 12)
	require.False(t, ok, "deleted after Prepare")
	require.False(t, ct.SetClassPrepared(&qs[7], ClassUDP, 12))
	require.Equal(t, InsertInvalid, ct.InsertPrepared(&qs[8], 1, StateClass(9), 12))
}

// TestStateClassAdvance: every (current, seen) pair.
func TestStateClassAdvance(t *testing.T) {
	U, E, C, D := ClassUntrusted, ClassEstablished, ClassClosing, ClassUDP
	tests := []struct{ cur, seen, want StateClass }{
		{U, U, U}, {U, E, E}, {U, C, C},
		{E, U, E}, {E, E, E}, {E, C, C}, // a SYN never demotes
		{C, U, U}, {C, E, C}, {C, C, C}, // a new SYN after close starts over
		{D, D, D},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.cur.Advance(tt.seen), "%v + %v", tt.cur, tt.seen)
	}
}

// TestConnTablePeek: PeekPrepared finds a live flow like LookupPrepared
// but never refreshes it, so a flow only peeked at expires a timeout
// after its last real use (a lookup keeps it alive).
func TestConnTablePeek(t *testing.T) {
	tab, err := NewConnTable(ConnTableConfig{Capacity: 1024})
	require.NoError(t, err)
	to := Ticks(DefaultTimeouts().Established)
	for _, peek := range []bool{true, false} {
		k := Key{Family: FamilyIPv4, Proto: ProtoTCP, SrcPort: 1000, DstPort: 80}
		if peek {
			k.SrcPort = 1001
		}
		var q ConnQuery
		tab.Prepare(&q, &k)
		require.True(t, tab.InsertPrepared(&q, 7, ClassEstablished, 0).Stored())
		var b uint32
		var ok bool
		if peek {
			b, _, ok = tab.PeekPrepared(&q, to-1)
		} else {
			b, _, ok = tab.LookupPrepared(&q, to-1)
		}
		require.True(t, ok)
		require.EqualValues(t, 7, b)
		_, _, ok = tab.PeekPrepared(&q, to+1)
		require.Equal(t, !peek, ok, "peek %v: alive a timeout after the insert only if the lookup refreshed it", peek)
	}
}

// TestRefreshAfter: the refresh interval is 1/32 of each proven class's
// timeout, and none for untrusted entries (lookups never refresh them).
func TestRefreshAfter(t *testing.T) {
	ct, err := NewConnTable(ConnTableConfig{Capacity: 64})
	require.NoError(t, err)
	d := DefaultTimeouts()
	for _, c := range []struct {
		class StateClass
		want  Tick
	}{
		{ClassUntrusted, 0},
		{ClassEstablished, Ticks(d.Established) / 32},
		{ClassClosing, Ticks(d.Closing) / 32},
		{ClassUDP, Ticks(d.UDP) / 32},
		{ctClasses, 0},
	} {
		require.Equal(t, c.want, ct.RefreshAfter(c.class), "%v", c.class)
	}
}

// TestLookupPreparedSeen: the last-seen a lookup reports is the entry's
// as the lookup leaves it — as it was while it lags by at most
// RefreshAfter, the lookup's tick once the lookup refreshed it.
func TestLookupPreparedSeen(t *testing.T) {
	ct, err := NewConnTable(ConnTableConfig{Capacity: 64})
	require.NoError(t, err)
	k := KeyFrom(0, ProtoTCP, netip.MustParseAddrPort("198.18.0.1:1000"), netip.MustParseAddrPort("198.18.100.1:80"))
	const t0 = Tick(1000)
	require.True(t, ct.Insert(&k, 7, ClassEstablished, t0).Stored())
	slack := ct.RefreshAfter(ClassEstablished)
	var q ConnQuery
	for _, s := range []struct {
		now, seen Tick
	}{
		{t0 + slack/2, t0},               // not refreshed
		{t0 + slack, t0},                 // lags by exactly RefreshAfter: not yet
		{t0 + slack + 1, t0 + slack + 1}, // refreshed
		{t0 + slack + 2, t0 + slack + 1},
	} {
		ct.Prepare(&q, &k)
		b, c, _, seen, ok := ct.LookupPreparedSeen(&q, s.now)
		require.True(t, ok)
		require.Equal(t, uint32(7), b)
		require.Equal(t, ClassEstablished, c)
		require.Equal(t, s.seen, seen, "at %d", s.now)
	}
}
