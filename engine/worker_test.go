package engine_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
)

func frame(n int, tag byte) []byte {
	f := make([]byte, n)
	for i := range f {
		f[i] = tag
	}
	return f
}

func newMem(t testing.TB, name string, capture bool) *engine.MemPort {
	t.Helper()
	m, err := engine.NewMemPort(engine.MemPortConfig{Name: name, Capture: capture})
	require.NoError(t, err)
	return m
}

var dropOdd = engine.RegisterDropReason("test_odd")

// oddDropper drops frames whose first byte is odd.
var oddDropper = engine.StageFunc(func(b *engine.Batch) {
	for _, p := range b.Packets() {
		if p.Data()[0]%2 == 1 {
			b.Drop(p, dropOdd)
		}
	}
})

func TestWorkerForwardsAndDrops(t *testing.T) {
	tests := []struct {
		name     string
		frames   int
		wantTX   int
		wantDrop int
	}{
		{"empty", 0, 0, 0},
		{"one", 1, 1, 0},
		{"two", 2, 1, 1},
		{"full batch", engine.MaxBatch, engine.MaxBatch / 2, engine.MaxBatch / 2},
		{"several batches", 3*engine.MaxBatch + 5, (3*engine.MaxBatch + 5 + 1) / 2, (3*engine.MaxBatch + 5) / 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := newMem(t, "in", true)
			w, err := engine.NewWorker(engine.WorkerConfig{
				Ports:  []engine.Port{in},
				Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(oddDropper)}},
			})
			require.NoError(t, err)
			for i := 0; i < tc.frames; i++ {
				in.Inject(frame(60, byte(i)))
			}
			for w.Poll() > 0 {
			}
			out := in.Transmitted()
			require.Len(t, out, tc.wantTX)
			for _, f := range out {
				require.Zero(t, f[0]%2, "an odd frame was forwarded")
				require.Len(t, f, 60)
			}
			var s engine.Stats
			w.Counters().Snapshot(&s)
			require.EqualValues(t, tc.frames, s.RX)
			require.EqualValues(t, tc.wantTX, s.TX)
			require.EqualValues(t, tc.wantDrop, s.Drops[dropOdd])
			require.EqualValues(t, tc.wantDrop, s.Dropped())
			require.Equal(t, 4*engine.MaxBatch, in.FreeFrames(), "frames leaked")
		})
	}
}

// TestWorkerCrossPort sends frames from port A to port B: B copies them and
// A's buffers come back.
func TestWorkerCrossPort(t *testing.T) {
	a := newMem(t, "a", false)
	b := newMem(t, "b", true)
	toB := engine.StageFunc(func(bt *engine.Batch) {
		for _, p := range bt.Packets() {
			p.OutPort = 1
		}
	})
	w, err := engine.NewWorker(engine.WorkerConfig{
		Ports:  []engine.Port{a, b},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(toB)}},
	})
	require.NoError(t, err)
	for i := 0; i < 100; i++ {
		a.Inject(frame(64+i, byte(i)))
	}
	for w.Poll() > 0 {
	}
	got := b.Transmitted()
	require.Len(t, got, 100)
	for i, f := range got {
		require.Equal(t, frame(64+i, byte(i)), f)
	}
	require.Equal(t, 4*engine.MaxBatch, a.FreeFrames())
	require.Equal(t, 4*engine.MaxBatch, b.FreeFrames())
}

// TestWorkerSplitBatch sends even frames to port 0 and odd ones to port 1
// and an unknown port, within one batch.
func TestWorkerSplitBatch(t *testing.T) {
	a := newMem(t, "a", true)
	b := newMem(t, "b", true)
	split := engine.StageFunc(func(bt *engine.Batch) {
		for _, p := range bt.Packets() {
			switch p.Data()[0] % 3 {
			case 0:
				p.OutPort = 0
			case 1:
				p.OutPort = 1
			case 2:
				p.OutPort = 7 // no such port
			}
		}
	})
	w, err := engine.NewWorker(engine.WorkerConfig{
		Ports:  []engine.Port{a, b},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(split)}},
	})
	require.NoError(t, err)
	for i := 0; i < 60; i++ {
		a.Inject(frame(60, byte(i)))
	}
	require.Equal(t, 60, w.Poll())
	require.Len(t, a.Transmitted(), 20)
	require.Len(t, b.Transmitted(), 20)
	var s engine.Stats
	w.Counters().Snapshot(&s)
	require.EqualValues(t, 20, s.Drops[engine.DropNoOutPort])
	require.Equal(t, 4*engine.MaxBatch, a.FreeFrames())
}

