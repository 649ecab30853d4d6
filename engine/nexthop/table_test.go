package nexthop

import (
	"maps"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// randAddr returns a random address of the family, near base: the first
// `fixed` bits are base's, so that prefixes and addresses collide often.
func randAddr(rng *rand.Rand, base netip.Addr, fixed int) netip.Addr {
	b := addrBytes(base)
	n := base.BitLen() / 8
	for i := range n {
		r := byte(rng.Uint32())
		switch {
		case 8*i+8 <= fixed:
		case 8*i >= fixed:
			b[i] = r
		default:
			keep := fixed - 8*i
			mask := byte(0xff) << (8 - keep)
			b[i] = b[i]&mask | r&^mask
		}
	}
	if n == 4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

// TestDestTable checks the persistent hash trie against a map through
// random puts and deletes, and that every published version keeps
// answering as it did when published.
func TestDestTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	b := newDestBuilder()
	oracle := map[[16]byte]*entry{}
	type version struct {
		t    *destTable
		want map[[16]byte]*entry
	}
	var versions []version
	keys := make([][16]byte, 3000)
	for i := range keys {
		if i%2 == 0 {
			keys[i] = randAddr(rng, netip.MustParseAddr("198.18.0.0"), 15).As16()
		} else {
			keys[i] = randAddr(rng, netip.MustParseAddr("2001:db8::"), 32).As16()
		}
	}
	for round := range 40 {
		for range rng.IntN(400) {
			k := keys[rng.IntN(len(keys))]
			if rng.IntN(3) == 0 {
				b.del(k)
				delete(oracle, k)
			} else {
				e := &entry{}
				b.put(k, e)
				oracle[k] = e
			}
		}
		if round%5 == 0 {
			versions = append(versions, version{b.publish(), maps.Clone(oracle)})
		}
	}
	versions = append(versions, version{b.publish(), maps.Clone(oracle)})
	for i, v := range versions {
		require.Equal(t, len(v.want), v.t.n, "version %d", i)
		for _, k := range keys {
			a0, a1 := words(&k)
			require.Same(t, v.want[k], v.t.get(a0, a1), "version %d", i)
		}
		got := map[[16]byte]*entry{}
		v.t.all(func(k [16]byte, e *entry) { got[k] = e })
		require.Equal(t, v.want, got, "version %d", i)
	}
	// Deleting everything leaves an empty table.
	for _, k := range keys {
		b.del(k)
	}
	empty := b.publish()
	assert.Zero(t, empty.n)
	for _, d := range empty.dirs {
		assert.Nil(t, d)
	}
}

// lpmOracle is the longest-prefix match by brute force.
func lpmOracle(ps []prefixEntry, a netip.Addr) *entry {
	var best *entry
	bits := -1
	for _, pe := range ps {
		if pe.p.Contains(a) && pe.p.Bits() > bits {
			best, bits = pe.e, pe.p.Bits()
		}
	}
	return best
}

func lpmFind(t *lpmTable, a netip.Addr) *entry {
	if t == nil {
		return nil
	}
	k := a.As16()
	a0, a1 := words(&k)
	if a.Is4() {
		return t.lookup4(uint32(a1))
	}
	return t.lookup6(a0, a1)
}

func TestLPM(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, fam := range []struct {
		name  string
		base  netip.Addr
		fixed int
	}{
		{"v4", netip.MustParseAddr("198.18.0.0"), 8},
		{"v6", netip.MustParseAddr("2001:db8::"), 16},
	} {
		t.Run(fam.name, func(t *testing.T) {
			for range 50 {
				var ps []prefixEntry
				seen := map[netip.Prefix]bool{}
				for range 1 + rng.IntN(40) {
					a := randAddr(rng, fam.base, fam.fixed)
					p := netip.PrefixFrom(a, rng.IntN(a.BitLen())).Masked() // never full length
					if !seen[p] {
						seen[p] = true
						ps = append(ps, prefixEntry{p, &entry{rep: a}})
					}
				}
				all := append([]prefixEntry(nil), ps...)
				tab := buildLPM(ps)
				for range 2000 {
					var a netip.Addr
					if rng.IntN(2) == 0 { // inside or next to a prefix
						pe := all[rng.IntN(len(all))]
						a = randAddr(rng, pe.p.Addr(), max(0, pe.p.Bits()-rng.IntN(3)))
					} else {
						a = randAddr(rng, fam.base, fam.fixed)
					}
					require.Same(t, lpmOracle(all, a), lpmFind(tab, a), "%v in %v", a, all)
				}
			}
		})
	}
	assert.Nil(t, buildLPM(nil))
	def := &entry{}
	tab := buildLPM([]prefixEntry{{netip.MustParsePrefix("0.0.0.0/0"), def}})
	assert.Same(t, def, lpmFind(tab, netip.MustParseAddr("203.0.113.1")), "the default prefix")
}

// carveOracle returns, by brute force, the shortest prefix length of d at
// least minBits long that no boundary lies strictly inside.
func carveOracle(bs []netip.Prefix, d netip.Addr, minBits int) int {
	for l := minBits; l < d.BitLen(); l++ {
		q := netip.PrefixFrom(d, l).Masked()
		ok := true
		for _, b := range bs {
			if b.Addr().BitLen() == d.BitLen() && b.Bits() > l && q.Contains(b.Addr()) {
				ok = false
				break
			}
		}
		if ok {
			return l
		}
	}
	return d.BitLen()
}

func TestCarve(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, fam := range []struct {
		name  string
		base  netip.Addr
		fixed int
	}{
		{"v4", netip.MustParseAddr("198.18.0.0"), 6},
		{"v6", netip.MustParseAddr("2001:db8::"), 12},
	} {
		t.Run(fam.name, func(t *testing.T) {
			for range 50 {
				var b boundaries
				count := map[netip.Prefix]int{}
				var held []netip.Prefix
				for range rng.IntN(60) {
					a := randAddr(rng, fam.base, fam.fixed)
					p := netip.PrefixFrom(a, rng.IntN(a.BitLen()+1)).Masked()
					b.add(p)
					count[p]++
					held = append(held, p)
				}
				// Take some back, some of them twice (still held once).
				for _, p := range held {
					if rng.IntN(3) == 0 {
						b.remove(p)
						count[p]--
					}
				}
				b.remove(netip.MustParsePrefix("203.0.113.0/24")) // never added: no effect
				var bs []netip.Prefix
				for p, n := range count {
					require.Equal(t, n > 0, b.has(p), p)
					if n > 0 {
						bs = append(bs, p)
					}
				}
				require.Equal(t, len(bs), b.n)
				for range 500 {
					d := randAddr(rng, fam.base, fam.fixed)
					if len(bs) > 0 && rng.IntN(2) == 0 {
						p := bs[rng.IntN(len(bs))]
						d = randAddr(rng, p.Addr(), max(0, p.Bits()-rng.IntN(4)))
					}
					minBits := rng.IntN(fam.fixed + 1)
					require.Equal(t, carveOracle(bs, d, minBits), b.carve(d, minBits), "%v from /%d in %v", d, minBits, bs)
				}
			}
		})
	}
}

// The example of the package documentation: a host with a default route,
// one connected subnet and its own address.
func TestCarveExample(t *testing.T) {
	var b boundaries
	for _, p := range []string{"0.0.0.0/0", "198.18.1.0/24", "198.18.1.5/32", "198.18.1.255/32", "127.0.0.0/8"} {
		b.add(netip.MustParsePrefix(p))
	}
	for _, tc := range []struct{ dst, want string }{
		{"10.1.2.3", "0.0.0.0/2"},         // a quarter of the Internet in one entry
		{"203.0.113.9", "200.0.0.0/5"},    // shares 4 bits with 198.18.1.0/24
		{"198.51.100.1", "198.32.0.0/11"}, // shares 10
		{"198.18.2.1", "198.18.2.0/23"},   // next to the connected subnet
		{"198.19.0.1", "198.19.0.0/16"},   // 198.18.0.0/15 minus 198.18.0.0/16
		{"100.64.0.1", "96.0.0.0/4"},      // 0/1 holds 127/8: cut around it
		{"127.0.0.1", "127.0.0.0/8"},      // inside a boundary: the boundary itself
		{"198.18.1.77", "198.18.1.64/26"}, // inside the subnet, if it were routed
	} {
		d := netip.MustParseAddr(tc.dst)
		got := netip.PrefixFrom(d, b.carve(d, 0)).Masked()
		assert.Equal(t, tc.want, got.String(), tc.dst)
	}
	b.remove(netip.MustParsePrefix("198.18.1.0/24"))
	b.remove(netip.MustParsePrefix("198.18.1.5/32"))
	b.remove(netip.MustParsePrefix("198.18.1.255/32"))
	d := netip.MustParseAddr("198.18.2.1")
	assert.Equal(t, 1, b.carve(d, 0), "removed boundaries no longer cut")
}
