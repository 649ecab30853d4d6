package flow

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requireSameSnapshot checks that got serves exactly what want serves:
// version, rules (name, VIP, mode, backends with their IDs and states,
// Maglev table size and content), VIP lookups and backend IDs.
func requireSameSnapshot(t *testing.T, want, got *Snapshot) {
	t.Helper()
	require.Equal(t, want.Version, got.Version)
	require.Equal(t, want.Len(), got.Len())
	for i, w := range want.Rules() {
		g := got.Rule(uint32(i))
		require.Equal(t, w.Name, g.Name)
		require.Equal(t, w.VIP, g.VIP)
		require.Equal(t, w.Mode, g.Mode)
		require.Equal(t, w.ID, g.ID)
		require.Equal(t, w.Backends, g.Backends, "rule %q", w.Name)
		require.Equal(t, w.Maglev().Size(), g.Maglev().Size(), "rule %q", w.Name)
		require.Equal(t, w.Maglev().Fingerprint(), g.Maglev().Fingerprint(), "rule %q", w.Name)
		require.Same(t, g, got.LookupVIP(g.VIP), "the index finds the rule of this snapshot")
		for j, b := range g.Backends {
			r, idx, ok := got.Backend(b.ID)
			require.True(t, ok, "backend %q of %q", b.Name, g.Name)
			require.Same(t, g, r, "backend %q of %q resolves to this snapshot's rule", b.Name, g.Name)
			require.Equal(t, j, idx)
		}
	}
	for _, k := range []*Key{
		testKey(ProtoTCP, "198.18.0.10", 80, 0),
		testKey(ProtoTCP, "198.18.0.10", 8080, 0),
		testKey(ProtoTCP, "198.18.0.10", 80, 5),
		testKey(ProtoUDP, "198.18.0.10", 53, 0),
	} {
		w, g := want.Lookup(k), got.Lookup(k)
		if w == nil {
			require.Nil(t, g)
			continue
		}
		require.Equal(t, w.ID, g.ID)
	}
}

func testKey(proto uint8, dst string, port uint16, vni uint32) *Key {
	var k Key
	a := addr(dst).As4()
	copy(k.Dst[:], a[:])
	k.Family, k.Proto, k.DstPort, k.VNI = FamilyIPv4, proto, port, vni
	return &k
}

// TestReplaceRules: replacing some rules gives the snapshot NewSnapshot
// builds from all of them, shares what it did not replace, and leaves the
// old snapshot as it was.
func TestReplaceRules(t *testing.T) {
	tests := []struct {
		name    string
		change  func(rs []Rule) []int // edits rs, returns the indices it changed
		rebuilt []int                 // rules whose table must be new
	}{
		{"nothing", func(rs []Rule) []int { return nil }, nil},
		{"one backend down", func(rs []Rule) []int {
			rs[0].Backends[1].State = BackendDown
			return []int{0}
		}, []int{0}},
		{"states in three rules", func(rs []Rule) []int {
			rs[0].Backends[0].State = BackendDown
			rs[2].Backends[3].State = BackendDraining
			rs[4].Backends[2].State = BackendDown
			return []int{0, 2, 4}
		}, []int{0, 2, 4}},
		{"replaced but equal", func(rs []Rule) []int { return []int{1, 3} }, nil},
		{"weight and address", func(rs []Rule) []int {
			rs[3].Backends[0].Weight = 3
			rs[5].Backends[0].Addr = addr("198.18.150.1")
			return []int{3, 5}
		}, []int{3}},
		{"backends in another order, renamed rule", func(rs []Rule) []int {
			slices.Reverse(rs[2].Backends)
			rs[2].Name = "tenant5-web-2"
			return []int{2}
		}, nil},
		{"every backend down", func(rs []Rule) []int {
			for j := range rs[4].Backends {
				rs[4].Backends[j].State = BackendDown
			}
			return []int{4}
		}, []int{4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := testRules()
			base[1].Backends[0].State = BackendDown
			prev, err := NewSnapshot(3, base, nil)
			require.NoError(t, err)
			before, err := NewSnapshot(3, base, nil) // what prev must still serve
			require.NoError(t, err)

			all := testRules()
			all[1].Backends[0].State = BackendDown
			changed := tt.change(all)
			var repl []Rule
			for _, i := range changed {
				repl = append(repl, all[i])
			}
			got, err := prev.ReplaceRules(4, repl)
			require.NoError(t, err)
			want, err := NewSnapshot(4, all, prev)
			require.NoError(t, err)
			requireSameSnapshot(t, want, got)
			requireSameSnapshot(t, before, prev)

			for i, r := range got.Rules() {
				old := prev.Rule(uint32(i))
				if !slices.Contains(changed, i) {
					require.Same(t, old, r, "rule %q not replaced: the same *Rule", r.Name)
					continue
				}
				require.NotSame(t, old, r)
				if slices.Contains(tt.rebuilt, i) {
					require.NotSame(t, old.Maglev(), r.Maglev(), "rule %q: new table", r.Name)
				} else {
					require.Same(t, old.Maglev(), r.Maglev(), "rule %q: table kept", r.Name)
				}
			}
		})
	}
}

