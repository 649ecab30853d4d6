package nexthop

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
)

// hostBoundaries are the route prefixes of a typical host, for IPv4 or
// IPv6: a default route through a gateway, one connected subnet, the
// host's own addresses and the kernel's local-table routes.
func hostBoundaries(v6 bool) []string {
	if v6 {
		return []string{"::/0", "2001:db8:1::/64", "2001:db8:1::5/128", "fe80::/64", "fe80::1234/128", "ff00::/8", "::1/128"}
	}
	return []string{"0.0.0.0/0", "198.18.1.0/24", "198.18.1.5/32", "198.18.1.255/32", "127.0.0.0/8", "127.0.0.1/32", "127.255.255.255/32"}
}

// internetClients returns n distinct random client addresses outside the
// host's own routes, and the prefix entries Run would learn for them
// through the default route (carved around the host's other routes).
func internetClients(n int, v6 bool) ([]netip.Addr, []prefixEntry) {
	rng := rand.New(rand.NewPCG(7, 8))
	var b boundaries
	for _, s := range hostBoundaries(v6) {
		b.add(netip.MustParsePrefix(s))
	}
	hop := &entry{hop: hopResolved, state: stateResolved}
	learned := map[netip.Prefix]*entry{}
	seen := map[netip.Addr]bool{}
	dsts := make([]netip.Addr, 0, n)
	for len(dsts) < n {
		var a netip.Addr
		if v6 {
			var k [16]byte
			for i := range k {
				k[i] = byte(rng.Uint32())
			}
			k[0] = 0x20 | k[0]&0x1f // 2000::/3, the global unicast space
			a = netip.AddrFrom16(k)
		} else {
			a = netip.AddrFrom4([4]byte{byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())})
		}
		bits := b.carve(a, 0)
		if bits >= a.BitLen()-8 || seen[a] {
			continue // on-link or local: not a client behind the gateway
		}
		seen[a] = true
		dsts = append(dsts, a)
		learned[netip.PrefixFrom(a, bits).Masked()] = hop
	}
	var ps []prefixEntry
	for p, e := range learned {
		ps = append(ps, prefixEntry{p, e})
	}
	return dsts, ps
}

// oldSnapshot is the per-destination snapshot this package had before
// prefix entries: one Go map keyed by the 16-byte address, cloned whole on
// every publish. It is kept here as the baseline.
type oldSnapshot struct {
	m   map[[16]byte]*entry
	req chan [16]byte
}

func (s *oldSnapshot) Lookup(dst netip.Addr) (Hop, bool) {
	if !dst.IsValid() {
		return Hop{}, false
	}
	k := dst.As16()
	e := s.m[k]
	if e == nil {
		select {
		case s.req <- k:
		default:
		}
		return Hop{}, false
	}
	if !e.used.Load() {
		e.used.Store(true)
	}
	if e.state != stateResolved {
		return Hop{}, false
	}
	return e.hop, true
}

// BenchmarkLookupMillion looks up a million distinct Internet clients, as
// a Host Agent resolves its replies' destinations: answered by the few
// prefix entries of the default route, by a million entries of their own
// (the per-destination table, as with DisablePrefixCache), and by the
// Go map every snapshot was before.
func BenchmarkLookupMillion(b *testing.B) {
	const n = 1 << 20
	for _, v6 := range []bool{false, true} {
		fam := map[bool]string{false: "v4", true: "v6"}[v6]
		dsts, ps := internetClients(n, v6)
		check := func(b *testing.B, lookup func(netip.Addr) (Hop, bool)) {
			for _, d := range dsts[:1000] {
				if _, ok := lookup(d); !ok {
					b.Fatalf("%v not cached", d)
				}
			}
		}
		b.Run(fam+"/prefix", func(b *testing.B) {
			r := testResolver(b, Config{QueueLen: 1})
			v4, v6t, prefixes := prefixTables(ps)
			r.publish(new(destTable), v4, v6t, prefixes, [3]int{})
			check(b, r.Lookup)
			runtime.GC()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.Lookup(dsts[i&(n-1)])
				i++
			}
			b.ReportMetric(float64(len(prefixes)), "prefixes")
		})
		b.Run(fam+"/per-destination", func(b *testing.B) {
			r := testResolver(b, Config{QueueLen: 1})
			db := newDestBuilder()
			e := &entry{hop: hopResolved, state: stateResolved}
			for _, d := range dsts {
				db.put(d.As16(), e)
			}
			r.publish(db.publish(), nil, nil, nil, [3]int{})
			check(b, r.Lookup)
			runtime.GC()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.Lookup(dsts[i&(n-1)])
				i++
			}
		})
		b.Run(fam+"/map-before", func(b *testing.B) {
			s := &oldSnapshot{m: make(map[[16]byte]*entry, n), req: make(chan [16]byte, 1)}
			e := &entry{hop: hopResolved, state: stateResolved}
			for _, d := range dsts {
				s.m[d.As16()] = e
			}
			check(b, s.Lookup)
			runtime.GC()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s.Lookup(dsts[i&(n-1)])
				i++
			}
		})
	}
}

// BenchmarkPublish measures what publishing one changed destination costs
// with n cached destinations of their own (on-link neighbours, or every
// destination with DisablePrefixCache): a clone of the whole map before,
// a path copy in the destination table now. It also measures rebuilding
// the prefix tables, which happens when a prefix entry changes.
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		keys := make([][16]byte, n)
		for i := range keys {
			keys[i] = netip.AddrFrom4([4]byte{198, 18 + byte(i>>16&1), byte(i >> 8), byte(i)}).As16()
			if i >= 1<<17 {
				keys[i] = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 12: byte(i >> 24), 13: byte(i >> 16), 14: byte(i >> 8), 15: byte(i)}).As16()
			}
		}
		b.Run(fmt.Sprintf("map-clone-before/%d", n), func(b *testing.B) {
			m := make(map[[16]byte]*entry, n)
			for _, k := range keys {
				m[k] = &entry{state: stateResolved}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				m[keys[i%n]] = &entry{state: stateResolved} // the change
				i++
				c := maps.Clone(m) // what every publish did
				var counts [3]int
				for _, e := range c {
					counts[e.state]++
				}
			}
		})
		b.Run(fmt.Sprintf("dest-table/%d", n), func(b *testing.B) {
			r := testResolver(b, Config{})
			db := newDestBuilder()
			for _, k := range keys {
				db.put(k, &entry{state: stateResolved})
			}
			db.publish()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				db.put(keys[i%n], &entry{state: stateResolved})
				i++
				r.publish(db.publish(), nil, nil, nil, [3]int{n})
			}
		})
	}
	for _, v6 := range []bool{false, true} {
		_, ps := internetClients(100_000, v6)
		b.Run(fmt.Sprintf("prefix-tables/v6=%v/%d", v6, len(ps)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				prefixTables(ps)
			}
		})
	}
}
