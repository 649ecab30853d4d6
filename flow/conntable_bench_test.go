package flow

import (
	"strconv"
	"sync/atomic"
	"testing"
)

// ctBenchSizes are the table sizes the benchmarks run at: one that fits in
// L1/L2 and one far larger than the last-level cache.
var ctBenchSizes = []struct {
	name  string
	flows int
}{
	{"1k", 1 << 10},
	{"1M", 1 << 20},
}

// ctBenchLayouts are the two layouts of a table: growing with its flows
// (the default) and preallocated.
var ctBenchLayouts = []struct {
	name string
	pre  bool
}{{"grow", false}, {"prealloc", true}}

// ctBenchTable returns a table of the given capacity holding that many
// IPv4 flows, and their keys.
func ctBenchTable(b *testing.B, flows int, pre ...bool) (*ConnTable, []Key) {
	b.Helper()
	ct := newCT(b, ConnTableConfig{Capacity: flows, Preallocate: len(pre) > 0 && pre[0]})
	keys := make([]Key, 0, flows)
	for i := range flows {
		k := ctBenchKey(uint32(i))
		// A few keys per million may find both buckets full at 100% of
		// Capacity; the benchmark uses the ones stored.
		if ct.Insert(&k, uint32(len(keys)), ClassEstablished, 0).Stored() {
			keys = append(keys, k)
		}
	}
	return ct, keys
}

// ctBenchKey spreads ids over addresses and ports like real client flows
// to one VIP.
func ctBenchKey(id uint32) Key {
	var k Key
	src := [4]byte{198, 18, byte(id >> 16), byte(id >> 8)}
	dst := [4]byte{198, 19, 0, 1}
	k.SetIPv4(42, ProtoTCP, src[:], dst[:], uint16(id)*7+1024, 443)
	return k
}

// ctRand is a tiny per-goroutine xorshift generator for the benchmarks.
type ctRand uint64

func (r *ctRand) next() uint64 {
	x := uint64(*r)
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	*r = ctRand(x)
	return x
}

var ctBenchSeed atomic.Uint64

// BenchmarkConnTable is the data-path mix: 90% Lookup, 10% Insert (of a
// present flow: the table stays at its size), from every P in parallel.
// Time advances one tick every 64 operations per goroutine, as it would per
// batch. It reports the table's memory per flow, for both layouts.
func BenchmarkConnTable(b *testing.B) {
	for _, sz := range ctBenchSizes {
		for _, lay := range ctBenchLayouts {
			b.Run("flows="+sz.name+"/mix=90-10/layout="+lay.name, func(b *testing.B) {
				benchConnTableMix(b, sz.flows, lay.pre)
			})
		}
	}
}

func benchConnTableMix(b *testing.B, flows int, pre bool) {
	ct, keys := ctBenchTable(b, flows, pre)
	n := uint64(len(keys))
	var misses atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := ctRand(ctBenchSeed.Add(0x9e3779b97f4a7c15))
		var ops, miss uint64
		for pb.Next() {
			x := r.next()
			i := (x >> 8) % n
			now := Tick(ops >> 6)
			ops++
			if x&0xff < 26 { // 10%
				ct.Insert(&keys[i], uint32(i), ClassEstablished, now)
			} else if be, _, ok := ct.Lookup(&keys[i], now); !ok {
				miss++ // only if a writer was descheduled mid-write
			} else if be != uint32(i) {
				b.Fatalf("lookup %d: backend %d", i, be)
			}
		}
		misses.Add(miss)
	})
	b.ReportMetric(float64(ct.MemoryBytes())/float64(ct.Len()), "B/flow")
	b.ReportMetric(float64(misses.Load())/float64(b.N), "miss/op")
}

// BenchmarkConnTableOps measures single operations on one goroutine.
func BenchmarkConnTableOps(b *testing.B) {
	for _, sz := range ctBenchSizes {
		ct, keys := ctBenchTable(b, sz.flows)
		n := uint64(len(keys))
		b.Run("flows="+sz.name+"/op=lookup-hit", func(b *testing.B) {
			b.ReportAllocs()
			r := ctRand(1)
			for range b.N {
				i := r.next() % n
				ct.Lookup(&keys[i], 0)
			}
		})
		b.Run("flows="+sz.name+"/op=lookup-miss", func(b *testing.B) {
			b.ReportAllocs()
			r := ctRand(1)
			for range b.N {
				k := ctBenchKey(uint32(n + r.next()%n))
				ct.Lookup(&k, 0)
			}
		})
		b.Run("flows="+sz.name+"/op=update", func(b *testing.B) {
			b.ReportAllocs()
			r := ctRand(1)
			for range b.N {
				i := r.next() % n
				ct.Insert(&keys[i], uint32(i), ClassEstablished, 0)
			}
		})
		b.Run("flows="+sz.name+"/op=delete-insert", func(b *testing.B) {
			b.ReportAllocs()
			r := ctRand(1)
			for range b.N {
				i := r.next() % n
				ct.Delete(&keys[i])
				ct.Insert(&keys[i], uint32(i), ClassEstablished, 0)
			}
		})
		b.Run("flows="+sz.name+"/op=age", func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				ct.Age(0, 1024)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1024, "ns/slot")
		})
	}
}

// BenchmarkConnTableFill measures building a table of n flows from empty,
// to its Capacity, with established flows (none evictable), and reports
// per fill the flows refused and the entries moved to make room.
func BenchmarkConnTableFill(b *testing.B) {
	for _, flows := range []int{1 << 20} {
		keys := make([]Key, flows)
		for i := range keys {
			keys[i] = ctBenchKey(uint32(i))
		}
		for _, lay := range ctBenchLayouts {
			b.Run("flows="+strconv.Itoa(flows)+"/layout="+lay.name, func(b *testing.B) {
				b.ReportAllocs()
				var refused, moves uint64
				for range b.N {
					ct := newCT(b, ConnTableConfig{Capacity: flows, Preallocate: lay.pre})
					for i := range keys {
						ct.Insert(&keys[i], uint32(i), ClassEstablished, 0)
					}
					if ct.Len() < flows*999/1000 {
						b.Fatalf("len %d", ct.Len())
					}
					s := ct.Stats()
					refused += s.Refused
					moves += s.Moves
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(flows), "ns/insert")
				b.ReportMetric(float64(refused)/float64(b.N), "refused/fill")
				b.ReportMetric(float64(moves)/float64(b.N), "moves/fill")
			})
		}
	}
}
