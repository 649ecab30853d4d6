//go:build linux

package afxdp

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/engine"
)

// ringMem lays out a ring of n entries of size esz in Go memory the way the
// kernel does (indices and flags on their own cache lines), starting both
// indices at start.
func ringMem(n, esz int, start uint32) ([]byte, *unix.XDPRingOffset) {
	off := &unix.XDPRingOffset{Producer: 0, Consumer: 64, Flags: 128, Desc: 192}
	words := make([]uint64, (192+n*esz)/8+1)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	*(*uint32)(unsafe.Pointer(&mem[0])) = start
	*(*uint32)(unsafe.Pointer(&mem[64])) = start
	return mem, off
}

// TestRingModel drives a producer and a consumer view of one ring with
// random batch sizes against a FIFO model, starting near the 32-bit wrap
// of the indices.
func TestRingModel(t *testing.T) {
	for _, start := range []uint32{0, 1 << 31, ^uint32(0) - 100} {
		const n = 64
		mem, off := ringMem(n, 8, start)
		prod := newRing[uint64](mem, n, off, true)
		cons := newRing[uint64](mem, n, off, false)
		rng := rand.New(rand.NewPCG(uint64(start), 7))
		var model []uint64
		next := uint64(1)
		for step := 0; step < 20000; step++ {
			if rng.IntN(2) == 0 {
				want := uint32(rng.IntN(n + 8))
				free := prod.freeSlots(want)
				// The cached count may lag, but never past what the batch needs.
				trueFree := uint32(n - len(model))
				require.LessOrEqual(t, free, trueFree, "free slots at step %d", step)
				require.True(t, free >= want || free == trueFree, "free slots %d < want %d at step %d, true %d", free, want, step, trueFree)
				k := min(want, free)
				for i := uint32(0); i < k; i++ {
					prod.put(i, next)
					model = append(model, next)
					next++
				}
				prod.produce(k)
				if rng.IntN(4) != 0 { // sometimes publish later
					prod.submit()
				}
			} else {
				want := uint32(rng.IntN(n + 8))
				k := cons.available(want)
				published := prod.prod.Load() - cons.cachedCons
				require.Equal(t, min(want, published), k, "available at step %d", step)
				for i := uint32(0); i < k; i++ {
					require.Equal(t, model[i], *cons.at(i))
				}
				model = model[k:]
				cons.release(k)
			}
		}
	}
}

// fakeKernel plays the kernel's side of a socket's rings over Go memory.
type fakeKernel struct {
	fill, comp ring[uint64]
	rx, tx     ring[unix.XDPDesc]
	umem       []byte
	headroom   uint64 // where frames land in a chunk
}

// newFakePort returns a RingOwn port whose socket is the fake kernel.
func newFakePort(t *testing.T, cfg Config) (*Port, *fakeKernel) {
	t.Helper()
	cfg.Interface = "fake0"
	require.NoError(t, cfg.Validate())
	cfg = cfg.WithDefaults()
	s := &socket{fd: -1, needWakeup: true, umem: make([]byte, cfg.NumFrames*cfg.FrameSize)}
	k := &fakeKernel{umem: s.umem, headroom: uint64(cfg.chunkHeadroom() + PacketHeadroom)}
	mem, off := ringMem(cfg.FillRingSize, 8, 0)
	s.fill, k.fill = newRing[uint64](mem, cfg.FillRingSize, off, true), newRing[uint64](mem, cfg.FillRingSize, off, false)
	mem, off = ringMem(cfg.CompletionRingSize, 8, 0)
	s.comp, k.comp = newRing[uint64](mem, cfg.CompletionRingSize, off, false), newRing[uint64](mem, cfg.CompletionRingSize, off, true)
	mem, off = ringMem(cfg.RXRingSize, 16, 0)
	s.rx, k.rx = newRing[unix.XDPDesc](mem, cfg.RXRingSize, off, false), newRing[unix.XDPDesc](mem, cfg.RXRingSize, off, true)
	mem, off = ringMem(cfg.TXRingSize, 16, 0)
	s.tx, k.tx = newRing[unix.XDPDesc](mem, cfg.TXRingSize, off, true), newRing[unix.XDPDesc](mem, cfg.TXRingSize, off, false)
	p := newPort(cfg, 1)
	p.useSocket(s)
	return p, k
}

// receive puts frames on the RX ring, one fill-ring chunk each; it returns
// how many found a chunk and a ring slot.
func (k *fakeKernel) receive(frames ...[]byte) int {
	n := 0
	for _, f := range frames {
		if k.fill.available(1) == 0 || k.rx.freeSlots(1) == 0 {
			break
		}
		addr := *k.fill.at(0) + k.headroom
		k.fill.release(1)
		copy(k.umem[addr:], f)
		k.rx.put(0, unix.XDPDesc{Addr: addr, Len: uint32(len(f))})
		k.rx.produce(1)
		k.rx.submit()
		n++
	}
	return n
}

// transmit consumes the TX ring, returning copies of the frames, and
// completes them.
func (k *fakeKernel) transmit() [][]byte {
	var out [][]byte
	n := k.tx.available(^uint32(0))
	for i := uint32(0); i < n; i++ {
		d := *k.tx.at(i)
		out = append(out, bytes.Clone(k.umem[d.Addr:d.Addr+uint64(d.Len)]))
		k.comp.put(i, d.Addr)
	}
	k.tx.release(n)
	k.comp.produce(n)
	k.comp.submit()
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
