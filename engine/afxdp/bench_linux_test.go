//go:build linux

package afxdp_test

import (
	"context"
	"net"
	"net/netip"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
)

// TestNoAllocs drives a warm port by hand: receive what the peer sent,
// send it straight back (zero-copy), copy MemPort frames out (copy path),
// release, flush. None of it may allocate.
func TestNoAllocs(t *testing.T) {
	for _, rc := range rings {
		t.Run(rc.name, func(t *testing.T) {
			r := newRig(t, 1)
			prog := redirectAll(t, r.lbLink, 1)
			port := openPort(t, r.lbLink, afxdp.Config{Ring: rc.ring})
			require.NoError(t, prog.Register(0, port.FD()))
			mem, err := engine.NewMemPort(engine.MemPortConfig{Name: "mem"})
			require.NoError(t, err)
			lbAP := netip.MustParseAddrPort(lbAddr + ":9000")
			peerAP := netip.MustParseAddrPort(peerAddr + ":9001")
			for i := 0; i < 2000; i++ {
				mem.Inject(udpFrame(t, r.peerLink.MAC, r.lbLink.MAC, lbAP, peerAP, payload(i, 100)))
			}
			conn, err := r.peer.ListenPacket(context.Background(), "udp4", peerAddr+":0")
			require.NoError(t, err)
			defer conn.Close()
			uc := conn.(*net.UDPConn)
			for i := 0; i < 1500; i++ {
				_, err := uc.WriteToUDPAddrPort(payload(i, 100), lbAP)
				require.NoError(t, err)
			}

			var b engine.Batch
			pool := make([]engine.Packet, engine.MaxBatch)
			memPool := make([]engine.Packet, engine.MaxBatch)
			var got, copied int
			step := func() {
				b.Reset()
				n := port.Receive(&b, pool, 0)
				got += n
				pk := b.Packets()
				k := port.Transmit(pk)
				port.Release(pk[k:])
				b.Reset()
				mem.Receive(&b, memPool, 1)
				pk = b.Packets()
				copied += port.Transmit(pk)
				mem.Release(pk)
				_ = port.Flush()
			}
			step() // warm up
			allocs := testing.AllocsPerRun(200, step)
			require.Zero(t, allocs, "allocations per Receive/Transmit/Release/Flush round")
			require.NotZero(t, got, "nothing was received")
			require.NotZero(t, copied, "nothing was copied")
			drain(port)
			requireNoLeak(t, port)
		})
	}
}

// BenchmarkReflect measures a port bouncing frames over a veth pair: the
// port under test (ring own or asavie) reflects every frame; on the other
// end a RingOwn port reflects them back. 256 frames circulate; the metric
// is frames reflected by the port under test per second. Both ends run in
// copy mode (veth), so the kernel's copies weigh on both results alike.
//
//	go test -run '^$' -bench BenchmarkReflect -benchtime 2000000x ./engine/afxdp/
func BenchmarkReflect(b *testing.B) {
	for _, rc := range rings {
		b.Run(rc.name, func(b *testing.B) {
			benchReflect(b, afxdp.Config{Ring: rc.ring})
		})
	}
}

// swapMACs sends every frame back where it came from.
var swapMACs = engine.StageFunc(func(b *engine.Batch) {
	for _, p := range b.Packets() {
		f := p.Data()
		var m [6]byte
		copy(m[:], f[0:6])
		copy(f[0:6], f[6:12])
		copy(f[6:12], m[:])
	}
})

func benchReflect(b *testing.B, cfg afxdp.Config) {
	const inFlight = 256
	r := newRig(b, 1)
	lbProg := redirectAll(b, r.lbLink, 1)
	peerProg := redirectAll(b, r.peerLink, 1)
	port := openPort(b, r.lbLink, cfg)
	peer := openPort(b, r.peerLink, afxdp.Config{})
	require.NoError(b, lbProg.Register(0, port.FD()))
	require.NoError(b, peerProg.Register(0, peer.FD()))
	seed, err := engine.NewMemPort(engine.MemPortConfig{Name: "seed", Frames: 2 * inFlight})
	require.NoError(b, err)

	cpu := &cpuPort{Port: port}
	wl, err := engine.NewWorker(engine.WorkerConfig{
		Ports:  []engine.Port{cpu},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(swapMACs)}},
	})
	require.NoError(b, err)
	toPeer := engine.StageFunc(func(bt *engine.Batch) {
		for _, p := range bt.Packets() {
			p.OutPort = 0
		}
	})
	wp, err := engine.NewWorker(engine.WorkerConfig{
		ID:    1,
		Ports: []engine.Port{peer, seed},
		Inputs: []engine.Input{
			{Port: 0, Pipeline: engine.NewPipeline(swapMACs)},
			{Port: 1, Pipeline: engine.NewPipeline(toPeer)},
		},
	})
	require.NoError(b, err)
	frame := udpFrame(b, r.lbLink.MAC, r.peerLink.MAC,
		netip.MustParseAddrPort(peerAddr+":9001"), netip.MustParseAddrPort(lbAddr+":9000"), make([]byte, 64-42))
	reseed := func() {
		for i := 0; i < inFlight; i++ {
			seed.Inject(frame)
		}
	}
	stopL := runWorker(b, wl)
	stopP := runWorker(b, wp)
	reseed()

	tx := func() uint64 {
		st, err := port.Stats()
		require.NoError(b, err)
		return st.TXFrames
	}
	cpu0 := cpu.fresh()
	start := tx()
	reseeds := 0
	last, lastMove := start, time.Now()
	b.ResetTimer()
	t0 := time.Now()
	for {
		time.Sleep(time.Millisecond)
		n := tx()
		if n-start >= uint64(b.N) {
			break
		}
		if n != last {
			last, lastMove = n, time.Now()
		} else if time.Since(lastMove) > 200*time.Millisecond {
			reseed() // frames were lost on the way: top the circulation up
			reseeds++
			lastMove = time.Now()
		}
	}
	el := time.Since(t0)
	frames := float64(tx() - start)
	cpu1 := cpu.fresh()
	b.StopTimer()
	stopL()
	stopP()
	b.ReportMetric(float64(b.N)/el.Seconds(), "pps")
	b.ReportMetric(float64(cpu1.user-cpu0.user)/frames, "user-ns/frame")
	b.ReportMetric(float64(cpu1.sys-cpu0.sys)/frames, "sys-ns/frame")
	b.ReportMetric(float64(reseeds), "reseeds")
}

