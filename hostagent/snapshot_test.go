package hostagent

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
)

// TestOneVersionPerBatch applies and publishes documents as fast as it
// can while a worker runs the Host Agent's inbound pipeline with the
// agent's batch snapshot, as a running agent wires it. Every version moves
// the web VIP's backends to another port (8080, 9090): every packet of a
// batch must be translated by a rule of the batch's snapshot, to that
// rule's backend port.
func TestOneVersionPerBatch(t *testing.T) {
	docOf := func(v int) *control.Document {
		port := "8080"
		if v%2 == 0 {
			port = "9090"
		}
		text := strings.Replace(strings.ReplaceAll(pipeDoc, "port: 8080", "port: "+port), "version: 1", fmt.Sprintf("version: %d", v), 1)
		d, err := control.Parse([]byte(text))
		require.NoError(t, err)
		return d
	}
	a, plan, _, inbound, _ := agentPipelines(t, docOf(1), 1<<12)

	var batches, wrong atomic.Int64
	var first atomic.Value
	check := engine.StageFunc(func(b *engine.Batch) {
		batches.Add(1)
		s, _ := b.Snapshot.(*agentSnapshot)
		for _, p := range b.Packets() {
			switch {
			case s == nil || p.Rule == nil:
				wrong.Add(1)
				first.CompareAndSwap(nil, "no snapshot or no rule")
			case s.rules.Rule(p.Rule.ID) != p.Rule:
				wrong.Add(1)
				first.CompareAndSwap(nil, fmt.Sprintf("a rule not of the batch's version %d", s.rules.Version))
			case p.Key.DstPort != p.Rule.Backends[p.Backend].Port:
				wrong.Add(1)
				first.CompareAndSwap(nil, fmt.Sprintf("translated to port %d, version %d says %d", p.Key.DstPort, s.rules.Version, p.Rule.Backends[p.Backend].Port))
			}
		}
	})
	cfg := engine.WorkerConfig{Inputs: []engine.Input{{Port: UplinkPort, Pipeline: engine.NewPipeline(inbound, check)}}, Snapshot: a.batchSnapshot}
	var up *engine.MemPort
	for i := 0; i < 2+len(plan.Ports); i++ {
		p, err := engine.NewMemPort(engine.MemPortConfig{})
		require.NoError(t, err)
		if i == UplinkPort {
			up = p
		}
		cfg.Ports = append(cfg.Ports, p)
	}
	w, err := engine.NewWorker(cfg)
	require.NoError(t, err)
	var frames [][]byte
	for i := range 64 {
		frames = append(frames, vxlanFrame(t, net.HardwareAddr{2, 0, 0, 0, 4, 1 + byte(i%2)}, fmt.Sprint(i)))
	}
	up.Replay(frames)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var version atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for v := 2; ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := a.apply(docOf(v)); err != nil {
				t.Errorf("apply %d: %v", v, err)
				return
			}
			a.mu.Lock()
			a.publish()
			a.mu.Unlock()
			version.Store(int64(v))
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	for batches.Load() < 5000 && time.Now().Before(deadline) {
		w.Poll()
	}
	close(stop)
	wg.Wait()
	var st engine.Stats
	w.Counters().Snapshot(&st)
	t.Logf("%d batches through %d versions; drops %v", batches.Load(), version.Load(), st.DropsByName())
	require.Zero(t, wrong.Load(), "first: %v", first.Load())
	require.Zero(t, st.Dropped(), "drops: %v", st.DropsByName())
	require.Greater(t, version.Load(), int64(10), "too few reloads to show anything")
}
