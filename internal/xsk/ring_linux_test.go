//go:build linux

package xsk

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRingModel drives a producer and a consumer view of one ring with
// random batch sizes against a FIFO model, starting near the 32-bit wrap
// of the indices.
func TestRingModel(t *testing.T) {
	for _, start := range []uint32{0, 1 << 31, ^uint32(0) - 100} {
		const n = 64
		mem, off := GoRingMem(n, 8, start)
		prod := NewRing[uint64](mem, n, off, true)
		cons := NewRing[uint64](mem, n, off, false)
		rng := rand.New(rand.NewPCG(uint64(start), 7))
		var model []uint64
		next := uint64(1)
		for step := 0; step < 20000; step++ {
			if rng.IntN(2) == 0 {
				want := uint32(rng.IntN(n + 8))
				free := prod.FreeSlots(want)
				// The cached count may lag, but never past what the batch needs.
				trueFree := uint32(n - len(model))
				require.LessOrEqual(t, free, trueFree, "free slots at step %d", step)
				require.True(t, free >= want || free == trueFree, "free slots %d < want %d at step %d, true %d", free, want, step, trueFree)
				k := min(want, free)
				for i := uint32(0); i < k; i++ {
					prod.Put(i, next)
					model = append(model, next)
					next++
				}
				prod.Produce(k)
				if rng.IntN(4) != 0 { // sometimes publish later
					prod.Submit()
				}
			} else {
				want := uint32(rng.IntN(n + 8))
				k := cons.Available(want)
				published := prod.prod.Load() - cons.cachedCons
				require.Equal(t, min(want, published), k, "available at step %d", step)
				for i := uint32(0); i < k; i++ {
					require.Equal(t, model[i], *cons.At(i))
				}
				model = model[k:]
				cons.Release(k)
			}
		}
		// Everything produced reaches the consumer once published, and
		// what it releases frees the producer's slots.
		prod.Submit()
		k := cons.Available(n)
		require.Equal(t, uint32(len(model)), k, "published entries the consumer sees")
		for i := range k {
			require.Equal(t, model[i], *cons.At(i))
		}
		cons.Release(k)
		require.Equal(t, uint32(n), prod.FreeSlots(n), "free slots once the consumer released everything")
	}
}
