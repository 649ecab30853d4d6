//go:build linux

package afxdp

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/internal/prefetch"
	"github.com/xdplb/xdplb/internal/xsk"
)

// Counter indices: the worker counts into Port.c and publishes to Port.pub.
const (
	cRXFrames = iota
	cRXBytes
	cTXFrames
	cTXBytes
	cTXCopied
	cTXRingFull
	cTXNoFrame
	cTXTooBig
	cCompleted
	cTXKicks
	cRXKicks
	cKickErrors
	cRXInvalid
	nCounters
)

// maxKicks bounds the sendto calls one Flush makes while a copy-mode socket
// keeps answering EAGAIN.
const maxKicks = 4

// Port is an engine.Port over one AF_XDP socket bound to one RX queue. Its
// UMEM is private to the socket. Receive, Transmit, Release, Flush and Wait
// are for the one worker polling the port; Stats may be called from any
// goroutine; Close only once the worker has stopped.
type Port struct {
	cfg     Config
	ifindex int
	fd      int

	s *xsk.Socket // RingOwn
	a *asavieSock // RingAsavie

	umem      []byte
	frameSize uint64
	chunkMask uint64 // frameSize-1: addr &^ chunkMask is the chunk's base
	copyOff   uint64 // where a copied frame starts in its chunk

	free     []uint64 // stack of free chunk base addresses, cap NumFrames
	reserve  int      // free chunks the fill ring leaves for TX copies
	inKernel int      // chunks on the fill or RX ring
	held     int      // chunks in packets the worker holds
	inTX     int      // chunks on the TX or completion ring
	txQueued uint32   // TX descriptors written but not yet published

	pfd [1]unix.PollFd

	c   [nCounters]uint64        // worker-local counts
	pub [nCounters]atomic.Uint64 // published by Flush

	mu     sync.RWMutex // orders Close against Stats and Check
	closed bool
	down   atomic.Pointer[error] // the first failure Check saw
}

var _ engine.Port = (*Port)(nil)
var _ engine.Waiter = (*Port)(nil)
var _ engine.Checker = (*Port)(nil)

// Open creates the socket described by cfg and fills its fill ring. The
// interface is resolved and the socket bound in the network namespace of
// the calling thread. Frames reach the socket only once an XDP program on
// the interface redirects them to it (see FD).
func Open(cfg Config) (*Port, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	ifindex := cfg.Ifindex
	if ifindex == 0 {
		ifi, err := net.InterfaceByName(cfg.Interface)
		if err != nil {
			return nil, fmt.Errorf("afxdp: %w", err)
		}
		ifindex = ifi.Index
	}
	p := newPort(cfg, ifindex)
	switch cfg.Ring {
	case RingAsavie:
		a, err := openAsavie(cfg, ifindex)
		if err != nil {
			return nil, err
		}
		p.a, p.fd, p.umem = a, a.x.FD(), a.umem
		a.fillUp()
	default:
		s, err := openSocket(cfg, ifindex)
		if err != nil {
			return nil, err
		}
		p.useSocket(s)
	}
	return p, nil
}

func newPort(cfg Config, ifindex int) *Port {
	return &Port{
		cfg:       cfg,
		ifindex:   ifindex,
		fd:        -1,
		frameSize: uint64(cfg.FrameSize),
		chunkMask: uint64(cfg.FrameSize - 1),
		copyOff:   uint64(cfg.chunkHeadroom() + PacketHeadroom),
	}
}

// useSocket makes s the port's socket (RingOwn): every chunk starts on the
// free stack, then the fill ring is filled.
func (p *Port) useSocket(s *xsk.Socket) {
	p.s, p.fd, p.umem = s, s.FD, s.UMEM
	n := p.cfg.NumFrames
	p.reserve = min(2*engine.MaxBatch, n/4)
	p.free = make([]uint64, n)
	for i := range p.free {
		p.free[i] = uint64(n-1-i) * p.frameSize
	}
	p.refill()
}

