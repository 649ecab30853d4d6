//go:build linux

package afxdp

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// xdpMaxTXSkbBudget is the socket option (Linux 6.17+) that raises how many
// frames one copy-mode sendto transmits (32 by default).
const xdpMaxTXSkbBudget = 9

// socket is a bound AF_XDP socket with its own UMEM and mapped rings.
type socket struct {
	fd   int
	umem []byte

	fill, comp ring[uint64]
	rx, tx     ring[unix.XDPDesc]

	zeroCopy   bool
	needWakeup bool
	txBudget   bool // the copy-mode TX budget was raised to the ring size
}

// openSocket creates the socket, registers the UMEM, maps the rings and
// binds to cfg's queue of ifindex, in the calling thread's namespace.
func openSocket(cfg Config, ifindex int) (_ *socket, err error) {
	s := &socket{fd: -1}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	s.fd, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("afxdp: socket(AF_XDP): %w", err)
	}
	s.umem, err = unix.Mmap(-1, 0, cfg.NumFrames*cfg.FrameSize,
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("afxdp: mmap UMEM: %w", err)
	}
	reg := unix.XDPUmemReg{
		Addr:     uint64(uintptr(unsafe.Pointer(&s.umem[0]))),
		Len:      uint64(len(s.umem)),
		Size:     uint32(cfg.FrameSize),
		Headroom: uint32(cfg.chunkHeadroom()),
	}
	if err := setsockopt(s.fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		return nil, fmt.Errorf("afxdp: XDP_UMEM_REG: %w", err)
	}
	for _, o := range []struct {
		opt  int
		n    int
		name string
	}{
		{unix.XDP_UMEM_FILL_RING, cfg.FillRingSize, "XDP_UMEM_FILL_RING"},
		{unix.XDP_UMEM_COMPLETION_RING, cfg.CompletionRingSize, "XDP_UMEM_COMPLETION_RING"},
		{unix.XDP_RX_RING, cfg.RXRingSize, "XDP_RX_RING"},
		{unix.XDP_TX_RING, cfg.TXRingSize, "XDP_TX_RING"},
	} {
		if err := unix.SetsockoptInt(s.fd, unix.SOL_XDP, o.opt, o.n); err != nil {
			return nil, fmt.Errorf("afxdp: %s: %w", o.name, err)
		}
	}
	var off unix.XDPMmapOffsets
	n := uint32(unsafe.Sizeof(off))
	if err := getsockopt(s.fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), &n); err != nil {
		return nil, fmt.Errorf("afxdp: XDP_MMAP_OFFSETS: %w", err)
	}
	if n != uint32(unsafe.Sizeof(off)) {
		return nil, errors.New("afxdp: kernel too old: XDP_MMAP_OFFSETS has no ring flags (need Linux 5.4+)")
	}
	if s.fill, err = mapRing[uint64](s.fd, unix.XDP_UMEM_PGOFF_FILL_RING, cfg.FillRingSize, &off.Fr, true); err != nil {
		return nil, fmt.Errorf("afxdp: mmap fill ring: %w", err)
	}
	if s.comp, err = mapRing[uint64](s.fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, cfg.CompletionRingSize, &off.Cr, false); err != nil {
		return nil, fmt.Errorf("afxdp: mmap completion ring: %w", err)
	}
	if s.rx, err = mapRing[unix.XDPDesc](s.fd, unix.XDP_PGOFF_RX_RING, cfg.RXRingSize, &off.Rx, false); err != nil {
		return nil, fmt.Errorf("afxdp: mmap rx ring: %w", err)
	}
	if s.tx, err = mapRing[unix.XDPDesc](s.fd, unix.XDP_PGOFF_TX_RING, cfg.TXRingSize, &off.Tx, true); err != nil {
		return nil, fmt.Errorf("afxdp: mmap tx ring: %w", err)
	}
	// Best effort: let one copy-mode sendto drain the whole TX ring.
	s.txBudget = unix.SetsockoptInt(s.fd, unix.SOL_XDP, xdpMaxTXSkbBudget, cfg.TXRingSize) == nil

	var flags uint16
	switch cfg.Mode {
	case BindCopy:
		flags |= unix.XDP_COPY
	case BindZeroCopy:
		flags |= unix.XDP_ZEROCOPY
	}
	if !cfg.DisableNeedWakeup {
		flags |= unix.XDP_USE_NEED_WAKEUP
	}
	sa := &unix.SockaddrXDP{Flags: flags, Ifindex: uint32(ifindex), QueueID: uint32(cfg.Queue)}
	err = bind(s.fd, sa)
	if err == unix.EINVAL && flags&unix.XDP_USE_NEED_WAKEUP != 0 {
		// Kernels before 5.4 reject the flag; bind without it.
		sa.Flags &^= unix.XDP_USE_NEED_WAKEUP
		err = bind(s.fd, sa)
	}
	if err != nil {
		return nil, fmt.Errorf("afxdp: bind to ifindex %d queue %d (%s mode): %w", ifindex, cfg.Queue, cfg.Mode, err)
	}
	s.needWakeup = sa.Flags&unix.XDP_USE_NEED_WAKEUP != 0
	s.zeroCopy = socketZeroCopy(s.fd)
	return s, nil
}

