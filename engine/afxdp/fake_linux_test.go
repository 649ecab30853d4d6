//go:build linux

package afxdp

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/internal/xsk"
)

// fakeKernel plays the kernel's side of a socket's rings over Go memory.
type fakeKernel struct {
	fill, comp xsk.Ring[uint64]
	rx, tx     xsk.Ring[unix.XDPDesc]
	umem       []byte
	headroom   uint64 // where frames land in a chunk
}

// newFakePort returns a RingOwn port whose socket is the fake kernel.
func newFakePort(t *testing.T, cfg Config) (*Port, *fakeKernel) {
	t.Helper()
	cfg.Interface = "fake0"
	require.NoError(t, cfg.Validate())
	cfg = cfg.WithDefaults()
	s := &xsk.Socket{FD: -1, NeedWakeup: true, UMEM: make([]byte, cfg.NumFrames*cfg.FrameSize)}
	k := &fakeKernel{umem: s.UMEM, headroom: uint64(cfg.chunkHeadroom() + PacketHeadroom)}
	mem, off := xsk.GoRingMem(cfg.FillRingSize, 8, 0)
	s.Fill, k.fill = xsk.NewRing[uint64](mem, cfg.FillRingSize, off, true), xsk.NewRing[uint64](mem, cfg.FillRingSize, off, false)
	mem, off = xsk.GoRingMem(cfg.CompletionRingSize, 8, 0)
	s.Comp, k.comp = xsk.NewRing[uint64](mem, cfg.CompletionRingSize, off, false), xsk.NewRing[uint64](mem, cfg.CompletionRingSize, off, true)
	mem, off = xsk.GoRingMem(cfg.RXRingSize, 16, 0)
	s.RX, k.rx = xsk.NewRing[unix.XDPDesc](mem, cfg.RXRingSize, off, false), xsk.NewRing[unix.XDPDesc](mem, cfg.RXRingSize, off, true)
	mem, off = xsk.GoRingMem(cfg.TXRingSize, 16, 0)
	s.TX, k.tx = xsk.NewRing[unix.XDPDesc](mem, cfg.TXRingSize, off, true), xsk.NewRing[unix.XDPDesc](mem, cfg.TXRingSize, off, false)
	p := newPort(cfg, 1)
	p.useSocket(s)
	return p, k
}

// receive puts frames on the RX ring, one fill-ring chunk each; it returns
// how many found a chunk and a ring slot.
func (k *fakeKernel) receive(frames ...[]byte) int {
	n := 0
	for _, f := range frames {
		if k.fill.Available(1) == 0 || k.rx.FreeSlots(1) == 0 {
			break
		}
		addr := *k.fill.At(0) + k.headroom
		k.fill.Release(1)
		copy(k.umem[addr:], f)
		k.rx.Put(0, unix.XDPDesc{Addr: addr, Len: uint32(len(f))})
		k.rx.Produce(1)
		k.rx.Submit()
		n++
	}
	return n
}

// transmit consumes the TX ring, returning copies of the frames, and
// completes them.
func (k *fakeKernel) transmit() [][]byte {
	var out [][]byte
	n := k.tx.Available(^uint32(0))
	for i := uint32(0); i < n; i++ {
		d := *k.tx.At(i)
		out = append(out, bytes.Clone(k.umem[d.Addr:d.Addr+uint64(d.Len)]))
		k.comp.Put(i, d.Addr)
	}
	k.tx.Release(n)
	k.comp.Produce(n)
	k.comp.Submit()
	return out
}

func requireInvariant(t *testing.T, p *Port) {
	t.Helper()
	f := p.Frames()
	require.Equal(t, p.cfg.NumFrames, f.Free+f.Kernel+f.Held+f.TX, "%+v", f)
	require.GreaterOrEqual(t, f.Free, 0)
	require.GreaterOrEqual(t, f.Held, 0)
}

func fakeFrame(i, n int) []byte {
	f := make([]byte, n)
	for j := range f {
		f[j] = byte(i*7 + j)
	}
	return f
}

