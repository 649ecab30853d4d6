package flow

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestConnTableClaim: ClaimPrepared stores an absent or expired flow and
// leaves a live one untouched (InsertTaken), in both families.
func TestConnTableClaim(t *testing.T) {
	for _, fam := range []int{4, 6} {
		ct := newCT(t, ConnTableConfig{Capacity: 64, Timeouts: Timeouts{Untrusted: time.Second, Established: 10 * time.Second}})
		k := ctKeyOf(fam, 1)
		var q ConnQuery
		steps := []struct {
			name    string
			now     Tick
			backend uint32
			class   StateClass
			want    InsertResult
			holder  uint32 // the backend the table holds afterwards
		}{
			{"absent", 100, 7, ClassUntrusted, InsertNew, 7},
			{"live untrusted", 200, 8, ClassUntrusted, InsertTaken, 7},
			{"expired untrusted", 100 + 1001, 9, ClassEstablished, InsertNew, 9},
			{"live established", 5000, 10, ClassUntrusted, InsertTaken, 9},
			{"bad class", 5000, 10, ctClasses, InsertInvalid, 9},
		}
		for _, s := range steps {
			ct.Prepare(&q, &k)
			got := ct.ClaimPrepared(&q, s.backend, s.class, s.now)
			require.Equal(t, s.want, got, "IPv%d %s", fam, s.name)
			b, _, ok := ct.Lookup(&k, s.now)
			require.True(t, ok, "IPv%d %s", fam, s.name)
			require.Equal(t, s.holder, b, "IPv%d %s", fam, s.name)
		}
		require.Equal(t, "taken", InsertTaken.String())
		require.False(t, InsertTaken.Stored())
	}
}

// TestConnTableClaimRace: of many goroutines claiming the same keys at
// once, exactly one wins each key.
func TestConnTableClaimRace(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 4096})
	const keys, workers = 200, 4
	var won [keys]atomic.Int32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var q ConnQuery
			for i := range uint32(keys) {
				k := ctKey4(i)
				ct.Prepare(&q, &k)
				for {
					r := ct.ClaimPrepared(&q, uint32(w+1), ClassUntrusted, 1)
					if r == InsertBusy {
						continue
					}
					if r.Stored() {
						won[i].Add(1)
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	for i := range won {
		require.Equal(t, int32(1), won[i].Load(), "key %d", i)
	}
}
