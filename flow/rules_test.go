package flow

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	ap   = netip.MustParseAddrPort
	addr = netip.MustParseAddr
)

// pool returns n active backends of weight 1 in 198.18.100.0/24, hosts in
// 198.18.200.0/24.
func pool(n int) []Backend {
	bs := make([]Backend, n)
	for i := range bs {
		a := netip.AddrFrom4([4]byte{198, 18, 100, byte(i + 1)})
		bs[i] = Backend{
			Name:   a.String() + ":8080",
			Addr:   a,
			Port:   8080,
			MAC:    [6]byte{0x02, 0, 0, 0, 0, byte(i + 1)},
			Host:   netip.AddrFrom4([4]byte{198, 18, 200, byte(i + 1)}),
			Weight: 1,
		}
	}
	return bs
}

func rule(name string, vni uint32, proto uint8, vip string, backends []Backend) Rule {
	a := ap(vip)
	return Rule{Name: name, VIP: VIP{Addr: a.Addr(), Proto: proto, Port: a.Port(), VNI: vni}, Backends: backends}
}

// testRules is a small but complete configuration: exact ports, all-port
// fallbacks, two tenants with the same address, both families.
func testRules() []Rule {
	return []Rule{
		rule("web", 0, ProtoTCP, "198.18.0.10:80", pool(3)),
		rule("web-any", 0, ProtoTCP, "198.18.0.10:0", pool(2)),
		rule("tenant5-web", 5, ProtoTCP, "198.18.0.10:80", pool(4)),
		rule("dns", 0, ProtoUDP, "198.18.0.10:53", pool(2)),
		rule("web6", 0, ProtoTCP, "[2001:db8::10]:443", pool(3)),
		rule("udp6-any", 0, ProtoUDP, "[2001:db8::10]:0", pool(1)),
		rule("mapped", 0, ProtoTCP, "[::ffff:198.18.0.20]:80", pool(1)),
	}
}

func TestSnapshotLookup(t *testing.T) {
	s, err := NewSnapshot(1, testRules(), nil)
	require.NoError(t, err)
	require.Equal(t, 7, s.Len())
	client4, client6 := ap("198.18.50.1:40000"), ap("[2001:db8:50::1]:40000")
	tests := []struct {
		name  string
		vni   uint32
		proto uint8
		src   netip.AddrPort
		dst   string
		want  string // rule name, "" for no rule
	}{
		{"exact port", 0, ProtoTCP, client4, "198.18.0.10:80", "web"},
		{"all-ports fallback", 0, ProtoTCP, client4, "198.18.0.10:8443", "web-any"},
		{"packet to port 0 hits all-ports rule", 0, ProtoTCP, client4, "198.18.0.10:0", "web-any"},
		{"other tenant, same address", 5, ProtoTCP, client4, "198.18.0.10:80", "tenant5-web"},
		{"other tenant has no all-ports rule", 5, ProtoTCP, client4, "198.18.0.10:81", ""},
		{"unknown tenant", 6, ProtoTCP, client4, "198.18.0.10:80", ""},
		{"udp exact", 0, ProtoUDP, client4, "198.18.0.10:53", "dns"},
		{"udp other port: no udp fallback", 0, ProtoUDP, client4, "198.18.0.10:54", ""},
		{"icmp", 0, ProtoICMP, client4, "198.18.0.10:0", ""},
		{"v6 exact", 0, ProtoTCP, client6, "[2001:db8::10]:443", "web6"},
		{"v6 tcp other port", 0, ProtoTCP, client6, "[2001:db8::10]:80", ""},
		{"v6 udp fallback", 0, ProtoUDP, client6, "[2001:db8::10]:9999", "udp6-any"},
		{"mapped VIP is matched as IPv4", 0, ProtoTCP, client4, "198.18.0.20:80", "mapped"},
		{"miss other address", 0, ProtoTCP, client4, "198.18.0.11:80", ""},
		// An IPv6 address whose first four bytes spell the IPv4 VIP.
		{"v6 lookalike of a v4 VIP", 0, ProtoTCP, client6, "[c612:a::]:80", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := KeyFrom(tt.vni, tt.proto, tt.src, ap(tt.dst))
			r := s.Lookup(&k)
			if tt.want == "" {
				assert.Nil(t, r)
				return
			}
			require.NotNil(t, r)
			assert.Equal(t, tt.want, r.Name)
			assert.Same(t, r, s.Rule(r.ID))
		})
	}
	assert.Nil(t, s.Rule(7))
	assert.Nil(t, s.Rule(1<<31))
	for i, r := range s.Rules() {
		assert.Equal(t, uint32(i), r.ID)
		assert.Same(t, r, s.LookupVIP(r.VIP))
	}
	assert.Same(t, s.Rules()[6], s.LookupVIP(VIP{Addr: addr("::ffff:198.18.0.20"), Proto: ProtoTCP, Port: 80}))

	// The empty snapshot matches nothing.
	k := KeyFrom(0, ProtoTCP, client4, ap("198.18.0.10:80"))
	assert.Nil(t, NewRules().Load().Lookup(&k))
	empty, err := NewSnapshot(3, nil, nil)
	require.NoError(t, err)
	assert.Nil(t, empty.Lookup(&k))
	assert.Nil(t, empty.LookupVIP(VIP{}))
	assert.Zero(t, empty.Len())
}

