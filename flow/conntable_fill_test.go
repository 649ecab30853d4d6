package flow

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ctCandidates returns the entries stored in k's two candidate buckets.
func ctCandidates(ct *ConnTable, k *Key) []ctEntry {
	var p ctKey
	i1, i2 := ct.v4.index(ct.pack4(k, &p), ct.v4.geo.Load())
	var es [ctSlots]ctEntry
	var out []ctEntry
	for _, i := range []uint64{i1, i2} {
		out = append(out, es[:ct.v4.snapshot(i, &es)]...)
	}
	return out
}

func ctContains(ct *ConnTable, e ctEntry) bool {
	k := ctUnpack4(&e.k)
	var p ctKey
	h := ct.pack4(&k, &p)
	_, j, _, _, _ := ct.v4.search(&p, h, ctTag(h))
	return j >= 0
}

// ctFill inserts keys from id upwards with the given class until n inserts
// found both buckets full (refused or evicted); it returns the keys stored
// in free slots and the next id.
func ctFill(t *testing.T, ct *ConnTable, id uint32, cls StateClass, now Tick, n int) ([]Key, uint32) {
	var stored []Key
	for full := 0; full < n; id++ {
		k := ctKey4(id)
		switch r := ct.Insert(&k, id, cls, now); r {
		case InsertNew:
			stored = append(stored, k)
		case InsertRefused, InsertEvicted:
			full++
		default:
			t.Fatalf("insert %d: %v", id, r)
		}
	}
	return stored, id
}

func TestConnTableFull(t *testing.T) {
	to := Timeouts{Untrusted: 10 * time.Second, Established: time.Minute}
	ct := newCT(t, ConnTableConfig{Capacity: 40, Timeouts: to})
	ctSeed(ct, 1)
	v4slots := int(ct.v4.n) * ctSlots

	// Fill with established flows until 50 inserts were refused.
	est, id := ctFill(t, ct, 0, ClassEstablished, 0, 50)
	require.Equal(t, len(est), ct.Len())
	require.LessOrEqual(t, len(est), v4slots)
	assert.GreaterOrEqual(t, len(est), 40, "holds at least Capacity flows")
	st := ct.Stats()
	assert.Equal(t, uint64(50), st.Refused)
	assert.Zero(t, st.Evictions)

	// A new untrusted flow cannot push out established ones...
	for range 20 {
		k := ctKey4(id)
		id++
		cands := ctCandidates(ct, &k)
		if len(cands) < 2*ctSlots {
			continue // a free slot somewhere: not the case under test
		}
		require.Equal(t, InsertRefused, ct.Insert(&k, 1, ClassUntrusted, 1000))
	}
	// ...and every established flow is still there.
	for i := range est {
		_, _, ok := ct.Lookup(&est[i], 1000)
		require.True(t, ok)
	}

	// Once they are idle past their timeout, an insert reuses the slot of
	// the longest idle one in its window.
	late := Ticks(to.Established) + 5000
	for i := range est {
		// Refresh half of them at 2000, so the others are the older ones.
		if i%2 == 0 {
			ct.Lookup(&est[i], 2000)
		}
	}
	for done := 0; done < 10; id++ {
		k := ctKey4(id)
		cands := ctCandidates(ct, &k)
		if len(cands) < 2*ctSlots {
			continue
		}
		oldest := Tick(1 << 31)
		for _, e := range cands {
			oldest = min(oldest, ctSeen(e.v))
		}
		require.Equal(t, InsertEvicted, ct.Insert(&k, id, ClassEstablished, late))
		// The victim was one of the oldest.
		for _, e := range cands {
			if !ctContains(ct, e) {
				assert.Equal(t, oldest, ctSeen(e.v))
			}
		}
		done++
	}
	st = ct.Stats()
	assert.Equal(t, uint64(10), st.Expired)
	assert.Zero(t, st.Evictions)
}

func TestConnTableEvictsUntrusted(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 40})
	ctSeed(ct, 2)
	// Fill with SYN-only flows of different ages (all within the timeout).
	// Until ten inserts found a full window, so that enough buckets are
	// full for the thirty evictions below.
	_, id := ctFill(t, ct, 0, ClassUntrusted, 0, 10)
	require.Equal(t, uint64(10), ct.Stats().Evictions, "a full window of SYN-only flows evicts")
	ct.Range(func(k Key, _ uint32, _ StateClass, _ Tick) bool {
		ct.Lookup(&k, Tick(rand.IntN(3000)))
		return true
	})
	now := Tick(5000)
	for done := 0; done < 30; id++ {
		k := ctKey4(id)
		cands := ctCandidates(ct, &k)
		if len(cands) < 2*ctSlots {
			continue
		}
		var untrusted []ctEntry
		oldest := Tick(1 << 31)
		for _, e := range cands {
			if e.cls == ClassUntrusted {
				untrusted = append(untrusted, e)
				oldest = min(oldest, ctSeen(e.v))
			}
		}
		r := ct.Insert(&k, id, ClassEstablished, now)
		if len(untrusted) == 0 {
			require.Equal(t, InsertRefused, r)
			continue
		}
		require.Equal(t, InsertEvicted, r)
		gone := 0
		for _, e := range cands {
			if !ctContains(ct, e) {
				gone++
				assert.Equal(t, ClassUntrusted, e.cls, "only an untrusted flow is evicted")
				assert.Equal(t, oldest, ctSeen(e.v), "the least recently seen one")
			}
		}
		require.Equal(t, 1, gone)
		done++
	}
	st := ct.Stats()
	assert.Equal(t, uint64(40), st.Evictions)
	assert.Zero(t, st.Expired)
	assert.Equal(t, int(st.Inserts-st.Evictions), ct.Len())
}