// OpenAll opens one port per RX queue of cfg's interface (cfg.Queue is
// ignored). Each port's name is cfg.Name (or the default) with the queue
// appended. On error every port opened so far is closed.
func OpenAll(cfg Config) ([]*Port, error) {
	ifname := cfg.Interface
	if cfg.Ifindex != 0 {
		ifi, err := net.InterfaceByIndex(cfg.Ifindex)
		if err != nil {
			return nil, fmt.Errorf("afxdp: %w", err)
		}
		ifname = ifi.Name
	}
	n, err := QueueCount(ifname)
	if err != nil {
		return nil, err
	}
	ports := make([]*Port, 0, n)
	for q := 0; q < n; q++ {
		c := cfg
		c.Queue = q
		if cfg.Name != "" {
			c.Name = fmt.Sprintf("%s:%d", cfg.Name, q)
		}
		p, err := Open(c)
		if err != nil {
			for _, o := range ports {
				_ = o.Close()
			}
			return nil, fmt.Errorf("afxdp: queue %d of %s: %w", q, ifname, err)
		}
		ports = append(ports, p)
	}
	return ports, nil
}

// Name implements engine.Port.
func (p *Port) Name() string { return p.cfg.Name }

// Config returns the port's configuration with defaults applied.
func (p *Port) Config() Config { return p.cfg }

// FD returns the socket's file descriptor, to be put in the XSKMAP of the
// XDP program that redirects to it (index Queue).
func (p *Port) FD() int { return p.fd }

// Queue returns the RX queue the socket is bound to.
func (p *Port) Queue() int { return p.cfg.Queue }

// Ifindex returns the interface's index.
func (p *Port) Ifindex() int { return p.ifindex }

// ZeroCopy reports whether the kernel bound the socket in zero-copy mode.
func (p *Port) ZeroCopy() bool {
	if p.a != nil {
		return xsk.BoundZeroCopy(p.fd)
	}
	return p.s.ZeroCopy
}

// NeedWakeup reports whether the socket uses XDP_USE_NEED_WAKEUP, so it
// makes system calls only when the kernel asks for them.
func (p *Port) NeedWakeup() bool { return p.s != nil && p.s.NeedWakeup }

// Receive implements engine.Port: it takes up to b.Cap() frames off the RX
// ring, as packets whose buffer is the whole UMEM chunk, so the headroom in
// front of the frame is available to Prepend.
func (p *Port) Receive(b *engine.Batch, pool []engine.Packet, inPort uint16) int {
	if p.a != nil {
		return p.a.receive(p, b, pool, inPort)
	}
	want := min(b.Cap(), len(pool))
	if want <= 0 {
		return 0
	}
	s := p.s
	n := s.RX.Available(uint32(want))
	if n == 0 {
		if s.NeedWakeup && s.Fill.NeedWakeup() {
			p.c[cRXKicks]++
			if !transientKickErr(xsk.KickRX(s.FD)) {
				p.c[cKickErrors]++
			}
		}
		return 0
	}
	fs := p.frameSize
	got := 0
	var bytes uint64
	for i := uint32(0); i < n; i++ {
		d := s.RX.At(i)
		base := d.Addr &^ p.chunkMask
		off := d.Addr - base
		if base+fs > uint64(len(p.umem)) || off+uint64(d.Len) > fs {
			p.c[cRXInvalid]++ // the kernel never does this
			if base+fs <= uint64(len(p.umem)) {
				p.free = append(p.free, base)
			}
			continue
		}
		prefetch.Frame(unsafe.Pointer(&p.umem[d.Addr]))
		pk := &pool[got]
		pk.SetBuffer(p, base, p.umem[base:base+fs:base+fs], int(off), int(d.Len), inPort)
		b.Append(pk)
		got++
		bytes += uint64(d.Len)
	}
	s.RX.Release(n)
	p.inKernel -= int(n)
	p.held += got
	p.c[cRXFrames] += uint64(got)
	p.c[cRXBytes] += bytes
	return got
}