// TestSnapshotLookupMany checks the VIP index against a map over many
// rules (collisions, probing, wrap-around).
func TestSnapshotLookupMany(t *testing.T) {
	var rules []Rule
	for i := 0; i < 3000; i++ {
		a := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		rules = append(rules, Rule{Name: fmt.Sprint(i), VIP: VIP{Addr: a, Proto: ProtoTCP, Port: uint16(80 + i%3), VNI: uint32(i % 7)}, Backends: pool(1), TableSize: 13})
	}
	s, err := NewSnapshot(1, rules, nil)
	require.NoError(t, err)
	for i := 0; i < 3000; i++ {
		for port := uint16(79); port <= 83; port++ {
			a := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
			k := KeyFrom(uint32(i%7), ProtoTCP, ap("198.19.0.1:1000"), netip.AddrPortFrom(a, port))
			r := s.Lookup(&k)
			if port == uint16(80+i%3) {
				require.NotNil(t, r, "rule %d", i)
				require.Equal(t, fmt.Sprint(i), r.Name)
			} else {
				require.Nil(t, r)
			}
		}
	}
}

func TestSnapshotValidation(t *testing.T) {
	mod := func(f func(rs []Rule)) []Rule { rs := testRules(); f(rs); return rs }
	tests := []struct {
		name  string
		rules []Rule
		ok    bool
	}{
		{"valid", testRules(), true},
		{"duplicate VIP", mod(func(rs []Rule) { rs[3].VIP = rs[0].VIP }), false},
		{"duplicate VIP via mapped address", append(testRules(), rule("dup", 0, ProtoTCP, "[::ffff:198.18.0.10]:80", pool(1))), false},
		{"duplicate all-ports VIP", append(testRules(), rule("dup", 0, ProtoTCP, "198.18.0.10:0", pool(1))), false},
		{"same VIP other tenant", append(testRules(), rule("t9", 9, ProtoTCP, "198.18.0.10:80", pool(1))), true},
		{"VNI over 24 bits", mod(func(rs []Rule) { rs[0].VIP.VNI = 1 << 24 }), false},
		{"VNI max", mod(func(rs []Rule) { rs[0].VIP.VNI = 1<<24 - 1 }), true},
		{"no VIP address", mod(func(rs []Rule) { rs[0].VIP.Addr = netip.Addr{} }), false},
		{"zoned VIP", mod(func(rs []Rule) { rs[4].VIP.Addr = rs[4].VIP.Addr.WithZone("eth0") }), false},
		{"no protocol", mod(func(rs []Rule) { rs[0].VIP.Proto = 0 }), false},
		{"bad mode", mod(func(rs []Rule) { rs[0].Mode = 7 }), false},
		{"duplicate backend name", mod(func(rs []Rule) { rs[0].Backends[2].Name = rs[0].Backends[0].Name }), false},
		{"empty backend name", mod(func(rs []Rule) { rs[0].Backends[1].Name = "" }), false},
		{"backend without address", mod(func(rs []Rule) { rs[0].Backends[1].Addr = netip.Addr{} }), false},
		{"bad backend state", mod(func(rs []Rule) { rs[0].Backends[1].State = 9 }), false},
		{"v6 backends behind v4 VIP", mod(func(rs []Rule) {
			rs[0].Backends[0].Addr, rs[0].Backends[0].Host = addr("2001:db8:100::1"), addr("2001:db8:200::1")
		}), true},
		{"no backends", mod(func(rs []Rule) { rs[0].Backends = nil }), true},
		{"table size not prime", mod(func(rs []Rule) { rs[0].TableSize = 1000 }), false},
		{"table size too small", mod(func(rs []Rule) { rs[0].TableSize = 2 }), false},
		{"small table", mod(func(rs []Rule) { rs[0].TableSize = 251 }), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewSnapshot(1, tt.rules, nil)
			if tt.ok {
				require.NoError(t, err)
				require.NotNil(t, s)
				return
			}
			require.ErrorIs(t, err, ErrInvalidRule)
			assert.Nil(t, s)
			t.Log(err)
		})
	}
}

