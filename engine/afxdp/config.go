package afxdp

import (
	"errors"
	"fmt"

	"github.com/xdplb/xdplb/engine"
)

// Ring selects the code that drives a socket's four rings.
type Ring uint8

const (
	// RingOwn is this package's ring code (the default): producer and
	// consumer indices read and written with atomic loads and stores once
	// per batch, an O(1) free-frame stack, need_wakeup honoured, one kick
	// per batch.
	RingOwn Ring = iota
	// RingAsavie adapts github.com/asavie/xdp's Socket as it is (O(frames)
	// free-frame scans, a sendto per Transmit, no need_wakeup). It is kept
	// as the baseline RingOwn is measured against.
	RingAsavie
)

// String returns "own" or "asavie".
func (r Ring) String() string {
	switch r {
	case RingOwn:
		return "own"
	case RingAsavie:
		return "asavie"
	}
	return fmt.Sprintf("Ring(%d)", uint8(r))
}

// MarshalText implements encoding.TextMarshaler ("own", "asavie"), so a
// Ring can be a flag (flag.TextVar) or a configuration value.
func (r Ring) MarshalText() ([]byte, error) {
	if r > RingAsavie {
		return nil, fmt.Errorf("afxdp: unknown ring implementation %d", uint8(r))
	}
	return []byte(r.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (r *Ring) UnmarshalText(b []byte) error {
	switch string(b) {
	case "own", "":
		*r = RingOwn
	case "asavie":
		*r = RingAsavie
	default:
		return fmt.Errorf("afxdp: ring %q: want own or asavie", b)
	}
	return nil
}

// BindMode chooses between copy and zero-copy mode when the socket is bound.
type BindMode uint8

const (
	// BindAuto lets the kernel use zero-copy when the driver supports it
	// for the queue and fall back to copy mode otherwise (the default).
	BindAuto BindMode = iota
	// BindCopy forces copy mode (XDP_COPY): works on every driver.
	BindCopy
	// BindZeroCopy forces zero-copy mode (XDP_ZEROCOPY); Open fails when
	// the driver cannot do it.
	BindZeroCopy
)

// String returns "auto", "copy" or "zerocopy".
func (m BindMode) String() string {
	switch m {
	case BindAuto:
		return "auto"
	case BindCopy:
		return "copy"
	case BindZeroCopy:
		return "zerocopy"
	}
	return fmt.Sprintf("BindMode(%d)", uint8(m))
}

// MarshalText implements encoding.TextMarshaler ("auto", "copy",
// "zerocopy").
func (m BindMode) MarshalText() ([]byte, error) {
	if m > BindZeroCopy {
		return nil, fmt.Errorf("afxdp: unknown bind mode %d", uint8(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *BindMode) UnmarshalText(b []byte) error {
	switch string(b) {
	case "auto", "":
		*m = BindAuto
	case "copy":
		*m = BindCopy
	case "zerocopy", "zero-copy":
		*m = BindZeroCopy
	default:
		return fmt.Errorf("afxdp: bind mode %q: want auto, copy or zerocopy", b)
	}
	return nil
}

// Defaults applied by Config.WithDefaults.
const (
	DefaultNumFrames = 4096
	DefaultFrameSize = 2048
	DefaultRingSize  = 2048
)

// PacketHeadroom is the room the kernel always leaves in front of a
// received frame inside its UMEM chunk (XDP_PACKET_HEADROOM).
const PacketHeadroom = 256

// minDataRoom is the least room a chunk must keep for the frame itself: a
// full Ethernet frame with one VLAN tag.
const minDataRoom = 1518

// maxRingSize bounds the ring sizes accepted by Validate.
const maxRingSize = 1 << 16

// Config describes one AF_XDP port: a socket bound to one RX queue of one
// interface, with its own UMEM. It is a plain value: WithDefaults fills
// zero fields, Validate checks it, Open makes the live port.
type Config struct {
	// Name identifies the port in logs and metrics (default
	// "afxdp:<interface>:<queue>").
	Name string
	// Interface is the interface's name; Ifindex, when non-zero, is used
	// instead. Both are resolved in the network namespace of the thread
	// that calls Open.
	Interface string
	Ifindex   int
	// Queue is the RX queue the socket binds to.
	Queue int

	// NumFrames is the number of UMEM chunks (default 4096). It should be
	// at least FillRingSize plus TXRingSize so the fill ring can stay full
	// while frames are in flight on the TX side.
	NumFrames int
	// FrameSize is the UMEM chunk size: 2048 (default) or 4096.
	FrameSize int
	// Headroom is the least room guaranteed in front of every received
	// frame, for Packet.Prepend (default engine.DefaultHeadroom). The kernel
	// already leaves PacketHeadroom bytes; only the excess is asked of the
	// UMEM as frame headroom.
	Headroom int

	// Ring sizes, powers of two (default 2048 each).
	FillRingSize, CompletionRingSize, RXRingSize, TXRingSize int

	// Mode chooses copy or zero-copy mode (default BindAuto).
	Mode BindMode
	// DisableNeedWakeup binds without XDP_USE_NEED_WAKEUP: the port then
	// kicks the kernel after every transmitted batch. RingOwn only.
	DisableNeedWakeup bool

	// Ring selects the ring implementation (default RingOwn).
	Ring Ring
}

// Errors returned by Validate and Open.
var (
	// ErrNotSupported is returned where AF_XDP is not available.
	ErrNotSupported = errors.New("afxdp: AF_XDP needs Linux")
	// ErrInvalidConfig wraps every Validate failure.
	ErrInvalidConfig = errors.New("afxdp: invalid config")
	// ErrClosed is returned by Stats and Wait on a closed port.
	ErrClosed = errors.New("afxdp: port closed")
	// ErrPortDown is wrapped by the errors of Check and Wait once the
	// socket has failed (its interface was deleted): the port will never
	// receive or send again.
	ErrPortDown = errors.New("afxdp: port down")
)

// DropTXNoFrame is the reason a port gives the frames Transmit refused
// for lack of a free chunk to copy them into (Stats.TXNoFrame); frames
// refused for lack of a TX ring slot keep the engine's default,
// engine.DropTXFull.
var DropTXNoFrame = engine.RegisterDropReason("tx_no_frame")

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.NumFrames == 0 {
		c.NumFrames = DefaultNumFrames
	}
	if c.FrameSize == 0 {
		c.FrameSize = DefaultFrameSize
	}
	if c.Headroom == 0 {
		c.Headroom = engine.DefaultHeadroom
	}
	for _, p := range []*int{&c.FillRingSize, &c.CompletionRingSize, &c.RXRingSize, &c.TXRingSize} {
		if *p == 0 {
			*p = DefaultRingSize
		}
	}
	if c.Name == "" {
		ifname := c.Interface
		if c.Ifindex != 0 {
			ifname = fmt.Sprintf("if%d", c.Ifindex)
		}
		c.Name = fmt.Sprintf("afxdp:%s:%d", ifname, c.Queue)
	}
	return c
}

// Validate checks c after applying defaults.
func (c Config) Validate() error {
	c = c.WithDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if c.Interface == "" && c.Ifindex <= 0 {
		return bad("no interface: set Interface or Ifindex")
	}
	if c.Queue < 0 {
		return bad("queue %d is negative", c.Queue)
	}
	if c.FrameSize != 2048 && c.FrameSize != 4096 {
		return bad("frame size %d: must be 2048 or 4096", c.FrameSize)
	}
	if c.NumFrames < 4*engine.MaxBatch {
		return bad("%d frames: need at least %d", c.NumFrames, 4*engine.MaxBatch)
	}
	if uint64(c.NumFrames)*uint64(c.FrameSize) >= 1<<32 {
		return bad("UMEM of %d x %d bytes: must be under 4 GiB", c.NumFrames, c.FrameSize)
	}
	if c.Headroom < 0 {
		return bad("headroom %d is negative", c.Headroom)
	}
	if room := c.FrameSize - c.chunkHeadroom() - PacketHeadroom; room < minDataRoom {
		return bad("headroom %d leaves %d bytes of a %d-byte chunk for the frame; need %d",
			c.Headroom, room, c.FrameSize, minDataRoom)
	}
	rings := []struct {
		name string
		n    int
	}{
		{"fill", c.FillRingSize}, {"completion", c.CompletionRingSize},
		{"rx", c.RXRingSize}, {"tx", c.TXRingSize},
	}
	for _, r := range rings {
		if r.n < engine.MaxBatch || r.n > maxRingSize || r.n&(r.n-1) != 0 {
			return bad("%s ring size %d: must be a power of two in [%d, %d]", r.name, r.n, engine.MaxBatch, maxRingSize)
		}
	}
	if c.Mode > BindZeroCopy {
		return bad("unknown bind mode %d", c.Mode)
	}
	switch c.Ring {
	case RingOwn:
	case RingAsavie:
		if c.chunkHeadroom() != 0 {
			return bad("RingAsavie cannot reserve UMEM headroom: headroom %d is more than %d", c.Headroom, PacketHeadroom)
		}
	default:
		return bad("unknown ring implementation %d", c.Ring)
	}
	return nil
}

// chunkHeadroom is the UMEM frame headroom to register: what Headroom asks
// beyond the kernel's own PacketHeadroom.
func (c Config) chunkHeadroom() int {
	return max(0, c.Headroom-PacketHeadroom)
}

// Stats are a port's counters. Frame and byte counts are published by the
// worker once per Flush; Kernel is read from the socket when Stats is
// called.
type Stats struct {
	RXFrames, RXBytes uint64
	// TXFrames and TXBytes count frames put on the TX ring, TXCopied those
	// of them copied from another port's buffer.
	TXFrames, TXBytes, TXCopied uint64
	// TXRingFull counts frames Transmit refused for lack of a TX ring slot,
	// TXNoFrame those refused for lack of a free chunk to copy into, and
	// TXTooBig those longer than a chunk.
	TXRingFull, TXNoFrame, TXTooBig uint64
	// Completed counts transmitted frames whose chunks came back.
	Completed uint64
	// TXKicks counts sendto wake-ups, RXKicks recvfrom wake-ups for the
	// fill ring, KickErrors unexpected errors from either.
	TXKicks, RXKicks, KickErrors uint64
	// RXInvalid counts RX descriptors outside the UMEM (never expected).
	RXInvalid uint64
	// Kernel holds the socket's XDP_STATISTICS.
	Kernel KernelStats
}

// KernelStats are the kernel's statistics for one socket
// (getsockopt SOL_XDP/XDP_STATISTICS).
type KernelStats struct {
	// RXDropped counts frames dropped for other reasons than those below
	// (e.g. a frame too large for the chunk).
	RXDropped uint64
	// RXInvalidDescs and TXInvalidDescs count descriptors the kernel
	// refused.
	RXInvalidDescs, TXInvalidDescs uint64
	// RXRingFull counts frames dropped because the RX ring was full.
	RXRingFull uint64
	// RXFillRingEmptyDescs counts frames that found the fill ring empty.
	RXFillRingEmptyDescs uint64
	// TXRingEmptyDescs counts wake-ups that found the TX ring empty.
	TXRingEmptyDescs uint64
}

// Frames says where a port's UMEM chunks are; Free+Kernel+Held+TX is
// always NumFrames.
type Frames struct {
	// Free chunks sit on the port's free stack.
	Free int
	// Kernel chunks are on the fill ring or the RX ring (the kernel's until
	// received).
	Kernel int
	// Held chunks are in packets handed to the worker, not yet transmitted
	// or released.
	Held int
	// TX chunks are on the TX or completion ring.
	TX int
}
