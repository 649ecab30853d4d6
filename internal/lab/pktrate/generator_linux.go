//go:build linux

package pktrate

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdplb/xdplb/internal/xsk"
	"golang.org/x/sys/unix"
)

// GenConfig describes a generator: a TX-only AF_XDP socket on one queue of
// one interface, whose UMEM holds the prebuilt frames of Spec.
type GenConfig struct {
	// Ifindex is the interface to send on, in the namespace of the thread
	// that calls OpenGenerator; Queue its TX queue (the receiving veth
	// delivers to the RX queue of the same number).
	Ifindex, Queue int
	// Spec is the traffic. Must be valid.
	Spec FrameSpec
	// RingSize is the TX and completion ring size, a power of two
	// (default 2048).
	RingSize int
	// MaxUMEM bounds the UMEM in bytes (default 256 MiB). Frames are packed
	// at a power-of-two stride of at least their length (64 bytes for
	// 64-byte frames), so a million 64-byte flows take 64 MiB and are all
	// prebuilt; when Flows frames do not fit, the generator keeps fewer
	// buffers and rewrites a buffer's source address and port (with
	// incremental checksum updates) each time it reuses it.
	MaxUMEM int
	// Affinity pins the sending thread to these CPUs (none: not pinned).
	Affinity []int
}

// Generator defaults.
const (
	DefaultGenRingSize = 2048
	DefaultMaxUMEM     = 256 << 20
)

const (
	chunkSize = 2048 // UMEM chunk; a frame never crosses one
	maxBurst  = 256  // descriptors posted per sendto at most
)

// Generator transmits the frames of a FrameSpec, cycling through all its
// flows, from a TX-only AF_XDP socket. On veth the socket runs in copy
// mode: each sendto makes the kernel copy the posted frames into skbs and
// hand them to the veth, which passes them to its peer (the DUT).
//
// Sent counts frames the kernel has completed (taken from the TX ring and
// released): frames the receiving side dropped count as sent, so loss is
// the DUT's.
type Generator struct {
	cfg  GenConfig
	sock *xsk.Socket // TX only: its fill ring is required by bind, never used
	fd   int         // sock.FD
	umem []byte      // sock.UMEM

	stride  int
	nslots  int
	rewrite bool // fewer slots than flows: rewrite a slot's flow on reuse
	flowLen uint32

	// sender state (owned by the sending goroutine)
	slot, flow int
	posted     uint64

	completed atomic.Uint64
	kickErrs  atomic.Uint64
	tid       atomic.Int64
	stop      atomic.Bool
	mu        sync.Mutex
	done      chan error
}

// OpenGenerator creates the socket, builds the frames and binds to the
// queue, in the calling thread's network namespace (call it inside
// netlab.NS.Do).
func OpenGenerator(cfg GenConfig) (_ *Generator, err error) {
	if cfg.RingSize == 0 {
		cfg.RingSize = DefaultGenRingSize
	}
	if cfg.MaxUMEM == 0 {
		cfg.MaxUMEM = DefaultMaxUMEM
	}
	if err := cfg.Spec.Validate(); err != nil {
		return nil, err
	}
	if cfg.RingSize < 64 || cfg.RingSize > 1<<16 || cfg.RingSize&(cfg.RingSize-1) != 0 {
		return nil, fmt.Errorf("pktrate: ring size %d: want a power of two in [64, 65536]", cfg.RingSize)
	}
	g := &Generator{cfg: cfg, fd: -1, flowLen: uint32(cfg.Spec.Len())}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	g.layout()

	// TX only, copy mode, no need_wakeup (copy mode always needs the
	// sendto). xsk.Open raises the copy-mode TX budget where the kernel
	// allows it (Linux 6.17+), so one sendto may send the whole ring.
	g.sock, err = xsk.Open(xsk.Config{
		Ifindex:            cfg.Ifindex,
		Queue:              cfg.Queue,
		UMEMSize:           (g.nslots*g.stride + chunkSize - 1) / chunkSize * chunkSize,
		ChunkSize:          chunkSize,
		FillRingSize:       64,
		CompletionRingSize: cfg.RingSize,
		TXRingSize:         cfg.RingSize,
		BindFlags:          unix.XDP_COPY,
	})
	if err != nil {
		return nil, fmt.Errorf("pktrate: generator socket: %w", err)
	}
	g.fd, g.umem = g.sock.FD, g.sock.UMEM
	g.buildFrames()
	return g, nil
}

// layout chooses the frame stride and the number of frame buffers.
func (g *Generator) layout() {
	g.stride = 64
	for g.stride < int(g.flowLen) {
		g.stride *= 2
	}
	flows := g.cfg.Spec.Flows
	// Enough buffers that a full TX ring and a full completion ring never
	// wrap onto a buffer still in flight.
	minSlots := 2 * g.cfg.RingSize
	budget := max(g.cfg.MaxUMEM/g.stride, minSlots)
	switch {
	case flows >= minSlots && flows <= budget:
		g.nslots = flows
	case flows < minSlots:
		// A whole number of copies of every flow, so cycling through the
		// buffers sends every flow equally often.
		g.nslots = flows * ((minSlots + flows - 1) / flows)
	default:
		g.nslots, g.rewrite = budget, true
	}
}

// slotAddr is buffer s's offset in the UMEM.
func (g *Generator) slotAddr(s int) int {
	per := chunkSize / g.stride
	return s/per*chunkSize + s%per*g.stride
}

func (g *Generator) slotBytes(s int) []byte {
	a := g.slotAddr(s)
	return g.umem[a : a+int(g.flowLen)]
}