// bindBusyRetries and bindBusyWait bound how long bind waits for a queue
// that is still busy.
const (
	bindBusyRetries = 50
	bindBusyWait    = 20 * time.Millisecond
)

// bind binds fd, retrying while the queue is busy: the kernel releases a
// closed socket's hold on its queue asynchronously (from a workqueue), so
// reopening a queue right after closing it can briefly fail with EBUSY.
// A queue held by a live socket still fails, after about a second.
func bind(fd int, sa *unix.SockaddrXDP) error {
	var err error
	for i := 0; i < bindBusyRetries; i++ {
		if err = unix.Bind(fd, sa); err != unix.EBUSY {
			return err
		}
		time.Sleep(bindBusyWait)
	}
	return err
}

// socketZeroCopy asks the kernel whether fd was bound in zero-copy mode.
func socketZeroCopy(fd int) bool {
	var opts struct{ flags uint32 }
	n := uint32(unsafe.Sizeof(opts))
	if getsockopt(fd, unix.XDP_OPTIONS, unsafe.Pointer(&opts), &n) != nil {
		return false
	}
	return opts.flags&unix.XDP_OPTIONS_ZEROCOPY != 0
}

// close unmaps the rings and the UMEM and closes the socket. The socket is
// closed first so the kernel stops using the rings before they go.
func (s *socket) close() error {
	var err error
	if s.fd >= 0 {
		err = unix.Close(s.fd)
		s.fd = -1
	}
	s.fill.unmap()
	s.comp.unmap()
	s.rx.unmap()
	s.tx.unmap()
	if s.umem != nil {
		if e := unix.Munmap(s.umem); err == nil {
			err = e
		}
		s.umem = nil
	}
	return err
}

func setsockopt(fd, opt int, val unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(val), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getsockopt(fd, opt int, val unsafe.Pointer, size *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(val), uintptr(unsafe.Pointer(size)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// kernelStats reads XDP_STATISTICS from fd.
func kernelStats(fd int) (KernelStats, error) {
	var st unix.XDPStatistics
	n := uint32(unsafe.Sizeof(st))
	if err := getsockopt(fd, unix.XDP_STATISTICS, unsafe.Pointer(&st), &n); err != nil {
		return KernelStats{}, fmt.Errorf("afxdp: XDP_STATISTICS: %w", err)
	}
	return KernelStats{
		RXDropped:            st.Rx_dropped,
		RXInvalidDescs:       st.Rx_invalid_descs,
		TXInvalidDescs:       st.Tx_invalid_descs,
		RXRingFull:           st.Rx_ring_full,
		RXFillRingEmptyDescs: st.Rx_fill_ring_empty_descs,
		TXRingEmptyDescs:     st.Tx_ring_empty_descs,
	}, nil
}

// kickTX wakes the kernel to transmit (sendto with no data). It returns 0
// or the errno.
func kickTX(fd int) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return e
}

// kickRX wakes the driver to refill from the fill ring (recvfrom with no
// buffer). It returns 0 or the errno.
func kickRX(fd int) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return e
}

// transientKickErr reports whether a wake-up error only means "busy, try
// later".
func transientKickErr(e unix.Errno) bool {
	switch e {
	case 0, unix.EAGAIN, unix.EBUSY, unix.ENOBUFS, unix.EINTR, unix.ENETDOWN:
		return true
	}
	return false
}
