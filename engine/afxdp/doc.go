// Package afxdp is the engine's AF_XDP port: an engine.Port over one AF_XDP
// socket bound to one RX queue of a network interface, with its own UMEM.
// OpenAll opens one port per RX queue; the engine runs one worker per port.
//
// AF_XDP needs Linux (5.4 or later for need_wakeup and ring flags). On other
// systems the package builds, and Open fails with ErrNotSupported ("afxdp:
// AF_XDP needs Linux").
//
// # Getting frames to the socket
//
// A socket receives only what an XDP program on its interface redirects to
// it through an XSKMAP indexed by RX queue. In xdplb that is engine/steer:
// it redirects the data plane's traffic and passes the rest (ARP, BGP, SSH,
// the node's own connections) to the kernel. After Open, put the socket in
// the map: prog.RegisterSocket(port.Queue(), port.FD()). Open resolves the
// interface and binds the socket in the network namespace of the calling
// thread.
//
// # Copy and zero-copy
//
// In zero-copy mode the NIC DMAs straight into the UMEM; in copy mode the
// kernel copies each frame between its own buffers and the UMEM (RX in the
// XDP redirect, TX in sendto). Config.Mode is BindAuto by default: the
// kernel uses zero-copy where the driver supports it and copy mode
// elsewhere; ZeroCopy reports what it chose. veth (the test topology) has
// native XDP but no AF_XDP zero-copy, so tests run in copy mode, and
// BindZeroCopy fails there. An XDP program attached in generic (skb) mode
// also forces copy mode.
//
// # Rings and need_wakeup
//
// Each socket has four single-producer single-consumer rings shared with
// the kernel: fill (free chunks for RX), RX, TX and completion (chunks whose
// transmission finished). The default ring code (RingOwn) reads the
// kernel's index with an atomic load and publishes its own with an atomic
// store, once per batch, working from cached copies in between; free chunks
// are a stack (O(1) alloc and free).
//
// The socket is bound with XDP_USE_NEED_WAKEUP (unless
// Config.DisableNeedWakeup): the kernel sets a flag in a ring when it needs
// a system call to make progress, and the port makes one only then — a
// sendto per batch of transmitted frames when the TX flag is up (always, in
// copy mode, where sendto does the sending), a recvfrom when the fill-ring
// flag is up and nothing arrived. Wait blocks in poll(2), which also gives
// the kernel any wake-up it asked for. Where the kernel allows it (6.17+),
// the copy-mode TX budget is raised to the TX ring size so one sendto sends
// the whole batch.
//
// RingAsavie runs the same port over github.com/asavie/xdp's Socket as it
// is (a scan of every frame to find free ones, a sendto per Transmit call,
// no need_wakeup): it is the baseline the benchmarks compare against.
// asavie's Transmit panics when a sendto fails (but for EINTR, EAGAIN and
// EBUSY); the port recovers that panic and counts the failure as RingOwn
// does, so a deleted interface stops the worker through Check, as it
// does on RingOwn, instead of crashing the process.
//
// # Frame ownership and headroom
//
// A received packet's buffer is its whole UMEM chunk; the frame starts
// after the kernel's XDP_PACKET_HEADROOM (256 bytes), plus UMEM frame
// headroom when Config.Headroom asks for more, so Packet.Prepend has room
// to encapsulate. Transmit sends this port's own chunks without copying,
// from the packet's current offset and length (prepended headers included),
// and marks them sent; frames owned by another port (another socket's UMEM,
// a MemPort) are copied into a free chunk of this UMEM. Chunks the worker
// drops come back through Release. Frames gives the chunk accounting, so
// a test can prove nothing leaked.
//
// # Sizing the UMEM
//
// NumFrames chunks of FrameSize bytes (2048 or 4096) are split between the
// fill ring (filled as far as it goes), packets in the worker's hands, and
// the TX and completion rings; up to 2*engine.MaxBatch chunks are kept off
// the fill ring for copies into the UMEM. A good size is fill + TX ring
// sizes: the 4096 x 2048-byte default (8 MiB per queue) keeps a 2048-entry
// fill ring full while 2048 frames are in flight on the TX side. A
// FrameSize of 2048 carries frames up to 2048-256-(frame headroom) bytes,
// enough for a 1500-byte MTU; larger MTUs need 4096-byte chunks (multi-
// buffer frames are not supported).
//
// # Memory the data path touches
//
// A UMEM of 2 MiB or more (RingOwn) starts on a huge-page boundary and
// is advised for transparent huge pages (MADV_HUGEPAGE; systems in THP
// mode "madvise", a common default, back a mapping with huge pages only
// when asked): the fill ring hands out chunks across the whole UMEM, so
// with 4 KiB pages nearly every frame is also a TLB miss. Receive asks
// the CPU for each frame's first cache line, the line in front of it
// (where an encapsulating stage writes its outer headers) and the line
// after it (where a VXLAN frame's inner headers start) as it takes the
// batch off the RX ring, before any stage runs, so the misses on frames
// the kernel or a NIC has just written overlap instead of stalling the
// parser one frame at a time.
//
// # Failure
//
// When the interface is unregistered (deleted, moved to another
// namespace) the kernel unbinds the socket for good and flags ENETDOWN on
// it; poll(2) reports nothing. Check reads the flag (SO_ERROR) and
// returns an error wrapping ErrPortDown from then on; engine.Worker calls
// it every WorkerConfig.CheckEvery from a goroutine beside the worker
// (the port is an engine.Checker) and stops with the error. Wait also
// returns an error on POLLERR, POLLHUP or POLLNVAL. An interface that is
// only down is not a failure. A failed port is not re-bound: an
// interface that comes back has a new index; open a new port.
//
// # Statistics
//
// Stats may be called from any goroutine: frame, byte, copy, refusal and
// wake-up counts are published by the worker once per Flush, and the
// kernel's XDP_STATISTICS (rx_dropped, rx_ring_full,
// rx_fill_ring_empty_descs, invalid descriptors, ...) are read from the
// socket at call time.
package afxdp