// TestFakeForward runs a worker over a port on the fake kernel: own frames
// go out zero-copy at their current offset (a stage prepends 4 bytes),
// MemPort frames are copied in, a frame too large for a chunk is refused
// without holding back the rest, and every chunk comes home.
func TestFakeForward(t *testing.T) {
	p, k := newFakePort(t, Config{NumFrames: 512, FillRingSize: 128, CompletionRingSize: 128, RXRingSize: 128, TXRingSize: 128})
	requireInvariant(t, p)
	mem, err := engine.NewMemPort(engine.MemPortConfig{Name: "mem", FrameSize: 4096})
	require.NoError(t, err)

	tag := engine.StageFunc(func(b *engine.Batch) {
		for _, pk := range b.Packets() {
			h, ok := pk.Prepend(4)
			require.True(t, ok)
			copy(h, "TAG!")
		}
	})
	toXDP := engine.StageFunc(func(b *engine.Batch) {
		for _, pk := range b.Packets() {
			pk.OutPort = 0
		}
	})
	w, err := engine.NewWorker(engine.WorkerConfig{
		Ports: []engine.Port{p, mem},
		Inputs: []engine.Input{
			{Port: 0, Pipeline: engine.NewPipeline(tag)},
			{Port: 1, Pipeline: engine.NewPipeline(toXDP)},
		},
	})
	require.NoError(t, err)

	var sent, want [][]byte
	for round := 0; round < 20; round++ {
		for i := 0; i < 50; i++ {
			f := fakeFrame(round*100+i, 60+i)
			require.Equal(t, 1, k.receive(f))
			want = append(want, append([]byte("TAG!"), f...))
		}
		for i := 0; i < 10; i++ {
			f := fakeFrame(round*100+50+i, 100+i)
			mem.Inject(f)
			want = append(want, f)
		}
		mem.Inject(make([]byte, 3000)) // larger than a 2048-byte chunk
		for w.Poll() > 0 {
			requireInvariant(t, p)
		}
		sent = append(sent, k.transmit()...)
		requireInvariant(t, p)
	}
	_ = p.Flush()
	requireInvariant(t, p)

	require.ElementsMatch(t, want, sent)
	f := p.Frames()
	require.Zero(t, f.Held)
	require.Zero(t, f.TX)
	require.Equal(t, 4*engine.MaxBatch, mem.FreeFrames())

	st := p.c
	require.EqualValues(t, 20*50, st[cRXFrames])
	require.EqualValues(t, 20*60, st[cTXFrames])
	require.EqualValues(t, 20*10, st[cTXCopied])
	require.EqualValues(t, 20, st[cTXTooBig])
	var es engine.Stats
	w.Counters().Snapshot(&es)
	require.EqualValues(t, 20, es.Drops[engine.DropTXTooBig])
}

// TestFakeHeadroom checks received frames land after the headroom the
// config asks for, and copies keep the same room.
func TestFakeHeadroom(t *testing.T) {
	for _, hr := range []int{0, 64, 256, 300, 512} {
		cfg := Config{FrameSize: 4096, Headroom: hr}
		p, k := newFakePort(t, cfg)
		require.Equal(t, 1, k.receive(fakeFrame(1, 100)))
		var b engine.Batch
		pool := make([]engine.Packet, engine.MaxBatch)
		require.Equal(t, 1, p.Receive(&b, pool, 0))
		pk := b.Packets()[0]
		want := max(hr, PacketHeadroom)
		if hr == 0 {
			want = max(engine.DefaultHeadroom, PacketHeadroom)
		}
		require.Equal(t, want, pk.Headroom(), "headroom %d", hr)
		require.Equal(t, fakeFrame(1, 100), pk.Data())
		p.Release(b.Packets())
		requireInvariant(t, p)
		require.Zero(t, p.Frames().Held)
	}
}

