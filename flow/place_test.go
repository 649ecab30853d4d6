package flow

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPlace: a connection-table entry (Rule.Entry) finds its backend in
// later snapshots whatever moved — the hint right, stale (a reload shifted
// the pool), pointing at another backend's place, past 255 — and finds
// nothing when the backend is gone or the rule is another.
func TestPlace(t *testing.T) {
	vipA := VIP{Addr: netip.MustParseAddr("198.18.10.1"), Proto: ProtoTCP, Port: 80}
	vipB := VIP{Addr: netip.MustParseAddr("198.18.10.2"), Proto: ProtoTCP, Port: 80}
	named := func(names ...string) []Backend {
		var bs []Backend
		for i, n := range names {
			bs = append(bs, Backend{Name: n, Addr: netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}), Weight: 1})
		}
		return bs
	}
	many := func(n int) []string {
		var s []string
		for i := range n {
			s = append(s, fmt.Sprintf("m%03d", i))
		}
		return s
	}
	type want struct {
		rule    string // "a" or "b": the rule the packet matches in the new snapshot
		backend string // "" when Place must fail
	}
	for _, tc := range []struct {
		name     string
		a1, a2   []string // rule a's pool before and after
		b2       []string // rule b's pool after (before: b0, b1, b2)
		entryOf  string   // the backend of rule a the entry was made for
		checks   []want
		wantFast bool // the hint is still right
	}{
		{name: "unchanged", a1: []string{"x", "y", "z"}, a2: []string{"x", "y", "z"}, b2: []string{"b0", "b1", "b2"},
			entryOf: "y", checks: []want{{"a", "y"}, {"b", ""}}, wantFast: true},
		{name: "shifted by an added backend", a1: []string{"x", "y", "z"}, a2: []string{"w", "x", "y", "z"}, b2: []string{"b0", "b1", "b2"},
			entryOf: "y", checks: []want{{"a", "y"}, {"b", ""}}},
		{name: "shifted by a removed backend", a1: []string{"x", "y", "z"}, a2: []string{"y", "z"}, b2: []string{"b0", "b1", "b2"},
			entryOf: "z", checks: []want{{"a", "z"}}},
		{name: "removed, its place taken", a1: []string{"x", "y", "z"}, a2: []string{"x", "z"}, b2: []string{"b0", "b1", "b2"},
			entryOf: "y", checks: []want{{"a", ""}, {"b", ""}}},
		{name: "past 255", a1: many(300), a2: many(300), b2: []string{"b0"},
			entryOf: "m280", checks: []want{{"a", "m280"}, {"b", ""}}},
		{name: "past 255, shifted", a1: many(300), a2: append([]string{"a"}, many(300)...), b2: []string{"b0"},
			entryOf: "m280", checks: []want{{"a", "m280"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rs Rules
			s1, err := rs.Update(1, []Rule{{Name: "a", VIP: vipA, Backends: named(tc.a1...)}, {Name: "b", VIP: vipB, Backends: named("b0", "b1", "b2")}})
			require.NoError(t, err)
			ra := s1.LookupVIP(vipA)
			idx := -1
			for i := range ra.Backends {
				if ra.Backends[i].Name == tc.entryOf {
					idx = i
				}
			}
			require.GreaterOrEqual(t, idx, 0)
			e := ra.Entry(idx)
			got, ok := s1.Place(ra, e)
			require.True(t, ok)
			require.Equal(t, idx, got, "the snapshot that made the entry")
			br, bi, ok := s1.Backend(e)
			require.True(t, ok, "Backend takes an entry")
			require.Same(t, ra, br)
			require.Equal(t, idx, bi)

			s2, err := rs.Update(2, []Rule{{Name: "b", VIP: vipB, Backends: named(tc.b2...)}, {Name: "a", VIP: vipA, Backends: named(tc.a2...)}})
			require.NoError(t, err)
			for _, w := range tc.checks {
				r := s2.LookupVIP(vipA)
				if w.rule == "b" {
					r = s2.LookupVIP(vipB)
				}
				i, ok := s2.Place(r, e)
				if w.backend == "" {
					require.False(t, ok, "rule %s: found %d", w.rule, i)
					continue
				}
				require.True(t, ok, "rule %s", w.rule)
				require.Equal(t, w.backend, r.Backends[i].Name, "rule %s", w.rule)
				if tc.wantFast {
					require.Equal(t, int(e>>24), i, "the hint is right")
				}
			}
			require.Zero(t, testing.AllocsPerRun(100, func() { _, _ = s2.Place(s2.LookupVIP(vipA), e) }))
		})
	}
}

// TestBackendIDsFitEntries: IDs stay within MaxBackendID when the counter
// wraps, skip IDs in use, and an entry is never ReservedID.
func TestBackendIDsFitEntries(t *testing.T) {
	vip := VIP{Addr: netip.MustParseAddr("198.18.10.1"), Proto: ProtoTCP, Port: 80}
	var rs Rules
	s1, err := rs.Update(1, []Rule{{Name: "a", VIP: vip, Backends: pool(2)}})
	require.NoError(t, err)
	s1.nextID = MaxBackendID - 1 // as if 2^24 backends had come and gone
	rs.Store(s1)
	s2, err := rs.Update(2, []Rule{{Name: "a", VIP: vip, Backends: pool(6)}})
	require.NoError(t, err)
	seen := map[uint32]bool{}
	r := s2.LookupVIP(vip)
	for i, b := range r.Backends {
		require.NotZero(t, b.ID)
		require.LessOrEqual(t, b.ID, uint32(MaxBackendID))
		require.False(t, seen[b.ID], "unique")
		seen[b.ID] = true
		require.NotEqual(t, ReservedID, r.Entry(i))
		j, ok := s2.Place(r, r.Entry(i))
		require.True(t, ok)
		require.Equal(t, i, j)
	}
	require.True(t, seen[MaxBackendID-1] && seen[MaxBackendID], "the last IDs are used before the wrap")
	// Index 255 with the largest ID would be 0xFFFFFFFF without the cap.
	require.NotEqual(t, ReservedID, uint32(255)<<24|uint32(MaxBackendID))
}