// Transmit implements engine.Port. Frames in this port's UMEM go on the TX
// ring as they are (zero-copy; the descriptor starts at the packet's
// current offset, so prepended headers are sent); other frames are copied
// into a free chunk. It takes a prefix of pkts; frames it can never send (a
// length of 0 or more than a chunk) are moved behind that prefix, so the
// worker drops them. Once a copy finds no free chunk it takes no more
// frames, and gives those it left (too-big ones aside) the reason
// DropTXNoFrame. Nothing reaches the kernel before Flush.
func (p *Port) Transmit(pkts []*engine.Packet) int {
	if p.a != nil {
		return p.a.transmit(p, pkts)
	}
	if len(pkts) == 0 {
		return 0
	}
	s := p.s
	want := uint32(len(pkts))
	slots := s.TX.FreeSlots(want)
	if slots < want && p.inTX > 0 {
		p.pushTX() // a copy-mode kernel frees slots only when kicked
		p.reap()
		slots = s.TX.FreeSlots(want)
	}
	fs := p.frameSize
	last := len(pkts)
	var i uint32
	var bytes uint64
	noFrame := false
	for int(i) < last && i < slots {
		pk := pkts[i]
		n := pk.Len()
		if n <= 0 || uint64(n) > fs {
			last--
			pkts[i], pkts[last] = pkts[last], pkts[i]
			pkts[last].Reason = engine.DropTXTooBig
			p.c[cTXTooBig]++
			continue
		}
		var d unix.XDPDesc
		if owner, frame := pk.Owner(); owner == engine.Port(p) {
			d = unix.XDPDesc{Addr: frame + uint64(pk.Headroom()), Len: uint32(n)}
			pk.MarkSent()
			p.held--
		} else if d, noFrame = p.copyIn(pk.Data()); noFrame {
			break
		}
		s.TX.Put(i, d)
		bytes += uint64(n)
		i++
	}
	s.TX.Produce(i)
	p.txQueued += i
	p.inTX += int(i)
	p.c[cTXFrames] += uint64(i)
	p.c[cTXBytes] += bytes
	p.refuseRest(pkts, int(i), last, noFrame)
	return int(i)
}

// refuseRest counts and gives their reasons to the frames pkts[from:last]
// a Transmit that stopped early did not reach: those no chunk can hold
// are refused as too big (sortOutTooBig), not for what ran out; the others
// for what did — no free chunk to copy into (noFrame: DropTXNoFrame) or
// no TX ring slot (the worker's default reason, DropTXFull).
func (p *Port) refuseRest(pkts []*engine.Packet, from, last int, noFrame bool) {
	if from >= last {
		return
	}
	last = p.sortOutTooBig(pkts, from, last)
	rest := uint64(last - from)
	if !noFrame {
		p.c[cTXRingFull] += rest
		return
	}
	p.c[cTXNoFrame] += rest
	for _, pk := range pkts[from:last] {
		pk.Reason = DropTXNoFrame
	}
}

// sortOutTooBig moves the frames of pkts[from:last] that no chunk can
// hold (empty, or longer than a chunk) behind the others, with the reason
// DropTXTooBig, and returns the new last.
func (p *Port) sortOutTooBig(pkts []*engine.Packet, from, last int) int {
	for j := from; j < last; {
		if n := pkts[j].Len(); n <= 0 || uint64(n) > p.frameSize {
			last--
			pkts[j], pkts[last] = pkts[last], pkts[j]
			pkts[last].Reason = engine.DropTXTooBig
			p.c[cTXTooBig]++
			continue
		}
		j++
	}
	return last
}

// copyIn copies frame into a free chunk and returns its descriptor, or
// true when no chunk is free even after reaping completions.
func (p *Port) copyIn(frame []byte) (unix.XDPDesc, bool) {
	if len(p.free) == 0 {
		p.reap()
		if len(p.free) == 0 {
			return unix.XDPDesc{}, true
		}
	}
	base := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	n := uint64(len(frame))
	off := min(p.copyOff, p.frameSize-n)
	copy(p.umem[base+off:base+off+n], frame)
	p.c[cTXCopied]++
	return unix.XDPDesc{Addr: base + off, Len: uint32(n)}, false
}

