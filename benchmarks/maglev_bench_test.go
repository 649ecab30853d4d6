package benchmarks

import (
	"fmt"
	"testing"

	"github.com/dchest/siphash"
	"github.com/kkdai/maglev"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/flow/flowtest"
)

// maglevSizes are the backend counts of the Maglev benchmarks; the table
// has flow.MaglevDefaultSize (65537) slots, kkdai/maglev's own size.
var maglevSizes = []int{10, 100, 1000}

func ourMaglevInput(names []string) []flow.MaglevBackend {
	mb := make([]flow.MaglevBackend, len(names))
	for i, n := range names {
		mb[i] = flow.MaglevBackend{Name: n, Weight: 1}
	}
	return mb
}

var (
	maglevSink *flow.Maglev
	peerSink   *maglev.Maglev
	intSink    int
	u64Sink    uint64
	strSink    string
)

// BenchmarkMaglevBuild builds a table of 65537 slots over n backends: ours
// with flow.NewMaglev, the peer with kkdai/maglev's NewMaglev. One op is
// one build. kkdai/maglev keeps every backend's full permutation (8 bytes
// per slot per backend: 524 MB at 1000 backends) and takes seconds there;
// that case is skipped with -short.
func BenchmarkMaglevBuild(b *testing.B) {
	for _, n := range maglevSizes {
		names := backendNames(n)
		group := fmt.Sprintf("build/%d", n)
		b.Run(fmt.Sprintf("backends=%d/impl=xdplb", n), func(b *testing.B) {
			in := ourMaglevInput(names)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				m, err := flow.NewMaglev(in, flow.MaglevDefaultSize)
				if err != nil {
					b.Fatal(err)
				}
				maglevSink = m
			}
			recordOurs(group, nsPer(b, b.N))
		})
		b.Run(fmt.Sprintf("backends=%d/impl=kkdai", n), func(b *testing.B) {
			if n >= 1000 && testing.Short() {
				b.Skip("kkdai/maglev needs seconds and 0.5 GB for 1000 backends; skipped with -short")
			}
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				m, err := maglev.NewMaglev(names, flow.MaglevDefaultSize)
				if err != nil {
					b.Fatal(err)
				}
				peerSink = m
			}
			peerSink = nil
			reportPeer(b, group, nsPer(b, b.N))
		})
	}
}

// maglevKeys is the number of distinct flows the lookup benchmarks cycle
// through (the keys stay in cache; the 65537-slot table, 128 KB for ours
// and 512 KB for kkdai's, mostly in L2).
const maglevKeys = 4096

// BenchmarkMaglevLookup picks a backend for a flow, with a table of 65537
// slots over n backends. One op is one flow.
//
//   - op=hash+lookup is what a balancer does for a new flow. Ours:
//     Hasher.Hash over the flow.Key then Maglev.Lookup. The peer: Get on
//     the flow's 13-byte 5-tuple string (SipHash-2-4, a read lock, a
//     modulo, and the name of the backend), the string built beforehand.
//   - op=hash is the hash alone: our Hasher.Hash, and the peer's SipHash
//     of the same string (siphash.Hash with kkdai/maglev's key), so the
//     peer's table lookup can be read as the difference.
//   - op=lookup is our table lookup alone, from precomputed hashes; the
//     peer does not expose one.
func BenchmarkMaglevLookup(b *testing.B) {
	ts := genFlows(maglevKeys, flowtest.Mix{flowtest.TCP4: 100}, 2)
	keys := make([]flow.Key, len(ts))
	strs := make([]string, len(ts))
	var buf [40]byte
	for i, f := range ts {
		keys[i] = targets.Key(f)
		strs[i] = string([]byte(peerKey(&keys[i], &buf)))
	}
	h := flow.NewHasher(0x5eed)
	hashes := make([]uint64, len(keys))
	for i := range keys {
		hashes[i] = h.Hash(&keys[i], flow.Tuple5)
	}
	for _, n := range maglevSizes {
		names := backendNames(n)
		ours, err := flow.NewMaglev(ourMaglevInput(names), flow.MaglevDefaultSize)
		if err != nil {
			b.Fatal(err)
		}
		var peer *maglev.Maglev
		peerTable := func(b *testing.B) *maglev.Maglev {
			if n >= 1000 && testing.Short() {
				b.Skip("kkdai/maglev needs seconds and 0.5 GB for 1000 backends; skipped with -short")
			}
			if peer == nil {
				if peer, err = maglev.NewMaglev(names, flow.MaglevDefaultSize); err != nil {
					b.Fatal(err)
				}
			}
			return peer
		}
		group := fmt.Sprintf("lookup/%d", n)
		b.Run(fmt.Sprintf("backends=%d/op=hash+lookup/impl=xdplb", n), func(b *testing.B) {
			b.ReportAllocs()
			s := 0
			for i := 0; i < b.N; i++ {
				s += ours.Lookup(h.Hash(&keys[i%maglevKeys], flow.Tuple5))
			}
			intSink = s
			recordOurs(group, nsPer(b, b.N))
		})
		b.Run(fmt.Sprintf("backends=%d/op=hash+lookup/impl=kkdai", n), func(b *testing.B) {
			p := peerTable(b)
			b.ReportAllocs()
			b.ResetTimer()
			var name string
			for i := 0; i < b.N; i++ {
				name, _ = p.Get(strs[i%maglevKeys])
			}
			strSink = name
			reportPeer(b, group, nsPer(b, b.N))
		})
		hgroup := fmt.Sprintf("hash/%d", n)
		b.Run(fmt.Sprintf("backends=%d/op=hash/impl=xdplb", n), func(b *testing.B) {
			b.ReportAllocs()
			var s uint64
			for i := 0; i < b.N; i++ {
				s += h.Hash(&keys[i%maglevKeys], flow.Tuple5)
			}
			u64Sink = s
			recordOurs(hgroup, nsPer(b, b.N))
		})
		b.Run(fmt.Sprintf("backends=%d/op=hash/impl=kkdai", n), func(b *testing.B) {
			b.ReportAllocs()
			var s uint64
			for i := 0; i < b.N; i++ {
				s += siphash.Hash(0xdeadbabe, 0, []byte(strs[i%maglevKeys]))
			}
			u64Sink = s
			reportPeer(b, hgroup, nsPer(b, b.N))
		})
		b.Run(fmt.Sprintf("backends=%d/op=lookup/impl=xdplb", n), func(b *testing.B) {
			b.ReportAllocs()
			s := 0
			for i := 0; i < b.N; i++ {
				s += ours.Lookup(hashes[i%maglevKeys])
			}
			intSink = s
		})
		peer = nil
	}
}