func TestSnapshotCopiesInput(t *testing.T) {
	rs := testRules()
	bs := pool(3)
	bs[0], bs[2] = bs[2], bs[0] // out of name order
	rs[0].Backends = bs
	s, err := NewSnapshot(1, rs, nil)
	require.NoError(t, err)
	r := s.Rule(0)
	// Sorted by name, independent of the caller's slice.
	assert.Equal(t, []string{"198.18.100.1:8080", "198.18.100.2:8080", "198.18.100.3:8080"},
		[]string{r.Backends[0].Name, r.Backends[1].Name, r.Backends[2].Name})
	bs[0].Name, rs[0].Name = "changed", "changed"
	assert.Equal(t, "web", r.Name)
	assert.Equal(t, "198.18.100.1:8080", r.Backends[0].Name)
}

func TestRulePick(t *testing.T) {
	bs := pool(6)
	bs[1].State = BackendDraining
	bs[2].State = BackendDown
	bs[3].Weight = 0
	bs[5].Weight = 3
	s, err := NewSnapshot(1, []Rule{rule("r", 0, ProtoTCP, "198.18.0.10:80", bs)}, nil)
	require.NoError(t, err)
	r := s.Rule(0)
	counts := make([]int, len(bs))
	h := NewHasher(1)
	for i := 0; i < 60000; i++ {
		k := KeyFrom(0, ProtoTCP, netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}), uint16(i)), ap("198.18.0.10:80"))
		idx, ok := r.Pick(h.Hash(&k, r.Mode))
		require.True(t, ok)
		counts[idx]++
	}
	assert.Zero(t, counts[1], "draining")
	assert.Zero(t, counts[2], "down")
	assert.Zero(t, counts[3], "weight 0")
	// Weights 1 (b0), 1 (b4), 3 (b5) of 5: 12000, 12000, 36000 expected.
	assert.InEpsilon(t, 12000, counts[0], 0.05)
	assert.InEpsilon(t, 12000, counts[4], 0.05)
	assert.InEpsilon(t, 36000, counts[5], 0.05)
	for _, i := range []int{1, 2, 3} {
		assert.Zero(t, r.Maglev().Slots(i), "backend %d owns no slot", i)
	}

	// Nothing active: no pick.
	for i := range bs {
		bs[i].State = BackendDown
	}
	s, err = NewSnapshot(2, []Rule{rule("r", 0, ProtoTCP, "198.18.0.10:80", bs), rule("none", 0, ProtoTCP, "198.18.0.11:80", nil)}, nil)
	require.NoError(t, err)
	for _, r := range s.Rules() {
		idx, ok := r.Pick(12345)
		assert.False(t, ok)
		assert.Equal(t, -1, idx)
	}
	// A rule not built by a snapshot has no table.
	var bare Rule
	_, ok := bare.Pick(1)
	assert.False(t, ok)
	assert.Nil(t, bare.Maglev())
}