// TestReplaceRulesRefuses: what ReplaceRules cannot do in place is an
// error, and the snapshot stays as it was.
func TestReplaceRulesRefuses(t *testing.T) {
	prev, err := NewSnapshot(1, testRules(), nil)
	require.NoError(t, err)
	tests := []struct {
		name string
		mod  func(rs []Rule) []Rule
		err  error
	}{
		{"unknown VIP", func(rs []Rule) []Rule { rs[0].VIP.Port = 81; return rs[:1] }, ErrNotReplaceable},
		{"backend added", func(rs []Rule) []Rule { rs[0].Backends = pool(4); return rs[:1] }, ErrNotReplaceable},
		{"backend renamed", func(rs []Rule) []Rule { rs[0].Backends[1].Name = "x"; return rs[:1] }, ErrNotReplaceable},
		{"table size", func(rs []Rule) []Rule { rs[0].TableSize = 251; return rs[:1] }, ErrNotReplaceable},
		{"twice", func(rs []Rule) []Rule { return []Rule{rs[0], rs[1], rs[0]} }, ErrNotReplaceable},
		{"invalid state", func(rs []Rule) []Rule { rs[0].Backends[0].State = 9; return rs[:1] }, ErrInvalidRule},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := prev.ReplaceRules(2, tt.mod(testRules()))
			require.ErrorIs(t, err, tt.err)
			t.Log(err)
			fresh, err := NewSnapshot(1, testRules(), nil)
			require.NoError(t, err)
			requireSameSnapshot(t, fresh, prev)
		})
	}
}

// TestReplaceRulesKeepsBackendIDs: a connection table stores backend IDs;
// after many replacements of other rules and of its own, an ID still
// resolves to the same VIP and backend, in the latest snapshot's rule.
func TestReplaceRulesKeepsBackendIDs(t *testing.T) {
	rules := testRules()
	s, err := NewSnapshot(1, rules, nil)
	require.NoError(t, err)
	stored := s.Rule(3).Backends[1] // "dns", as a connection table keeps it
	rnd := rand.New(rand.NewPCG(7, 7))
	for v := uint64(2); v < 200; v++ {
		i := rnd.IntN(len(rules))
		j := rnd.IntN(len(rules[i].Backends))
		rules[i].Backends[j].State = BackendState(rnd.IntN(3))
		s, err = s.ReplaceRules(v, []Rule{rules[i]})
		require.NoError(t, err)
		r, idx, ok := s.Backend(stored.ID)
		require.True(t, ok, "version %d", v)
		require.Same(t, s.Rule(3), r, "version %d: the rule of the latest snapshot", v)
		require.Equal(t, stored.Name, r.Backends[idx].Name)
		require.Equal(t, rules[3].Backends[1].State, r.Backends[idx].State, "version %d: the latest state", v)
	}
	want, err := NewSnapshot(199, rules, s)
	require.NoError(t, err)
	requireSameSnapshot(t, want, s)
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _, _ = s.Backend(stored.ID) }))
}