// TestFakeBackpressure fills the TX ring and the free stack while the fake
// kernel sends nothing: Transmit takes what fits, counts the rest, and all
// chunks come back once the kernel catches up.
func TestFakeBackpressure(t *testing.T) {
	p, k := newFakePort(t, Config{NumFrames: 256, FillRingSize: 64, CompletionRingSize: 64, RXRingSize: 64, TXRingSize: 64})
	mem, err := engine.NewMemPort(engine.MemPortConfig{Name: "mem"})
	require.NoError(t, err)
	var b engine.Batch
	pool := make([]engine.Packet, engine.MaxBatch)
	taken := 0
	for i := 0; i < 5; i++ {
		for j := 0; j < engine.MaxBatch; j++ {
			mem.Inject(fakeFrame(j, 64))
		}
		b.Reset()
		n := mem.Receive(&b, pool, 1)
		require.Equal(t, engine.MaxBatch, n)
		taken += p.Transmit(b.Packets())
		mem.Release(b.Packets())
		requireInvariant(t, p)
	}
	// The TX ring holds 64; Transmit kicks and reaps (nothing completes).
	require.Equal(t, 64, taken)
	require.EqualValues(t, 5*engine.MaxBatch-64, p.c[cTXRingFull])
	require.NoError(t, p.Flush())
	require.Len(t, k.transmit(), 64)
	require.NoError(t, p.Flush())
	f := p.Frames()
	require.Zero(t, f.TX)
	require.Equal(t, 256, f.Free+f.Kernel)
}

// TestFakeRefusalReasons fills a port's TX side while the fake kernel
// sends nothing, once until the TX ring is full and once until no free
// chunk is left to copy into (the ring still has room): the worker drops
// the refused frames under the reason the port counts them by, and frames
// no chunk can hold (empty ones here) as tx_too_big whatever else the
// port ran out of.
func TestFakeRefusalReasons(t *testing.T) {
	full := Config{NumFrames: 512, FillRingSize: 64, CompletionRingSize: 64, RXRingSize: 64, TXRingSize: 64}
	// 256 chunks: 64 on the fill ring, 192 free (64 of them the reserve
	// for copies); three batches of copies take them all.
	noChunk := Config{NumFrames: 256, FillRingSize: 64, CompletionRingSize: 256, RXRingSize: 64, TXRingSize: 256}
	tests := []struct {
		name    string
		cfg     Config
		batches int
		empty   int // empty frames at the end of the last batch
		reason  string
		counter int
	}{
		{"tx ring full", full, 2, 0, "tx_full", cTXRingFull},
		{"tx ring full, empty frames behind", full, 2, 3, "tx_full", cTXRingFull},
		{"no free chunk", noChunk, 4, 0, "tx_no_frame", cTXNoFrame},
		{"no free chunk, empty frames behind", noChunk, 4, 3, "tx_no_frame", cTXNoFrame},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, k := newFakePort(t, tc.cfg)
			mem, err := engine.NewMemPort(engine.MemPortConfig{Name: "mem", Frames: 8 * engine.MaxBatch})
			require.NoError(t, err)
			toXDP := engine.StageFunc(func(b *engine.Batch) {
				for _, pk := range b.Packets() {
					pk.OutPort = 0
				}
			})
			w, err := engine.NewWorker(engine.WorkerConfig{
				Ports:  []engine.Port{p, mem},
				Inputs: []engine.Input{{Port: 1, Pipeline: engine.NewPipeline(toXDP)}},
			})
			require.NoError(t, err)
			for i := 0; i < tc.batches; i++ {
				for j := 0; j < engine.MaxBatch; j++ {
					if i == tc.batches-1 && j >= engine.MaxBatch-tc.empty {
						mem.Inject([]byte{})
						continue
					}
					mem.Inject(fakeFrame(j, 64))
				}
				require.Equal(t, engine.MaxBatch, w.Poll())
				requireInvariant(t, p)
			}
			var es engine.Stats
			w.Counters().Snapshot(&es)
			refused := uint64(engine.MaxBatch - tc.empty)
			require.Equal(t, refused, p.c[tc.counter])
			require.EqualValues(t, tc.empty, p.c[cTXTooBig])
			want := map[string]uint64{tc.reason: refused}
			if tc.empty > 0 {
				want["tx_too_big"] = uint64(tc.empty)
			}
			require.Equal(t, want, es.DropsByName())

			require.Len(t, k.transmit(), (tc.batches-1)*engine.MaxBatch)
			require.NoError(t, p.Flush())
			requireInvariant(t, p)
			require.Zero(t, p.Frames().TX)
		})
	}
}