// Release implements engine.Port: own chunks go back on the free stack.
func (p *Port) Release(pkts []*engine.Packet) {
	if p.a != nil {
		p.a.release(p, pkts)
		return
	}
	for _, pk := range pkts {
		owner, frame := pk.Owner()
		if owner != engine.Port(p) || pk.Sent() || len(p.free) == cap(p.free) {
			continue
		}
		p.free = append(p.free, frame&^p.chunkMask)
		p.held--
	}
}

// Flush implements engine.Port: it tops up the fill ring, publishes the TX
// ring and wakes the kernel if it needs it, reclaims completed chunks,
// tops up the fill ring with them and publishes the counters.
func (p *Port) Flush() error {
	if p.a != nil {
		p.a.flush(p)
		p.publish()
		return nil
	}
	// The fill ring is topped up before the batch goes out, not only
	// after: the answers to what is sent now (a peer's next request) can
	// arrive before this returns, and the ring must have room for them.
	// With the refill after the transmit only, a window of requests half
	// the fill ring's size could empty it (TestReflect/own/small-rings
	// under load: the kernel's rx_fill_ring_empty_descs, one frame lost).
	p.refill()
	if p.inTX > 0 {
		p.pushTX()
		p.reap()
		p.refill() // the chunks the transmit just completed
	}
	p.publish()
	return nil
}

// pushTX publishes queued TX descriptors and kicks the kernel when it has
// descriptors left to consume and (with need_wakeup) asked for a kick. A
// copy-mode kick transmits synchronously up to the kernel's budget and
// answers EAGAIN when descriptors remain, so it is repeated a few times.
func (p *Port) pushTX() {
	s := p.s
	if p.txQueued > 0 {
		s.TX.Submit()
		p.txQueued = 0
	}
	for try := 0; try < maxKicks; try++ {
		if !s.TX.Unconsumed() {
			return
		}
		if s.NeedWakeup && !s.TX.NeedWakeup() {
			return
		}
		p.c[cTXKicks]++
		e := xsk.KickTX(s.FD)
		if !transientKickErr(e) {
			p.c[cKickErrors]++
			return
		}
		if s.ZeroCopy || e != unix.EAGAIN {
			return
		}
		p.reap() // EAGAIN may mean a full completion ring
	}
}

// reap moves completed TX chunks back to the free stack.
func (p *Port) reap() {
	s := p.s
	n := s.Comp.Available(s.Comp.Size())
	if n == 0 {
		return
	}
	for i := uint32(0); i < n; i++ {
		p.free = append(p.free, *s.Comp.At(i)&^p.chunkMask)
	}
	s.Comp.Release(n)
	p.inTX -= int(n)
	p.c[cCompleted] += uint64(n)
}

// refill moves free chunks to the fill ring, keeping p.reserve chunks for
// TX copies. It tops the ring up on every call: the kernel drops a frame
// that finds the fill ring empty, and it can take a whole window of frames
// from the ring before the worker next runs, so a refill held back to save
// one producer store per batch costs frames when the worker is descheduled.
func (p *Port) refill() {
	spare := len(p.free) - p.reserve
	if spare <= 0 {
		return
	}
	s := p.s
	n := min(s.Fill.FreeSlots(uint32(spare)), uint32(spare))
	if n == 0 {
		return
	}
	top := len(p.free)
	for i := uint32(0); i < n; i++ {
		s.Fill.Put(i, p.free[top-1-int(i)])
	}
	p.free = p.free[:top-int(n)]
	s.Fill.Produce(n)
	s.Fill.Submit()
	p.inKernel += int(n)
}

// publish copies changed counters to their atomics.
func (p *Port) publish() {
	for i := range p.c {
		if v := p.c[i]; p.pub[i].Load() != v {
			p.pub[i].Store(v)
		}
	}
}

