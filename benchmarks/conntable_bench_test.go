package benchmarks

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/xdplb/xdplb/flow"
)

// connSizes are the flow counts of the connection-table benchmark: one
// that fits in cache and one far larger than the last-level cache.
var connSizes = []struct {
	name  string
	flows int
}{
	{"1k", 1 << 10},
	{"1M", 1 << 20},
}

// connTable is the operations the benchmark and TestPeersAgree run on each
// implementation: a flow's backend is looked up or stored.
type connTable interface {
	lookup(k *flow.Key, now flow.Tick) (uint32, bool)
	store(k *flow.Key, v uint32, now flow.Tick)
	len() int
}

type ourConns struct{ t *flow.ConnTable }

func (c ourConns) lookup(k *flow.Key, now flow.Tick) (uint32, bool) {
	v, _, ok := c.t.Lookup(k, now)
	return v, ok
}

func (c ourConns) store(k *flow.Key, v uint32, now flow.Tick) {
	c.t.Insert(k, v, flow.ClassEstablished, now)
}

func (c ourConns) len() int { return c.t.Len() }

type syncMapConns struct{ m *sync.Map }

func (c syncMapConns) lookup(k *flow.Key, _ flow.Tick) (uint32, bool) {
	v, ok := c.m.Load(*k)
	if !ok {
		return 0, false
	}
	return v.(uint32), true
}

func (c syncMapConns) store(k *flow.Key, v uint32, _ flow.Tick) { c.m.Store(*k, v) }

func (c syncMapConns) len() int {
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	return n
}

type xsyncConns struct{ m *xsync.Map[flow.Key, uint32] }

func (c xsyncConns) lookup(k *flow.Key, _ flow.Tick) (uint32, bool) { return c.m.Load(*k) }

func (c xsyncConns) store(k *flow.Key, v uint32, _ flow.Tick) { c.m.Store(*k, v) }

func (c xsyncConns) len() int { return c.m.Size() }

// connImpls are the implementations compared, ours first. Our table comes
// filled from connSet; each peer's new builds an empty one sized for n
// flows where the implementation allows it.
var connImpls = []struct {
	name string
	new  func(n int) connTable // nil: ours, from connSet
}{
	{"xdplb", nil},
	// Ours preallocated (flow.ConnTableConfig.Preallocate): all of it in
	// use from the start, exactly 1.75 slots per flow; the default grows
	// with its flows and rounds its buckets up to a power of two.
	// (Sized 0.1% above the flows, so that none of the few a full table
	// refuses is refused here: every lookup must hit.)
	{"xdplb-prealloc", func(n int) connTable {
		t, err := flow.NewConnTable(flow.ConnTableConfig{Capacity: n + n/1000 + 8, Preallocate: true})
		if err != nil {
			panic(err)
		}
		return ourConns{t}
	}},
	{"sync.Map", func(int) connTable { return syncMapConns{new(sync.Map)} }},
	{"xsync.Map", func(n int) connTable {
		return xsyncConns{xsync.NewMap[flow.Key, uint32](xsync.WithPresize(n))}
	}},
}

// connSet is the benchmark's flows and our table holding them.
type connSet struct {
	keys []flow.Key
	ours *flow.ConnTable
}

// newConnSet generates n distinct flows (pipelineMix: about 10% IPv6) and
// fills our table, sized with Capacity n, with them (value: the flow's
// index in keys, class established, tick 0). At 100% of Capacity a few
// flows per million find both candidate buckets full and are refused (which
// ones depends on the table's random seeds); they are left out of keys, so
// every implementation holds the same flows.
func newConnSet(n int) (*connSet, error) {
	fs := genFlows(n, pipelineMix, 4)
	t, err := flow.NewConnTable(flow.ConnTableConfig{Capacity: n})
	if err != nil {
		return nil, err
	}
	keys := make([]flow.Key, 0, n)
	for _, f := range fs {
		k := targets.Key(f)
		if t.Insert(&k, uint32(len(keys)), flow.ClassEstablished, 0).Stored() {
			keys = append(keys, k)
		}
	}
	return &connSet{keys: keys, ours: t}, nil
}