// cpuPort wraps the port under test to sample its worker thread's CPU time
// (getrusage RUSAGE_THREAD) from Flush, which runs on that thread.
type cpuPort struct {
	*afxdp.Port
	flushes   int
	user, sys atomic.Int64 // nanoseconds
	samples   atomic.Int64
}

func (c *cpuPort) Flush() error {
	err := c.Port.Flush()
	if c.flushes++; c.flushes%64 == 0 {
		var ru unix.Rusage
		if unix.Getrusage(unix.RUSAGE_THREAD, &ru) == nil {
			c.user.Store(ru.Utime.Nano())
			c.sys.Store(ru.Stime.Nano())
			c.samples.Add(1)
		}
	}
	return err
}

type cpuTimes struct{ user, sys int64 }

// fresh waits for a sample taken after the call and returns it.
func (c *cpuPort) fresh() cpuTimes {
	n := c.samples.Load()
	for c.samples.Load() < n+2 {
		time.Sleep(100 * time.Microsecond)
	}
	return cpuTimes{c.user.Load(), c.sys.Load()}
}

// BenchmarkReceive measures what the receive side of a port costs per
// frame: the peer floods 64-byte frames (a RingOwn port transmitting a
// MemPort replay), and the port under test receives and releases them in a
// hand-written worker loop that times only its Receive, Release and Flush
// calls, so the kernel's copy-mode work (done on the sender's CPU) and idle
// polling stay out of the figure. port-ns/frame is the metric to compare.
//
//	go test -run '^$' -bench BenchmarkReceive -benchtime 2000000x ./engine/afxdp/
func BenchmarkReceive(b *testing.B) {
	for _, rc := range rings {
		b.Run(rc.name, func(b *testing.B) {
			benchReceive(b, afxdp.Config{Ring: rc.ring})
		})
	}
}

func benchReceive(b *testing.B, cfg afxdp.Config) {
	r := newRig(b, 1)
	lbProg := redirectAll(b, r.lbLink, 1)
	port := openPort(b, r.lbLink, cfg)
	peer := openPort(b, r.peerLink, afxdp.Config{})
	require.NoError(b, lbProg.Register(0, port.FD()))
	gen, err := engine.NewMemPort(engine.MemPortConfig{Name: "gen"})
	require.NoError(b, err)
	frame := udpFrame(b, r.lbLink.MAC, r.peerLink.MAC,
		netip.MustParseAddrPort(peerAddr+":9001"), netip.MustParseAddrPort(lbAddr+":9000"), make([]byte, 64-42))
	gen.Replay([][]byte{frame})
	toPeer := engine.StageFunc(func(bt *engine.Batch) {
		for _, p := range bt.Packets() {
			p.OutPort = 0
		}
	})
	wp, err := engine.NewWorker(engine.WorkerConfig{
		Ports:  []engine.Port{peer, gen},
		Inputs: []engine.Input{{Port: 1, Pipeline: engine.NewPipeline(toPeer)}},
	})
	require.NoError(b, err)
	// Poll by hand: a worker that always has input (the replay) never gets
	// to notice a cancelled context in Run.
	var stopGen atomic.Bool
	genDone := make(chan struct{})
	go func() {
		defer close(genDone)
		for !stopGen.Load() {
			wp.Poll()
		}
	}()
	defer func() { stopGen.Store(true); <-genDone }()

	var bt engine.Batch
	pool := make([]engine.Packet, engine.MaxBatch)
	var frames, spent int64
	// Per-batch cost of batches of at least 32 frames, for a median that
	// a preemption or an interrupt inside a timed section cannot skew.
	perFrame := make([]float64, 0, b.N/32+1)
	loop := func(n int64) {
		for frames < n {
			t0 := time.Now()
			bt.Reset()
			k := port.Receive(&bt, pool, 0)
			if k == 0 {
				_ = port.Flush()
				continue
			}
			port.Release(bt.Packets())
			_ = port.Flush()
			d := int64(time.Since(t0))
			spent += d
			frames += int64(k)
			if k >= 32 && len(perFrame) < cap(perFrame) {
				perFrame = append(perFrame, float64(d)/float64(k))
			}
		}
	}
	loop(100000) // warm up
	frames, spent, perFrame = 0, 0, perFrame[:0]
	b.ResetTimer()
	loop(int64(b.N))
	b.StopTimer()
	if len(perFrame) > 0 {
		sort.Float64s(perFrame)
		b.ReportMetric(perFrame[len(perFrame)/2], "p50-port-ns/frame")
	}
	st, err := port.Stats()
	require.NoError(b, err)
	b.ReportMetric(float64(spent)/float64(frames), "port-ns/frame")
	b.ReportMetric(float64(st.Kernel.RXRingFull+st.Kernel.RXFillRingEmptyDescs), "kernel-drops")
}