// Wait implements engine.Waiter: it blocks up to timeoutMs for received
// frames with poll(2), which also gives the kernel any wake-up it asked for.
func (p *Port) Wait(timeoutMs int) error {
	if p.fd < 0 {
		return ErrClosed
	}
	if p.s != nil && p.s.RX.Available(1) > 0 {
		return nil
	}
	p.pfd[0] = unix.PollFd{Fd: int32(p.fd), Events: unix.POLLIN}
	_, err := unix.Poll(p.pfd[:], timeoutMs)
	if err != nil && err != unix.EINTR {
		return fmt.Errorf("afxdp: %s: poll: %w", p.cfg.Name, err)
	}
	if re := p.pfd[0].Revents; re&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
		if err := p.Check(); err != nil {
			return err
		}
		return fmt.Errorf("%w: %s: poll reports %#x (error, hang-up or invalid descriptor)", ErrPortDown, p.cfg.Name, re)
	}
	return nil
}

// Check reports whether the socket still works: it returns an error
// wrapping ErrPortDown once the kernel has flagged an error on the socket
// (SO_ERROR) — which it does when the interface is unregistered (deleted,
// moved to another namespace, its driver unloaded): the socket is then
// unbound, and receives and sends nothing ever again, even when an
// interface of the same name comes back. The first failure is kept and
// returned by every later call. An interface that is merely down is not a
// failure. Check is a getsockopt, safe from any goroutine, meant to be
// called periodically off the packet path (engine.Worker does it for
// every port that has a Check method); a closed port returns ErrClosed.
func (p *Port) Check() error {
	if err := p.down.Load(); err != nil {
		return *err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	if err := p.down.Load(); err != nil {
		return *err
	}
	code, err := unix.GetsockoptInt(p.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	var down error
	switch {
	case err != nil:
		down = fmt.Errorf("%w: %s: getsockopt(SO_ERROR): %w", ErrPortDown, p.cfg.Name, err)
	case code != 0:
		down = fmt.Errorf("%w: %s (interface index %d): socket error: %w (the interface was deleted or moved)",
			ErrPortDown, p.cfg.Name, p.ifindex, unix.Errno(code))
	default:
		return nil
	}
	p.down.CompareAndSwap(nil, &down)
	return *p.down.Load()
}

// Frames says where the port's chunks are. Call it from the polling
// goroutine or once the worker has stopped: after traffic stops and a few
// Flushes, Held and TX are 0 and Free+Kernel is NumFrames.
func (p *Port) Frames() Frames {
	if p.a != nil {
		return p.a.frames(p)
	}
	return Frames{Free: len(p.free), Kernel: p.inKernel, Held: p.held, TX: p.inTX}
}

// Stats returns the port's counters as last published by Flush and the
// kernel's statistics for the socket. It is safe to call from any
// goroutine.
func (p *Port) Stats() (Stats, error) {
	st := Stats{
		RXFrames:   p.pub[cRXFrames].Load(),
		RXBytes:    p.pub[cRXBytes].Load(),
		TXFrames:   p.pub[cTXFrames].Load(),
		TXBytes:    p.pub[cTXBytes].Load(),
		TXCopied:   p.pub[cTXCopied].Load(),
		TXRingFull: p.pub[cTXRingFull].Load(),
		TXNoFrame:  p.pub[cTXNoFrame].Load(),
		TXTooBig:   p.pub[cTXTooBig].Load(),
		Completed:  p.pub[cCompleted].Load(),
		TXKicks:    p.pub[cTXKicks].Load(),
		RXKicks:    p.pub[cRXKicks].Load(),
		KickErrors: p.pub[cKickErrors].Load(),
		RXInvalid:  p.pub[cRXInvalid].Load(),
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return st, ErrClosed
	}
	k, err := kernelStats(p.fd)
	st.Kernel = k
	return st, err
}

// Close implements engine.Port: it closes the socket and unmaps its rings
// and UMEM. The worker must have stopped; packets still pointing into the
// UMEM must not be used afterwards. Close is idempotent.
func (p *Port) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var err error
	if p.a != nil {
		err = p.a.close()
	} else {
		err = p.s.Close()
	}
	p.fd = -1
	p.umem = nil
	return err
}
