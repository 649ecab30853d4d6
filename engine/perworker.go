package engine

import "sync/atomic"

// MaxWorkers bounds the worker indices (Batch.Worker, WorkerConfig.ID)
// that PerWorker keeps state for.
const MaxWorkers = 256

// PerWorker holds one *T per worker for a stage that several workers
// share: a cache or counters that each worker writes alone, with no
// locking and no shared cache lines on the packet path. Get(b.Worker)
// returns the calling worker's value, made by New on the worker's first
// batch (the only allocation). Other goroutines may read the values with
// Range, through atomics or other synchronisation T provides.
//
// Only the worker with index w may call Get(w): workers of one Engine have
// distinct indices (engine.New checks), so stages shared by the workers of
// one Engine are safe. Workers' indices are below MaxWorkers (NewWorker
// checks); Get returns nil for other indices — a batch a test or tool
// made by hand — and the stage must then work without per-worker state.
type PerWorker[T any] struct {
	// New returns a worker's value; nil leaves it the zero T.
	New   func() *T
	slots [MaxWorkers]atomic.Pointer[T]
}

// Get returns worker w's value, making it on first use; nil when w is out
// of range.
func (p *PerWorker[T]) Get(w int) *T {
	if uint(w) >= MaxWorkers {
		return nil
	}
	if v := p.slots[w].Load(); v != nil {
		return v
	}
	var v *T
	if p.New != nil {
		v = p.New()
	} else {
		v = new(T)
	}
	p.slots[w].Store(v)
	return v
}

// Range calls fn with every worker's value made so far, in worker order,
// until fn returns false.
func (p *PerWorker[T]) Range(fn func(w int, v *T) bool) {
	for w := range p.slots {
		if v := p.slots[w].Load(); v != nil && !fn(w, v) {
			return
		}
	}
}