// TestSnapshotReuse checks that an update rebuilds only the Maglev tables
// whose inputs changed (pointer equality).
func TestSnapshotReuse(t *testing.T) {
	rs := NewRules()
	base := []Rule{
		rule("a", 0, ProtoTCP, "198.18.0.1:80", pool(5)),
		rule("b", 0, ProtoTCP, "198.18.0.2:80", pool(5)),
		rule("c", 0, ProtoTCP, "198.18.0.3:80", pool(5)),
		rule("d", 0, ProtoTCP, "198.18.0.4:80", pool(5)),
		rule("e", 0, ProtoTCP, "198.18.0.5:80", pool(5)),
		rule("f", 0, ProtoTCP, "198.18.0.6:80", pool(5)),
		rule("g", 0, ProtoTCP, "198.18.0.7:80", pool(5)),
	}
	base[3].Backends[2].State = BackendDraining
	s1, err := rs.Update(1, base)
	require.NoError(t, err)

	next := make([]Rule, len(base))
	for i := range base {
		next[i] = base[i]
		next[i].Backends = pool(5)
	}
	next[3].Backends[2].State = BackendDraining
	// a: unchanged but backends given in another order → reused.
	next[0].Backends[0], next[0].Backends[4] = next[0].Backends[4], next[0].Backends[0]
	// b: weight change → rebuilt.
	next[1].Backends[1].Weight = 2
	// c: a backend goes down → rebuilt.
	next[2].Backends[0].State = BackendDown
	// d: draining → down: effective weight 0 either way → reused.
	next[3].Backends[2].State = BackendDown
	// e: backend's address, MAC and host change, not its name → reused,
	// and picks see the new values.
	next[4].Backends[0].Addr = addr("198.18.150.1")
	next[4].Backends[0].MAC[0] = 0x0a
	// f: rule renamed and mode changed, same VIP → reused.
	next[5].Name, next[5].Mode = "f2", Tuple3
	// g: VIP port changes → a different VIP → rebuilt.
	next[6].VIP.Port = 8080
	// h: new rule.
	next = append(next, rule("h", 0, ProtoTCP, "198.18.0.8:80", pool(5)))

	s2, err := rs.Update(2, next)
	require.NoError(t, err)
	same := func(i int) bool { return s1.Rule(uint32(i)).Maglev() == s2.Rule(uint32(i)).Maglev() }
	assert.True(t, same(0), "a: reordered backends")
	assert.False(t, same(1), "b: weight")
	assert.False(t, same(2), "c: down")
	assert.True(t, same(3), "d: draining→down")
	assert.True(t, same(4), "e: non-identity fields")
	assert.True(t, same(5), "f: name and mode")
	assert.False(t, same(6), "g: VIP")
	assert.Equal(t, addr("198.18.150.1"), s2.Rule(4).Backends[0].Addr)
	assert.Equal(t, byte(0x0a), s2.Rule(4).Backends[0].MAC[0])

	// Reused and rebuilt tables agree with a build from scratch.
	fresh, err := NewSnapshot(2, next, nil)
	require.NoError(t, err)
	for i, r := range s2.Rules() {
		assert.Equal(t, fresh.Rule(uint32(i)).Maglev().Fingerprint(), r.Maglev().Fingerprint(), "rule %d", i)
	}
}

func TestRulesVersions(t *testing.T) {
	rs := NewRules()
	s0 := rs.Load()
	require.NotNil(t, s0)
	assert.Zero(t, s0.Version)
	assert.Zero(t, s0.Len())
	var zero Rules // the zero value works too
	assert.Same(t, s0, zero.Load())

	_, err := rs.Update(0, testRules())
	assert.ErrorIs(t, err, ErrStaleVersion, "version 0 is the empty snapshot")
	s1, err := rs.Update(1, testRules())
	require.NoError(t, err)
	assert.Same(t, s1, rs.Load())
	_, err = rs.Update(1, testRules())
	assert.ErrorIs(t, err, ErrStaleVersion, "same version twice")
	s5, err := rs.Update(5, testRules()[:2])
	require.NoError(t, err, "versions may skip")
	assert.Equal(t, uint64(5), rs.Load().Version)
	_, err = rs.Update(3, testRules())
	assert.ErrorIs(t, err, ErrStaleVersion, "older")

	// An invalid configuration is not applied at all.
	bad := testRules()
	bad[6].VIP.VNI = 1 << 30
	_, err = rs.Update(6, bad)
	assert.ErrorIs(t, err, ErrInvalidRule)
	assert.Same(t, s5, rs.Load())

	// Store accepts any version: rollback is explicit.
	rs.Store(s1)
	assert.Same(t, s1, rs.Load())
	rs.Store(nil)
	assert.Zero(t, rs.Load().Version)
}

