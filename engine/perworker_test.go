package engine_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
)

// countingStage is one stage shared by every worker, counting each
// worker's packets in its own PerWorker slot.
type countingStage struct {
	per engine.PerWorker[atomic.Uint64]
}

func (s *countingStage) Process(b *engine.Batch) {
	if c := s.per.Get(b.Worker); c != nil {
		c.Store(c.Load() + uint64(b.Len())) // single writer
	}
}

// TestPerWorker shares one stage between two running workers (meaningful
// under -race): each worker's slot counts exactly its own port's frames,
// read concurrently through Range.
func TestPerWorker(t *testing.T) {
	st := &countingStage{}
	var ports []*engine.MemPort
	var workers []*engine.Worker
	for i := 0; i < 2; i++ {
		m := newMem(t, "m", true)
		w, err := engine.NewWorker(engine.WorkerConfig{ID: 3 + i, Ports: []engine.Port{m},
			Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(st)}}})
		require.NoError(t, err)
		ports, workers = append(ports, m), append(workers, w)
	}
	e, err := engine.New(workers...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = e.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()

	sum := func() (total uint64, seen []int) {
		st.per.Range(func(w int, v *atomic.Uint64) bool {
			total += v.Load()
			seen = append(seen, w)
			return true
		})
		return
	}
	for i := 0; i < 300; i++ {
		ports[0].Inject(frame(60, byte(i)))
		if i%3 == 0 {
			ports[1].Inject(frame(60, byte(i)))
		}
		_, _ = sum()
	}
	deadline := time.Now().Add(10 * time.Second) // a hang guard, not a timing assertion
	for {
		if total, _ := sum(); total == 400 {
			break
		}
		require.True(t, time.Now().Before(deadline), "workers did not count every frame")
		time.Sleep(time.Millisecond)
	}
	_, seen := sum()
	require.Equal(t, []int{3, 4}, seen)
	require.EqualValues(t, 300, st.per.Get(3).Load())
	require.EqualValues(t, 100, st.per.Get(4).Load())
}

func TestPerWorkerBounds(t *testing.T) {
	var p engine.PerWorker[int]
	require.Nil(t, p.Get(-1))
	require.Nil(t, p.Get(engine.MaxWorkers))
	v := p.Get(engine.MaxWorkers - 1)
	require.NotNil(t, v)
	require.Same(t, v, p.Get(engine.MaxWorkers-1))
	made := 0
	q := engine.PerWorker[int]{New: func() *int { made++; x := 7; return &x }}
	require.Equal(t, 7, *q.Get(0))
	q.Get(0)
	require.Equal(t, 1, made)
}

func TestEngineRefusesDuplicateWorkerIDs(t *testing.T) {
	var ws []*engine.Worker
	for i := 0; i < 2; i++ {
		w, err := engine.NewWorker(engine.WorkerConfig{ID: 1, Ports: []engine.Port{newMem(t, "m", false)},
			Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline()}}})
		require.NoError(t, err)
		ws = append(ws, w)
	}
	_, err := engine.New(ws...)
	require.ErrorContains(t, err, "two workers have ID 1")
}
