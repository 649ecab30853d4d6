package flow

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConnTableMovesUnderLookups: while a writer fills a small table with
// proven flows and empties it again, so that its inserts move entries
// (stable flows among them) to their other buckets, readers looking the
// stable flows up never miss one without counting the miss contended (a
// miss they know may be false). A move counts itself in the geometry word
// before it lets its buckets go, so a lookup that read the entry's new
// bucket before the move and its old one after looks again; without that
// the readers miss stable flows silently. Both families, both layouts;
// run it with -race.
func TestConnTableMovesUnderLookups(t *testing.T) {
	const stable, readers = 64, 2
	for _, family := range []int{4, 6} {
		for _, pre := range []bool{false, true} {
			t.Run(fmt.Sprintf("family=%d/preallocate=%v", family, pre), func(t *testing.T) {
				cfg := ConnTableConfig{Capacity: 128, IPv6Capacity: 128, Preallocate: pre, Seed: 11}
				ct := newCT(t, cfg)
				for i := range uint32(stable) {
					k := ctKeyOf(family, i)
					require.Equal(t, InsertNew, ct.Insert(&k, i, ClassEstablished, 0))
				}
				var stop atomic.Bool
				var misses atomic.Uint64
				var wg sync.WaitGroup
				for r := range readers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for n := r; !stop.Load(); n++ {
							i := uint32(n % stable)
							k := ctKeyOf(family, i)
							var q ConnQuery
							ct.Prepare(&q, &k)
							if be, _, ok := ct.LookupPrepared(&q, 0); !ok {
								misses.Add(1)
							} else if be != i {
								t.Errorf("stable flow %d: backend %d", i, be)
							}
						}
					}()
				}
				next := uint32(stable)
				for round := 0; round < 300 || ct.Stats().Moves < 1000 && round < 5000; round++ {
					first := next
					for ct.Insert(new(ctKeyOf(family, next)), next, ClassEstablished, 0).Stored() {
						next++
					}
					for id := first; id < next; id++ {
						ct.Delete(new(ctKeyOf(family, id)))
					}
				}
				stop.Store(true)
				wg.Wait()
				st := ct.Stats()
				t.Logf("moves %d, silent or counted misses %d, contended %d", st.Moves, misses.Load(), st.Contended)
				require.NotZero(t, st.Moves, "nothing moved: the test shows nothing")
				require.LessOrEqual(t, misses.Load(), st.Contended, "stable flows missed without a contended count")
				require.Equal(t, stable, ct.Len())
			})
		}
	}
}

// TestCtVictimBeats: the order in which an insert picks a victim: any
// victim over none, an expired one over a live one, then the longest
// idle; none never beats anything, and equals do not replace each other.
func TestCtVictimBeats(t *testing.T) {
	none := ctVictim{j: -1}
	live := func(age uint32) ctVictim { return ctVictim{j: 1, age: age} }
	expired := func(age uint32) ctVictim { return ctVictim{j: 2, age: age, expired: true} }
	tests := []struct {
		name string
		v, o ctVictim
		want bool
	}{
		{"some over none", live(0), none, true},
		{"none over some", none, live(0), false},
		{"none over none", none, none, false},
		{"expired over live", expired(1), live(100), true},
		{"live over expired", live(100), expired(1), false},
		{"longer idle live", live(5), live(4), true},
		{"shorter idle live", live(4), live(5), false},
		{"equal live", live(5), live(5), false},
		{"longer idle expired", expired(9), expired(8), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.v.beats(tt.o))
		})
	}
}