func (g *Generator) buildFrames() {
	flows := g.cfg.Spec.Flows
	for s := 0; s < g.nslots; s++ {
		g.cfg.Spec.Frame(g.slotBytes(s), s%flows)
	}
	g.flow = g.nslots % flows // next flow for a rewritten buffer
}

// Slots reports how many frame buffers the UMEM holds and whether they are
// rewritten on reuse (more flows than buffers).
func (g *Generator) Slots() (n int, rewrite bool) { return g.nslots, g.rewrite }

// Start starts sending at load in a goroutine of its own (on a locked OS
// thread, pinned if GenConfig.Affinity says so) until Stop.
func (g *Generator) Start(load Load) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done != nil {
		return errors.New("pktrate: generator already running")
	}
	if g.fd < 0 {
		return errors.New("pktrate: generator closed")
	}
	g.stop.Store(false)
	g.done = make(chan error, 1)
	started := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		g.tid.Store(int64(unix.Gettid()))
		var err error
		if len(g.cfg.Affinity) > 0 {
			var set unix.CPUSet
			for _, c := range g.cfg.Affinity {
				set.Set(c)
			}
			err = unix.SchedSetaffinity(0, &set)
		}
		close(started)
		if err == nil {
			err = g.send(load)
		}
		g.done <- err
	}()
	<-started
	return nil
}

// Stop stops sending, waits (up to a second) for the kernel to finish the
// frames already posted, and returns the sender's error, if any.
func (g *Generator) Stop() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done == nil {
		return nil
	}
	g.stop.Store(true)
	err := <-g.done
	g.done = nil
	return err
}

// Sent is the number of frames the kernel has completed so far. Safe from
// any goroutine.
func (g *Generator) Sent() uint64 { return g.completed.Load() }

// KickErrors counts sendto calls that failed with a transient error
// (EAGAIN, EBUSY, ENOBUFS): the kernel could not take frames right then.
func (g *Generator) KickErrors() uint64 { return g.kickErrs.Load() }

// CPU is the CPU time of the sending thread so far (0 before Start).
func (g *Generator) CPU() time.Duration {
	tid := g.tid.Load()
	if tid == 0 {
		return 0
	}
	d, _ := taskCPU(unix.Getpid(), int(tid))
	return d
}

// send is the sending loop.
func (g *Generator) send(load Load) error {
	start := time.Now()
	pps := load.PPS
	burst := maxBurst
	if !load.IsMax() {
		// About 50 µs of traffic per burst, so low rates are not lumpy.
		burst = min(maxBurst, max(1, int(pps*50e-6)))
	}
	var sentAtStart = g.posted
	for !g.stop.Load() {
		g.reap()
		want := int(g.sock.TX.FreeSlots(uint32(g.cfg.RingSize)))
		// Never reuse a buffer the kernel may still read.
		if inflight := int(g.posted - g.completed.Load()); g.nslots-inflight < want {
			want = max(0, g.nslots-inflight)
		}
		want = min(want, burst)
		if !load.IsMax() {
			elapsed := time.Since(start).Seconds()
			due := int64(pps*elapsed) - int64(g.posted-sentAtStart)
			if due < int64(burst) {
				// Sleep until a whole burst is due.
				wait := time.Duration((float64(g.posted-sentAtStart+uint64(burst))/pps - elapsed) * float64(time.Second))
				if wait > 0 {
					time.Sleep(wait)
				}
				continue
			}
			want = min(want, int(due))
		}
		if want > 0 {
			g.post(want)
		}
		if err := g.kick(); err != nil {
			return err
		}
	}
	// Let the kernel finish what is on the ring.
	deadline := time.Now().Add(time.Second)
	for g.completed.Load() < g.posted && time.Now().Before(deadline) {
		if err := g.kick(); err != nil {
			return err
		}
		g.reap()
		if g.completed.Load() < g.posted {
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// post puts n descriptors on the TX ring, the next n buffers in turn.
func (g *Generator) post(n int) {
	spec := &g.cfg.Spec
	for i := 0; i < n; i++ {
		if g.rewrite {
			spec.SetFlow(g.slotBytes(g.slot), g.flow)
			if g.flow++; g.flow == spec.Flows {
				g.flow = 0
			}
		}
		g.sock.TX.Put(uint32(i), unix.XDPDesc{Addr: uint64(g.slotAddr(g.slot)), Len: g.flowLen})
		if g.slot++; g.slot == g.nslots {
			g.slot = 0
		}
	}
	g.sock.TX.Produce(uint32(n))
	g.sock.TX.Submit()
	g.posted += uint64(n)
}

// reap takes what the completion ring holds.
func (g *Generator) reap() {
	if n := g.sock.Comp.Available(uint32(g.cfg.RingSize)); n > 0 {
		g.sock.Comp.Release(n)
		g.completed.Add(uint64(n))
	}
}

// kick asks the kernel to send what is on the TX ring (copy mode always
// needs the system call).
func (g *Generator) kick() error {
	e := xsk.KickTX(g.fd)
	switch e {
	case 0:
		return nil
	case unix.EAGAIN, unix.EBUSY, unix.ENOBUFS, unix.EINTR:
		g.kickErrs.Add(1)
		return nil
	}
	return fmt.Errorf("pktrate: sendto: %w", e)
}

// Close stops sending and releases the socket and its memory.
func (g *Generator) Close() error {
	err := g.Stop()
	if g.sock != nil {
		g.sock.Close()
		g.sock = nil
	}
	g.fd, g.umem = -1, nil
	return err
}