// TestRulesConcurrent runs readers (Load, Lookup, Pick) against a writer
// publishing new versions; under -race it proves the publication is safe,
// and each reader checks it never sees versions go backwards nor a
// snapshot whose content disagrees with its version.
func TestRulesConcurrent(t *testing.T) {
	rs := NewRules()
	const versions = 40
	config := func(v uint64) []Rule {
		r := rule(fmt.Sprint(v), 0, ProtoTCP, "198.18.0.10:80", pool(1+int(v%4)))
		r.TableSize = 251
		return []Rule{r, rule("any", 0, ProtoTCP, "198.18.0.10:0", pool(2))}
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := NewHasher(uint64(w))
			last := uint64(0)
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				s := rs.Load()
				if s.Version < last {
					t.Errorf("version went back from %d to %d", last, s.Version)
					return
				}
				last = s.Version
				k := KeyFrom(0, ProtoTCP, netip.AddrPortFrom(addr("198.19.0.1"), uint16(i)), ap("198.18.0.10:80"))
				r := s.Lookup(&k)
				if s.Version == 0 {
					if r != nil {
						t.Error("empty snapshot matched")
					}
					continue
				}
				if r == nil || r.Name != fmt.Sprint(s.Version) {
					t.Errorf("version %d: got rule %v", s.Version, r)
					return
				}
				if idx, ok := r.Pick(h.Hash(&k, r.Mode)); !ok || idx >= len(r.Backends) {
					t.Errorf("version %d: pick %d %v", s.Version, idx, ok)
					return
				}
			}
		}()
	}
	for v := uint64(1); v <= versions; v++ {
		_, err := rs.Update(v, config(v))
		require.NoError(t, err)
	}
	close(done)
	wg.Wait()
	assert.Equal(t, uint64(versions), rs.Load().Version)
}

func TestRulesNoAllocs(t *testing.T) {
	rs := NewRules()
	_, err := rs.Update(1, testRules())
	require.NoError(t, err)
	s := rs.Load()
	hit := KeyFrom(0, ProtoTCP, ap("198.18.50.1:40000"), ap("198.18.0.10:80"))
	fallback := KeyFrom(0, ProtoTCP, ap("198.18.50.1:40000"), ap("198.18.0.10:8080"))
	miss := KeyFrom(0, ProtoTCP, ap("198.18.50.1:40000"), ap("198.18.0.99:80"))
	r := s.Lookup(&hit)
	var sink int
	tests := map[string]func(){
		"Load":            func() { sink += int(rs.Load().Version) },
		"Lookup hit":      func() { sink += int(s.Lookup(&hit).ID) },
		"Lookup fallback": func() { sink += int(s.Lookup(&fallback).ID) },
		"Lookup miss": func() {
			if s.Lookup(&miss) == nil {
				sink++
			}
		},
		"Pick": func() { i, _ := r.Pick(uint64(sink) * 0x9e3779b97f4a7c15); sink += i },
	}
	for name, f := range tests {
		assert.Zero(t, testing.AllocsPerRun(1000, f), name)
	}
}

// mapIndex is the obvious alternative to the snapshot's open-addressing
// index, for BenchmarkSnapshotLookup.
type mapKey struct {
	addr   [16]byte
	vni    uint32
	port   uint16
	proto  uint8
	family uint8
}

func BenchmarkSnapshotLookup(b *testing.B) {
	for _, n := range []int{4, 100, 10000} {
		var rules []Rule
		for i := 0; i < n; i++ {
			a := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
			rules = append(rules, Rule{Name: fmt.Sprint(i), VIP: VIP{Addr: a, Proto: ProtoTCP, Port: 443}, Backends: pool(1), TableSize: 251})
		}
		s, err := NewSnapshot(1, rules, nil)
		require.NoError(b, err)
		m := make(map[mapKey]*Rule, n)
		for _, r := range s.Rules() {
			var k mapKey
			a4 := r.VIP.Addr.As4()
			copy(k.addr[:], a4[:])
			k.vni, k.port, k.proto, k.family = r.VIP.VNI, r.VIP.Port, r.VIP.Proto, FamilyIPv4
			m[k] = r
		}
		keys := make([]Key, 1024)
		for i := range keys {
			j := (i * 7919) % n
			keys[i] = KeyFrom(0, ProtoTCP, ap("198.19.0.1:1000"), netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(j >> 8), byte(j)}), 443))
		}
		b.Run(fmt.Sprintf("index/rules=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if s.Lookup(&keys[i&1023]) == nil {
					b.Fatal("miss")
				}
			}
		})
		b.Run(fmt.Sprintf("map/rules=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				k := &keys[i&1023]
				mk := mapKey{addr: k.Dst, vni: k.VNI, port: k.DstPort, proto: k.Proto, family: k.Family}
				if m[mk] == nil {
					b.Fatal("miss")
				}
			}
		})
		miss := keys[0]
		binary.BigEndian.PutUint16(miss.Dst[2:], 0xffff)
		b.Run(fmt.Sprintf("index-miss/rules=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if s.Lookup(&miss) != nil {
					b.Fatal("hit")
				}
			}
		})
	}
}