func TestConnTableAge(t *testing.T) {
	to := Timeouts{Untrusted: time.Second, Established: 10 * time.Second, Closing: 2 * time.Second, UDP: 5 * time.Second}
	ct := newCT(t, ConnTableConfig{Capacity: 1000, IPv6Capacity: 1000, Timeouts: to})
	classes := []StateClass{ClassUntrusted, ClassEstablished, ClassClosing, ClassUDP}
	const n = 800
	for i := range uint32(n) {
		k := ctKeyOf(4+2*int(i%2), i)
		require.True(t, ct.Insert(&k, i, classes[i%4], 0).Stored())
	}
	require.Equal(t, n, ct.Len())

	// Partial budgets: calls until the budgets add up to the part in use,
	// by when each family's cursor has gone round once (its share of each
	// budget is rounded up).
	now := Ticks(3 * time.Second) // untrusted and closing are idle
	total, expired := 0, 0
	for total < ct.InUse() {
		s, e := ct.Age(now, 97)
		// The budget rounded up to whole buckets, 20, each family's
		// share of them rounded up too.
		require.Contains(t, []int{100, 105}, s)
		total += 100
		expired += e
	}
	assert.Equal(t, n/2, expired)
	assert.Equal(t, n/2, ct.Len())
	ct.Range(func(_ Key, backend uint32, class StateClass, _ Tick) bool {
		assert.Contains(t, []StateClass{ClassEstablished, ClassUDP}, class)
		assert.Equal(t, classes[backend%4], class)
		return true
	})

	// A budget larger than the table scans the part in use once.
	s, e := ct.Age(Ticks(20*time.Second), 1<<30)
	assert.Equal(t, ct.InUse(), s)
	assert.Equal(t, n/2, e)
	assert.Equal(t, 0, ct.Len())
	assert.Equal(t, uint64(n), ct.Stats().Expired)
}

func TestConnTableRangeStops(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 100, IPv6Capacity: 100})
	for i := range uint32(50) {
		k := ctKeyOf(4+2*int(i%2), i)
		ct.Insert(&k, i, ClassUDP, Tick(i))
	}
	seen := map[uint32]Tick{}
	ct.Range(func(_ Key, backend uint32, _ StateClass, last Tick) bool {
		seen[backend] = last
		return true
	})
	require.Len(t, seen, 50)
	for b, last := range seen {
		assert.Equal(t, Tick(b), last)
	}
	calls := 0
	ct.Range(func(Key, uint32, StateClass, Tick) bool { calls++; return calls < 7 })
	assert.Equal(t, 7, calls)
}

func TestConnTableTicks(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 1})
	assert.Equal(t, Tick(1500), Ticks(1500*time.Millisecond+999*time.Microsecond))
	assert.Equal(t, Tick(2500), ct.TickAt(ct.epoch.Add(2500*time.Millisecond)))
	// Wraps after 2^32 ms.
	assert.Equal(t, Tick(7), ct.TickAt(ct.epoch.Add((1<<32+7)*time.Millisecond)))
	assert.Less(t, ct.Now(), Tick(60_000))
}

func TestConnTableResultStrings(t *testing.T) {
	assert.Equal(t, "new", InsertNew.String())
	assert.Equal(t, "invalid", InsertInvalid.String())
	assert.Equal(t, "result(9)", InsertResult(9).String())
	assert.Equal(t, "established", ClassEstablished.String())
	assert.Equal(t, "class(7)", StateClass(7).String())
	for r := InsertNew; r <= InsertInvalid; r++ {
		assert.Equal(t, r <= InsertEvicted, r.Stored(), r.String())
	}
}

func TestConnTableNoAllocs(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 1024})
	k4, k6 := ctKey4(1), ctKey6(1)
	var now Tick
	tests := []struct {
		name string
		fn   func()
	}{
		{"Insert4", func() { now++; ct.Insert(&k4, 1, ClassEstablished, now) }},
		{"Insert6", func() { now++; ct.Insert(&k6, 1, ClassEstablished, now) }},
		{"Lookup4", func() { now++; ct.Lookup(&k4, now) }},
		{"Lookup6", func() { now++; ct.Lookup(&k6, now) }},
		{"LookupMiss", func() { k := ctKey4(2); ct.Lookup(&k, now) }},
		{"SetClass", func() { now++; ct.SetClass(&k4, ClassClosing, now) }},
		{"DeleteInsert", func() { ct.Delete(&k4); ct.Insert(&k4, 1, ClassUDP, now) }},
		{"Age", func() { ct.Age(now, 64) }},
		{"Now", func() { now = ct.Now() }},
		{"Prepared", func() {
			var q ConnQuery
			now++
			ct.Prepare(&q, &k6)
			ct.LookupPrepared(&q, now)
			ct.SetClassPrepared(&q, ClassEstablished, now)
			ct.InsertPrepared(&q, 2, ClassEstablished, now)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Zero(t, testing.AllocsPerRun(100, tt.fn))
		})
	}
}

