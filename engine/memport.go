package engine

import (
	"errors"
	"sync"
)

// MemPortConfig configures a MemPort.
type MemPortConfig struct {
	Name string
	// FrameSize is the size of each buffer, headroom included (default 2048).
	FrameSize int
	// Frames is the number of buffers (default 4*MaxBatch).
	Frames int
	// Headroom is the room left before each received frame (default
	// DefaultHeadroom).
	Headroom int
	// Capture keeps a copy of every transmitted frame for Transmitted (for
	// tests; it allocates). Without it only counts are kept.
	Capture bool
}

// MemPort is an in-memory Port for tests, examples and benchmarks. Frames
// to receive are queued with Inject (or replayed endlessly with Replay);
// transmitted frames are counted, and kept when Capture is set. Receive,
// Transmit, Release and Flush are for the one worker that polls the port;
// Inject, Transmitted and Stats may be called from any goroutine.
type MemPort struct {
	cfg  MemPortConfig
	bufs [][]byte
	free []uint64 // stack of free buffer indices

	mu       sync.Mutex
	queue    [][]byte // frames waiting to be received
	captured [][]byte
	txFrames uint64
	txBytes  uint64
	rxFrames uint64
	rxTooBig uint64

	replay    [][]byte
	replayPos int
}

// NewMemPort returns a MemPort.
func NewMemPort(cfg MemPortConfig) (*MemPort, error) {
	if cfg.FrameSize == 0 {
		cfg.FrameSize = 2048
	}
	if cfg.Frames == 0 {
		cfg.Frames = 4 * MaxBatch
	}
	if cfg.Headroom == 0 {
		cfg.Headroom = DefaultHeadroom
	}
	if cfg.Headroom < 0 || cfg.Headroom >= cfg.FrameSize {
		return nil, errors.New("engine: MemPort headroom must be within the frame size")
	}
	if cfg.Frames < MaxBatch {
		return nil, errors.New("engine: MemPort needs at least MaxBatch frames")
	}
	m := &MemPort{cfg: cfg}
	mem := make([]byte, cfg.FrameSize*cfg.Frames)
	for i := 0; i < cfg.Frames; i++ {
		m.bufs = append(m.bufs, mem[i*cfg.FrameSize:(i+1)*cfg.FrameSize:(i+1)*cfg.FrameSize])
		m.free = append(m.free, uint64(i))
	}
	return m, nil
}

// Name returns the configured name.
func (m *MemPort) Name() string { return m.cfg.Name }

// Inject queues copies of frames for Receive.
func (m *MemPort) Inject(frames ...[]byte) {
	m.mu.Lock()
	for _, f := range frames {
		m.queue = append(m.queue, append([]byte(nil), f...))
	}
	m.mu.Unlock()
}

// Replay makes Receive return frames endlessly in order, each copied into
// a fresh buffer as a NIC would write it; a frame longer than a buffer is
// skipped and counted (RXTooBig). It replaces any queued frames. It is
// meant for benchmarks: call it before the worker starts.
func (m *MemPort) Replay(frames [][]byte) {
	m.mu.Lock()
	m.replay = frames
	m.replayPos = 0
	m.queue = nil
	m.mu.Unlock()
}

// Receive implements Port.
func (m *MemPort) Receive(b *Batch, pool []Packet, inPort uint16) int {
	if m.replay != nil {
		return m.receiveReplay(b, pool, inPort)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for len(m.queue) > 0 && b.Cap() > 0 && len(m.free) > 0 && n < len(pool) {
		f := m.queue[0]
		if len(f) > m.cfg.FrameSize-m.cfg.Headroom {
			// Longer than a buffer: dropped and counted, as a NIC counts
			// the frames it cannot receive.
			m.queue[0] = nil
			m.queue = m.queue[1:]
			m.rxTooBig++
			continue
		}
		m.queue[0] = nil
		m.queue = m.queue[1:]
		m.deliver(b, &pool[n], f, inPort)
		n++
	}
	m.rxFrames += uint64(n)
	return n
}

func (m *MemPort) receiveReplay(b *Batch, pool []Packet, inPort uint16) int {
	n := 0
	// skipped counts frames in a row too long for a buffer: a whole turn
	// of them means the replay has nothing to receive.
	for skipped := 0; b.Cap() > 0 && len(m.free) > 0 && n < len(pool) && skipped < len(m.replay); {
		f := m.replay[m.replayPos]
		m.replayPos++
		if m.replayPos == len(m.replay) {
			m.replayPos = 0
		}
		if len(f) > m.cfg.FrameSize-m.cfg.Headroom {
			// Dropped and counted, as Receive does.
			m.mu.Lock()
			m.rxTooBig++
			m.mu.Unlock()
			skipped++
			continue
		}
		skipped = 0
		m.deliver(b, &pool[n], f, inPort)
		n++
	}
	return n
}

func (m *MemPort) deliver(b *Batch, p *Packet, f []byte, inPort uint16) {
	id := m.free[len(m.free)-1]
	m.free = m.free[:len(m.free)-1]
	buf := m.bufs[id]
	copy(buf[m.cfg.Headroom:], f)
	p.SetBuffer(m, id, buf, m.cfg.Headroom, len(f), inPort)
	b.Append(p)
}

// Transmit implements Port. Own frames are taken without copying.
func (m *MemPort) Transmit(pkts []*Packet) int {
	var bytes uint64
	for _, p := range pkts {
		bytes += uint64(p.Len())
		if m.cfg.Capture {
			m.mu.Lock()
			m.captured = append(m.captured, append([]byte(nil), p.Data()...))
			m.mu.Unlock()
		}
		if p.owner == Port(m) {
			p.MarkSent()
			m.free = append(m.free, p.frame)
		}
	}
	m.mu.Lock()
	m.txFrames += uint64(len(pkts))
	m.txBytes += bytes
	m.mu.Unlock()
	return len(pkts)
}

// Release implements Port.
func (m *MemPort) Release(pkts []*Packet) {
	for _, p := range pkts {
		if p.owner == Port(m) && !p.sent {
			m.free = append(m.free, p.frame)
		}
	}
}

// Flush implements Port; a MemPort has nothing queued.
func (m *MemPort) Flush() error { return nil }

// Close implements Port.
func (m *MemPort) Close() error { return nil }

// Transmitted returns and forgets the frames captured so far (with
// Capture set).
func (m *MemPort) Transmitted() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.captured
	m.captured = nil
	return c
}

// MemPortStats are a MemPort's totals.
type MemPortStats struct {
	RXFrames, TXFrames, TXBytes uint64
	// RXTooBig counts injected frames longer than a buffer (FrameSize less
	// Headroom): dropped before the worker sees them.
	RXTooBig uint64
	Queued   int // frames injected and not yet received
}

// Stats returns the port's totals (replayed frames are not counted as RX).
func (m *MemPort) Stats() MemPortStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return MemPortStats{RXFrames: m.rxFrames, TXFrames: m.txFrames, TXBytes: m.txBytes, RXTooBig: m.rxTooBig, Queued: len(m.queue)}
}

// FreeFrames returns how many buffers are free; a test can check that no
// frame leaked once traffic has stopped. Call it only from the polling
// goroutine or once the worker has stopped.
func (m *MemPort) FreeFrames() int { return len(m.free) }