func TestPacketHeadroom(t *testing.T) {
	in := newMem(t, "in", true)
	encap := engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			d, ok := p.Prepend(8)
			if !ok {
				b.Drop(p, engine.DropNoHeadroom)
				continue
			}
			copy(d, "XXXXXXXX")
		}
	})
	decap := engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			require.True(t, p.TrimFront(4))
		}
	})
	w, err := engine.NewWorker(engine.WorkerConfig{
		Ports:  []engine.Port{in},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(encap, decap)}},
	})
	require.NoError(t, err)
	in.Inject([]byte("hello"))
	w.Poll()
	require.Equal(t, [][]byte{[]byte("XXXXhello")}, in.Transmitted())

	var p engine.Packet
	buf := make([]byte, 32)
	p.SetBuffer(in, 0, buf, 4, 10, 0)
	_, ok := p.Prepend(5)
	require.False(t, ok, "prepend beyond headroom")
	require.Equal(t, 4, p.Headroom())
	require.Equal(t, 18, p.Tailroom())
	require.False(t, p.TrimFront(11))
	require.False(t, p.SetLen(29))
	require.True(t, p.SetLen(28))
}

func TestNewWorkerErrors(t *testing.T) {
	m := newMem(t, "m", false)
	pl := engine.NewPipeline()
	for _, tc := range []struct {
		name string
		cfg  engine.WorkerConfig
	}{
		{"no ports", engine.WorkerConfig{Inputs: []engine.Input{{Port: 0, Pipeline: pl}}}},
		{"no inputs", engine.WorkerConfig{Ports: []engine.Port{m}}},
		{"bad input port", engine.WorkerConfig{Ports: []engine.Port{m}, Inputs: []engine.Input{{Port: 1, Pipeline: pl}}}},
		{"nil pipeline", engine.WorkerConfig{Ports: []engine.Port{m}, Inputs: []engine.Input{{Port: 0}}}},
		{"nil port", engine.WorkerConfig{Ports: []engine.Port{nil}, Inputs: []engine.Input{{Port: 0, Pipeline: pl}}}},
		{"negative ID", engine.WorkerConfig{ID: -1, Ports: []engine.Port{m}, Inputs: []engine.Input{{Port: 0, Pipeline: pl}}}},
		{"ID past MaxWorkers", engine.WorkerConfig{ID: engine.MaxWorkers, Ports: []engine.Port{m}, Inputs: []engine.Input{{Port: 0, Pipeline: pl}}}},
	} {
		_, err := engine.NewWorker(tc.cfg)
		require.Error(t, err, tc.name)
	}
	_, err := engine.NewMemPort(engine.MemPortConfig{Headroom: 4096})
	require.Error(t, err)
}

// TestEngineRun runs two workers on goroutines while the test injects
// frames and reads counters concurrently (meaningful under -race).
func TestEngineRun(t *testing.T) {
	var ports []*engine.MemPort
	var workers []*engine.Worker
	for i := 0; i < 2; i++ {
		m := newMem(t, "m", true)
		w, err := engine.NewWorker(engine.WorkerConfig{
			ID:     i,
			Ports:  []engine.Port{m},
			Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(oddDropper)}},
		})
		require.NoError(t, err)
		ports = append(ports, m)
		workers = append(workers, w)
	}
	e, err := engine.New(workers...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = e.Run(ctx) }()
	for i := 0; i < 1000; i++ {
		ports[i%2].Inject(frame(60, byte(i)))
		if i%100 == 0 {
			_ = e.Stats()
		}
	}
	deadline := time.Now().Add(10 * time.Second) // a hang guard, not a timing assertion
	for {
		s := e.Stats()
		if s.RX == 1000 {
			break
		}
		require.True(t, time.Now().Before(deadline), "workers did not receive every frame: %+v", s.RX)
		time.Sleep(time.Millisecond)
	}
	cancel()
	wg.Wait()
	s := e.Stats()
	require.EqualValues(t, 500, s.TX)
	require.EqualValues(t, 500, s.Drops[dropOdd])
	require.Equal(t, map[string]uint64{"test_odd": 500}, s.DropsByName())
}

func TestDropReasonRegistry(t *testing.T) {
	r := engine.RegisterDropReason("test_odd")
	require.Equal(t, dropOdd, r, "same name, same reason")
	require.Equal(t, "test_odd", r.String())
	require.Equal(t, "nexthop_unresolved", engine.DropNextHopUnres.String())
	require.Equal(t, "none", engine.DropReason(0).String())
}

func TestWorkerPollNoAllocs(t *testing.T) {
	in := newMem(t, "in", false)
	frames := make([][]byte, 128)
	for i := range frames {
		frames[i] = frame(60, byte(i))
	}
	in.Replay(frames)
	w, err := engine.NewWorker(engine.WorkerConfig{
		Ports:  []engine.Port{in},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(oddDropper)}},
	})
	require.NoError(t, err)
	w.Poll()
	allocs := testing.AllocsPerRun(100, func() { w.Poll() })
	require.Zero(t, allocs)
}