// TestConnTableConcurrent runs lookups, inserts, class changes, deletes and
// an ager at once (run it with -race). Each key id owns the backends whose
// upper bits are the id, so any value a reader sees must have been written
// for that very key; a torn or misplaced read breaks that. "hot" squeezes
// many keys into a few buckets so that readers and writers collide on
// every operation.
func TestConnTableConcurrent(t *testing.T) {
	tests := []struct {
		name     string
		cfg      ConnTableConfig
		keys     int
		workers  int
		iters    int
		ageEvery int  // the ager sweeps this many slots per call
		step     Tick // time advance per 64 operations of a worker
	}{
		{"spread", ConnTableConfig{Capacity: 1000, IPv6Capacity: 500}, 3000, 4, 40000, 200, 3},
		{"hot", ConnTableConfig{Capacity: 8, IPv6Capacity: 4}, 60, 6, 20000, 5, 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			iters := tt.iters
			if testing.Short() {
				iters /= 8
			}
			cfg := tt.cfg
			cfg.Timeouts = Timeouts{Untrusted: 50 * time.Millisecond, Established: 400 * time.Millisecond,
				Closing: 100 * time.Millisecond, UDP: 200 * time.Millisecond}
			ct := newCT(t, cfg)
			ctConcurrent(t, ct, tt.keys, tt.workers, iters, tt.ageEvery, tt.step)
		})
	}
}

func ctConcurrent(t *testing.T, ct *ConnTable, keys, workers, iters, ageEvery int, step Tick) {
	allKeys := make([]Key, keys)
	for i := range allKeys {
		allKeys[i] = ctKeyOf(4+2*(i%3/2), uint32(i))
	}
	var clock atomic.Uint32 // synthetic time, advanced by the workers
	var bad atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	agerDone := make(chan struct{})
	go func() { // ager
		defer close(agerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ct.Age(Tick(clock.Load()), ageEvery)
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 99))
			for n := range iters {
				now := Tick(clock.Load())
				if n%64 == 0 {
					now = Tick(clock.Add(uint32(step)))
				}
				id := r.IntN(keys)
				k := &allKeys[id]
				switch op := r.IntN(100); {
				case op < 50:
					if be, cl, ok := ct.Lookup(k, now); ok && (be>>8 != uint32(id) || cl >= ctClasses) {
						bad.Add(1)
					}
				case op < 70:
					// The batch path: prepared, then looked up after other
					// work (here a yield) so that the headers go stale.
					var q ConnQuery
					ct.Prepare(&q, k)
					if n%8 == 0 {
						runtime.Gosched()
					}
					if be, cl, ok := ct.LookupPrepared(&q, now); ok && (be>>8 != uint32(id) || cl >= ctClasses) {
						bad.Add(1)
					}
				case op < 88:
					res := ct.Insert(k, uint32(id)<<8|uint32(w), StateClass(r.IntN(4)), now)
					if res == InsertInvalid {
						bad.Add(1)
					}
				case op < 94:
					ct.SetClass(k, StateClass(r.IntN(4)), now)
				default:
					ct.Delete(k)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-agerDone
	require.Zero(t, bad.Load(), "a lookup returned a backend written for another key")

	// Quiescent: the structure must be consistent.
	seen := map[Key]bool{}
	n, proven := 0, 0
	ct.Range(func(k Key, backend uint32, class StateClass, _ Tick) bool {
		n++
		if class != ClassUntrusted {
			proven++
		}
		require.False(t, seen[k], "key stored twice: %v", k)
		seen[k] = true
		id := backend >> 8
		require.Less(t, id, uint32(keys))
		require.Equal(t, allKeys[id], k, "backend written for another key")
		require.Less(t, backend&0xff, uint32(workers))
		require.Less(t, class, StateClass(ctClasses))
		be, cl, ok := ct.Lookup(&k, Tick(clock.Load()))
		if ok {
			require.Equal(t, backend, be)
			require.Equal(t, class, cl)
		}
		return true
	})
	st := ct.Stats()
	require.Equal(t, n, st.Entries, "counters agree with the contents: %+v", st)
	require.Equal(t, proven, st.Proven, "the count of proven entries agrees with the contents: %+v", st)
	require.LessOrEqual(t, n, ct.Cap())
	// Every bucket is unlocked.
	for i := range ct.v4.b {
		require.Zero(t, ct.v4.b[i].hdr.Load()&1)
	}
	for i := range ct.v6.b {
		require.Zero(t, ct.v6.b[i].hdr.Load()&1)
	}
	t.Logf("entries %d, stats %+v", n, st)
}
