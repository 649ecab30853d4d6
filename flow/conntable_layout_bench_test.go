package flow

import "testing"

// BenchmarkConnTableLayout compares the two layouts in one process at 1M
// IPv4 flows, looked up at random the way the Mux does (a batch of 64
// queries prepared, then looked up): growing (the default, 524,288
// buckets once grown), preallocated for the same Capacity (367,002
// buckets) and preallocated with as many buckets as the growing table
// (Capacity 1,497,965), to tell the table's size from its layout.
func BenchmarkConnTableLayout(b *testing.B) {
	for _, c := range []struct {
		name string
		cap  int
		pre  bool
	}{{"grow/buckets=524288", 1 << 20, false}, {"prealloc/buckets=367002", 1 << 20, true}, {"prealloc/buckets=524288", 1497965, true}} {
		b.Run("layout="+c.name, func(b *testing.B) {
			ct := newCT(b, ConnTableConfig{Capacity: c.cap, Preallocate: c.pre})
			n := 1 << 20
			keys := make([]Key, 0, n)
			for i := range n {
				k := ctBenchKey(uint32(i))
				if ct.Insert(&k, uint32(len(keys)), ClassEstablished, 0).Stored() {
					keys = append(keys, k)
				}
			}
			const batch = 64
			var qs [batch]ConnQuery
			r := ctRand(12345)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				var idx [batch]uint64
				for j := range batch {
					idx[j] = (r.next() >> 8) % uint64(len(keys))
					ct.Prepare(&qs[j], &keys[idx[j]])
				}
				for j := range batch {
					if be, _, ok := ct.LookupPrepared(&qs[j], 1); !ok || be != uint32(idx[j]) {
						b.Fatal("miss")
					}
				}
			}
		})
	}
}