// table returns implementation i's table holding the set's flows, and the
// heap bytes it took: for a peer, the HeapAlloc difference around building
// and filling it, after a GC each; for ours, MemoryBytes.
func (cs *connSet) table(i int) (connTable, uint64) {
	if connImpls[i].new == nil {
		return ourConns{cs.ours}, uint64(cs.ours.MemoryBytes())
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	t := connImpls[i].new(len(cs.keys))
	for j := range cs.keys {
		t.store(&cs.keys[j], uint32(j), 0)
	}
	if ct, ok := t.(ourConns); ok {
		return ct, uint64(ct.t.MemoryBytes())
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if after.HeapAlloc < before.HeapAlloc {
		return t, 0
	}
	return t, after.HeapAlloc - before.HeapAlloc
}

// xorshift is a tiny deterministic generator for the op streams.
type xorshift uint64

func (r *xorshift) next() uint64 {
	x := uint64(*r)
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	*r = xorshift(x)
	return x
}

// connSeeds are the fixed seeds of the per-goroutine op streams: goroutine
// i of a run takes seed i, so every implementation sees the same streams.
var connSeeds = []uint64{0x9e3779b97f4a7c15, 0xbf58476d1ce4e5b9, 0x94d049bb133111eb, 0xd6e8feb86659fd93,
	0xa0761d6478bd642f, 0xe7037ed1a0b428db, 0x8ebc6af09c88c6e3, 0x589965cc75374cc3}

// connStream is one goroutine's deterministic op stream: it walks the keys
// in order from its own starting point (so reading the key is a sequential
// access, as reading it from a packet is, while the tables, which hash it,
// see a random access), and a xorshift draw makes one op in ten a store of
// a new backend, the others lookups. Time advances one tick per 64 ops, as
// it would once per batch.
type connStream struct {
	r   xorshift
	i   int
	ops uint64
}

// newConnStream returns the stream of goroutine g of a run.
func newConnStream(g, goroutines, keys int) connStream {
	return connStream{r: xorshift(connSeeds[g%len(connSeeds)]), i: g * keys / max(goroutines, 1)}
}

// step runs one op on t; it reports whether a lookup missed.
func (s *connStream) step(t connTable, keys []flow.Key) (missed bool) {
	x := s.r.next()
	k := &keys[s.i]
	if s.i++; s.i == len(keys) {
		s.i = 0
	}
	now := flow.Tick(s.ops >> 6)
	s.ops++
	if x&0xffff < 6554 { // 10%
		t.store(k, uint32(x>>40), now)
		return false
	}
	_, ok := t.lookup(k, now)
	return !ok
}

// BenchmarkConnTable is the connection-table mix of the data path: 90%
// lookups and 10% stores of present flows (the table keeps its size), from
// GOMAXPROCS goroutines at once (run it with -cpu 2), over 1k and 1M flows,
// each goroutine walking the flows from its own starting point (connStream).
// One op is one lookup or store; ns/op is wall time per op, so it falls as
// goroutines are added. It also reports B/flow: for ours
// MemoryBytes()/Len(); for the peers the heap they grew by while being
// filled with the flows (runtime.MemStats.HeapAlloc difference).
//
// The peers do less: no timestamps or idle timeouts, no state classes, no
// bound on memory; sync.Map boxes keys and values in interfaces.
func BenchmarkConnTable(b *testing.B) {
	for _, sz := range connSizes {
		var set *connSet // built by the first sub-benchmark that runs
		group := "conns/" + sz.name
		for i, impl := range connImpls {
			var (
				t      connTable
				bytes  uint64
				filled bool
			)
			b.Run(fmt.Sprintf("flows=%s/impl=%s", sz.name, impl.name), func(b *testing.B) {
				if set == nil {
					var err error
					if set, err = newConnSet(sz.flows); err != nil {
						b.Fatal(err)
					}
				}
				keys := set.keys
				if !filled {
					t, bytes = set.table(i)
					filled = true
				}
				var goroutine, misses atomic.Uint64
				var contended uint64
				if ct, ok := t.(ourConns); ok {
					contended = ct.t.Stats().Contended
				}
				procs := runtime.GOMAXPROCS(0)
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					s := newConnStream(int(goroutine.Add(1)-1), procs, len(keys))
					var miss uint64
					for pb.Next() {
						if s.step(t, keys) {
							miss++
						}
					}
					misses.Add(miss)
				})
				b.StopTimer()
				// Every flow is present: only our table may miss, and only
				// a lookup that gave up after its bounded spin on a bucket
				// a writer held (Stats.Contended).
				if ct, ok := t.(ourConns); ok {
					contended = ct.t.Stats().Contended - contended
				}
				if m := misses.Load(); m != contended {
					b.Fatalf("%d lookups of present flows missed, %d of them contended", m, contended)
				}
				b.ReportMetric(float64(misses.Load())/float64(b.N)*1e6, "contended-ppm")
				b.ReportMetric(float64(bytes)/float64(t.len()), "B/flow")
				ns := nsPer(b, b.N)
				if impl.name == "xdplb" {
					recordOurs(group, ns)
				} else {
					reportPeer(b, group, ns)
				}
			})
			t = nil // let the table go before the next implementation's is built
		}
	}
}