func BenchmarkRulePick(b *testing.B) {
	s, err := NewSnapshot(1, []Rule{rule("r", 0, ProtoTCP, "198.18.0.10:80", pool(100))}, nil)
	require.NoError(b, err)
	r := s.Rule(0)
	b.ReportAllocs()
	h := uint64(1)
	for b.Loop() {
		h = h*0x9e3779b97f4a7c15 + 1
		i, _ := r.Pick(h)
		lookupSink += i
	}
}

func TestBackendIDsSurviveReload(t *testing.T) {
	vip := VIP{Addr: netip.MustParseAddr("198.18.10.1"), Proto: ProtoTCP, Port: 80}
	vip2 := VIP{Addr: netip.MustParseAddr("198.18.10.2"), Proto: ProtoTCP, Port: 80}
	be := func(names ...string) []Backend {
		var bs []Backend
		for i, n := range names {
			bs = append(bs, Backend{Name: n, Addr: netip.AddrFrom4([4]byte{198, 19, 0, byte(i + 1)}), Weight: 1})
		}
		return bs
	}
	var rs Rules
	s1, err := rs.Update(1, []Rule{{Name: "a", VIP: vip, Backends: be("b1", "b2", "b3")}, {Name: "b", VIP: vip2, Backends: be("b1")}})
	require.NoError(t, err)
	ids := map[string]uint32{}
	seen := map[uint32]bool{}
	for _, r := range s1.Rules() {
		for i, b := range r.Backends {
			require.NotZero(t, b.ID)
			require.False(t, seen[b.ID], "IDs are unique across rules")
			seen[b.ID] = true
			ids[r.Name+"/"+b.Name] = b.ID
			gr, gi, ok := s1.Backend(b.ID)
			require.True(t, ok)
			require.Same(t, r, gr)
			require.Equal(t, i, gi)
		}
	}
	// Reload: b2 removed, b0 added (sorts first, shifting indices), rule b
	// unchanged but listed first.
	s2, err := rs.Update(2, []Rule{{Name: "b", VIP: vip2, Backends: be("b1")}, {Name: "a", VIP: vip, Backends: be("b3", "b0", "b1")}})
	require.NoError(t, err)
	ra := s2.LookupVIP(vip)
	for i, b := range ra.Backends {
		if old, ok := ids["a/"+b.Name]; ok {
			require.Equal(t, old, b.ID, "backend %s keeps its ID", b.Name)
		} else {
			require.False(t, seen[b.ID], "a new backend gets a new ID")
		}
		gr, gi, ok := s2.Backend(b.ID)
		require.True(t, ok)
		require.Same(t, ra, gr)
		require.Equal(t, i, gi)
	}
	require.Equal(t, ids["b/b1"], s2.LookupVIP(vip2).Backends[0].ID)
	_, _, ok := s2.Backend(ids["a/b2"])
	require.False(t, ok, "a removed backend's ID is gone")
	_, _, ok = s2.Backend(0)
	require.False(t, ok)
	require.Zero(t, testing.AllocsPerRun(100, func() { _, _, _ = s2.Backend(ids["a/b1"]) }))
}

// BenchmarkSnapshotBackend measures Backend, the per-packet lookup of a
// connection table's backend ID, over 10k rules of 10 backends, IDs in a
// scattered order.
func BenchmarkSnapshotBackend(b *testing.B) {
	var rules []Rule
	for i := range 10_000 {
		a := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		rules = append(rules, Rule{Name: fmt.Sprint(i), VIP: VIP{Addr: a, Proto: ProtoTCP, Port: 443}, Backends: pool(10), TableSize: 1021})
	}
	s, err := NewSnapshot(1, rules, nil)
	require.NoError(b, err)
	ids := make([]uint32, 4096)
	for i := range ids {
		ids[i] = uint32(1 + (i*7919)%100_000)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, _, ok := s.Backend(ids[i&4095]); !ok {
			b.Fatal("miss")
		}
	}
}
