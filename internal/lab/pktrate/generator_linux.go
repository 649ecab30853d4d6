//go:build linux

package pktrate

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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
	// xdpMaxTXSkbBudget is the socket option (Linux 6.17+) raising how many
	// frames one copy-mode sendto sends (32 by default).
	xdpMaxTXSkbBudget = 9
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
	fd   int
	umem []byte

	tx   xdpRing[unix.XDPDesc]
	comp xdpRing[uint64]
	fill xdpRing[uint64] // required by bind, never used

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

	g.fd, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("pktrate: socket(AF_XDP): %w", err)
	}
	size := (g.nslots*g.stride + chunkSize - 1) / chunkSize * chunkSize
	g.umem, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("pktrate: mmap UMEM of %d bytes: %w", size, err)
	}
	g.buildFrames()

	reg := unix.XDPUmemReg{
		Addr: uint64(uintptr(unsafe.Pointer(&g.umem[0]))),
		Len:  uint64(len(g.umem)),
		Size: chunkSize,
	}
	if err := xdpSetsockopt(g.fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		return nil, fmt.Errorf("pktrate: XDP_UMEM_REG: %w", err)
	}
	for _, o := range []struct{ opt, n int }{
		{unix.XDP_UMEM_FILL_RING, 64},
		{unix.XDP_UMEM_COMPLETION_RING, cfg.RingSize},
		{unix.XDP_TX_RING, cfg.RingSize},
	} {
		if err := unix.SetsockoptInt(g.fd, unix.SOL_XDP, o.opt, o.n); err != nil {
			return nil, fmt.Errorf("pktrate: ring option %d: %w", o.opt, err)
		}
	}
	var off unix.XDPMmapOffsets
	n := uint32(unsafe.Sizeof(off))
	if err := xdpGetsockopt(g.fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), &n); err != nil {
		return nil, fmt.Errorf("pktrate: XDP_MMAP_OFFSETS: %w", err)
	}
	if g.fill, err = mapXDPRing[uint64](g.fd, unix.XDP_UMEM_PGOFF_FILL_RING, 64, &off.Fr); err != nil {
		return nil, err
	}
	if g.comp, err = mapXDPRing[uint64](g.fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, cfg.RingSize, &off.Cr); err != nil {
		return nil, err
	}
	if g.tx, err = mapXDPRing[unix.XDPDesc](g.fd, unix.XDP_PGOFF_TX_RING, cfg.RingSize, &off.Tx); err != nil {
		return nil, err
	}
	// Best effort (Linux 6.17+): one sendto may send the whole ring.
	_ = unix.SetsockoptInt(g.fd, unix.SOL_XDP, xdpMaxTXSkbBudget, cfg.RingSize)

	sa := &unix.SockaddrXDP{Flags: unix.XDP_COPY, Ifindex: uint32(cfg.Ifindex), QueueID: uint32(cfg.Queue)}
	for i := 0; ; i++ { // a just-closed socket releases its queue asynchronously
		err = unix.Bind(g.fd, sa)
		if err != unix.EBUSY || i == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("pktrate: bind AF_XDP to ifindex %d queue %d: %w", cfg.Ifindex, cfg.Queue, err)
	}
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
		want := int(g.tx.freeSlots(uint32(g.cfg.RingSize)))
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
		g.tx.put(uint32(i), unix.XDPDesc{Addr: uint64(g.slotAddr(g.slot)), Len: g.flowLen})
		if g.slot++; g.slot == g.nslots {
			g.slot = 0
		}
	}
	g.tx.produce(uint32(n))
	g.tx.submit()
	g.posted += uint64(n)
}

// reap takes what the completion ring holds.
func (g *Generator) reap() {
	if n := g.comp.available(uint32(g.cfg.RingSize)); n > 0 {
		g.comp.release(n)
		g.completed.Add(uint64(n))
	}
}

// kick asks the kernel to send what is on the TX ring (copy mode always
// needs the system call).
func (g *Generator) kick() error {
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(g.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
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
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd = -1
	}
	g.tx.unmap()
	g.comp.unmap()
	g.fill.unmap()
	if g.umem != nil {
		unix.Munmap(g.umem)
		g.umem = nil
	}
	return err
}

// xdpRing is one of an AF_XDP socket's rings, mapped from the kernel: a
// power-of-two array of T with a producer and a consumer index. This side
// is the producer of the TX and fill rings and the consumer of the
// completion ring. Indices are read with atomic loads and published with
// atomic stores, once per batch; cached copies serve in between.
type xdpRing[T uint64 | unix.XDPDesc] struct {
	mem        []byte
	prod, cons *atomic.Uint32
	descs      []T
	mask       uint32
	cachedProd uint32
	cachedCons uint32
}

func mapXDPRing[T uint64 | unix.XDPDesc](fd int, pgoff int64, n int, off *unix.XDPRingOffset) (xdpRing[T], error) {
	var zero T
	size := int(off.Desc) + n*int(unsafe.Sizeof(zero))
	mem, err := unix.Mmap(fd, pgoff, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return xdpRing[T]{}, fmt.Errorf("pktrate: mmap AF_XDP ring at %#x: %w", pgoff, err)
	}
	base := unsafe.Pointer(&mem[0])
	r := xdpRing[T]{
		mem:   mem,
		prod:  (*atomic.Uint32)(unsafe.Add(base, off.Producer)),
		cons:  (*atomic.Uint32)(unsafe.Add(base, off.Consumer)),
		descs: unsafe.Slice((*T)(unsafe.Add(base, off.Desc)), n),
		mask:  uint32(n - 1),
	}
	r.cachedProd = r.prod.Load()
	r.cachedCons = r.cons.Load()
	return r, nil
}

func (r *xdpRing[T]) unmap() {
	if r.mem != nil {
		unix.Munmap(r.mem)
		*r = xdpRing[T]{}
	}
}

// freeSlots (producer side) returns how many entries can be produced,
// refreshing the kernel's consumer index only when the cached one says
// fewer than want.
func (r *xdpRing[T]) freeSlots(want uint32) uint32 {
	size := r.mask + 1
	if free := size - (r.cachedProd - r.cachedCons); free >= want {
		return free
	}
	r.cachedCons = r.cons.Load()
	return size - (r.cachedProd - r.cachedCons)
}

func (r *xdpRing[T]) put(i uint32, d T) { r.descs[(r.cachedProd+i)&r.mask] = d }
func (r *xdpRing[T]) produce(n uint32)  { r.cachedProd += n }
func (r *xdpRing[T]) submit()           { r.prod.Store(r.cachedProd) }
func (r *xdpRing[T]) release(n uint32)  { r.cachedCons += n; r.cons.Store(r.cachedCons) }
func (r *xdpRing[T]) available(max uint32) uint32 {
	r.cachedProd = r.prod.Load()
	return min(r.cachedProd-r.cachedCons, max)
}

func xdpSetsockopt(fd, opt int, val unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(val), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

func xdpGetsockopt(fd, opt int, val unsafe.Pointer, size *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(val), uintptr(unsafe.Pointer(size)), 0)
	if e != 0 {
		return e
	}
	return nil
}