// TestParseFirstUDPFragment: a first fragment of a UDP datagram carries
// the UDP header, whose Length counts the whole datagram.
func TestParseFirstUDPFragment(t *testing.T) {
	f := udpFrame("198.18.0.1", "198.18.1.1", 1000, 53)
	// Claim a 1000-byte datagram, of which this is the first fragment.
	f[14+6] |= 0x20 // MF
	f[14+20+4], f[14+20+5] = 0x03, 0xe8
	var p engine.Packet
	buf := make([]byte, 256)
	copy(buf[64:], f)
	p.SetBuffer(nil, 0, buf, 64, len(f), 0)
	require.Zero(t, engine.ParsePacket(&p, 0))
	require.NotZero(t, p.Flags&engine.FlagFragment)
	require.EqualValues(t, 53, p.Key.DstPort)
	// The same frame not fragmented is malformed.
	f[14+6] &^= 0x20
	copy(buf[64:], f)
	p.SetBuffer(nil, 0, buf, 64, len(f), 0)
	require.Equal(t, engine.DropBadL4, engine.ParsePacket(&p, 0))
}

// TestMemPortTooBig: a frame longer than a MemPort buffer never reaches
// the worker; the port counts it, and the frames around it pass.
func TestMemPortTooBig(t *testing.T) {
	m, err := engine.NewMemPort(engine.MemPortConfig{FrameSize: 2048, Headroom: 256, Capture: true})
	require.NoError(t, err)
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{m},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline()}}})
	require.NoError(t, err)
	fits, tooBig := make([]byte, 2048-256), make([]byte, 2048-256+1)
	m.Inject(fits, tooBig, fits)
	require.Equal(t, 2, w.Poll())
	st := m.Stats()
	require.EqualValues(t, 2, st.RXFrames)
	require.EqualValues(t, 1, st.RXTooBig)
	require.Zero(t, st.Queued)
	require.Len(t, m.Transmitted(), 2)
}

// TestMemPortReplayTooBig: a replayed frame longer than a buffer is
// skipped and counted as Receive counts an injected one, instead of being
// delivered as a packet whose Data runs past its buffer (a panic); a
// replay of nothing but such frames receives nothing.
func TestMemPortReplayTooBig(t *testing.T) {
	m, err := engine.NewMemPort(engine.MemPortConfig{FrameSize: 2048, Headroom: 256})
	require.NoError(t, err)
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{m},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(engine.StageFunc(func(b *engine.Batch) {
			for _, p := range b.Packets() {
				_ = p.Data()
			}
		}))}}})
	require.NoError(t, err)
	fits, tooBig := make([]byte, 2048-256), make([]byte, 2048-256+1)
	m.Replay([][]byte{fits, tooBig})
	require.Equal(t, engine.MaxBatch, w.Poll())
	require.NotZero(t, m.Stats().RXTooBig)
	require.Equal(t, 4*engine.MaxBatch, m.FreeFrames(), "no frame leaked")

	m.Replay([][]byte{tooBig})
	require.Zero(t, w.Poll())
}

// failingPort is a MemPort whose Check fails once fail is set.
type failingPort struct {
	*engine.MemPort
	mu   sync.Mutex
	fail error
}

func (p *failingPort) Check() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fail
}

// A port that fails its Check stops its worker with the error, also a
// worker with several inputs (which never waits on a port), and the
// engine returns it.
func TestWorkerStopsWhenAPortFails(t *testing.T) {
	for _, inputs := range []int{1, 2} {
		a, err := engine.NewMemPort(engine.MemPortConfig{Name: "a"})
		require.NoError(t, err)
		b, err := engine.NewMemPort(engine.MemPortConfig{Name: "b"})
		require.NoError(t, err)
		fp := &failingPort{MemPort: b}
		ins := []engine.Input{{Port: 0, Pipeline: engine.NewPipeline()}}
		if inputs == 2 {
			ins = append(ins, engine.Input{Port: 1, Pipeline: engine.NewPipeline()})
		}
		w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{a, fp}, Inputs: ins, CheckEvery: time.Millisecond})
		require.NoError(t, err)
		eng, err := engine.New(w)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- eng.Run(context.Background()) }()
		select {
		case err := <-done:
			t.Fatalf("inputs %d: the engine stopped before the port failed: %v", inputs, err)
		case <-time.After(20 * time.Millisecond):
		}
		cause := errors.New("interface deleted")
		fp.mu.Lock()
		fp.fail = cause
		fp.mu.Unlock()
		select {
		case err := <-done:
			require.ErrorIs(t, err, cause, "inputs %d", inputs)
			require.ErrorContains(t, err, "port b failed", "inputs %d", inputs)
		case <-time.After(10 * time.Second): // hang guard
			t.Fatalf("inputs %d: the worker kept running on a failed port", inputs)
		}
	}
}
