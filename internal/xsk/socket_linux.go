//go:build linux

package xsk

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// OptMaxTXSkbBudget is the socket option (Linux 6.17+) that raises how
// many frames one copy-mode sendto transmits (32 by default).
const OptMaxTXSkbBudget = 9

// Config describes a socket: its UMEM, its rings and where it binds. A
// ring size of 0 leaves that ring out (a TX-only socket has no RX ring);
// the kernel requires the fill and completion rings whatever the socket
// does.
type Config struct {
	// Ifindex and Queue are the interface and queue to bind to, in the
	// calling thread's network namespace.
	Ifindex, Queue int
	// UMEMSize is the UMEM's size in bytes, a multiple of ChunkSize;
	// ChunkSize the size of one UMEM chunk (a power of two, 2048 or
	// 4096); Headroom the headroom the kernel leaves in front of a
	// received frame in its chunk.
	UMEMSize, ChunkSize, Headroom int
	// Ring sizes, powers of two.
	FillRingSize, CompletionRingSize, RXRingSize, TXRingSize int
	// BindFlags are the bind flags: unix.XDP_COPY, unix.XDP_ZEROCOPY or
	// neither (the kernel's choice).
	BindFlags uint16
	// NeedWakeup binds with XDP_USE_NEED_WAKEUP, or without it on kernels
	// that refuse it (before 5.4); Socket.NeedWakeup says which.
	NeedWakeup bool
}

// Socket is a bound AF_XDP socket with its own UMEM and mapped rings. The
// fields are its live state; Close releases all of it.
type Socket struct {
	FD   int
	UMEM []byte
	umem []byte // the mapping UMEM lies in (aligned to a huge page inside it)

	Fill, Comp Ring[uint64]
	RX, TX     Ring[unix.XDPDesc]

	// ZeroCopy says the kernel bound the socket in zero-copy mode;
	// NeedWakeup that it is bound with XDP_USE_NEED_WAKEUP; TXBudget that
	// the copy-mode TX budget was raised to the TX ring's size (best
	// effort, OptMaxTXSkbBudget).
	ZeroCopy, NeedWakeup, TXBudget bool
}

// Open creates the socket, registers a new UMEM, maps the rings and binds
// to cfg's queue, in the calling thread's network namespace. Its errors
// name the step that failed; callers wrap them with their package's
// prefix.
func Open(cfg Config) (_ *Socket, err error) {
	s := &Socket{FD: -1}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.FD, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket(AF_XDP): %w", err)
	}
	if s.umem, s.UMEM, err = mapUMEM(cfg.UMEMSize); err != nil {
		return nil, err
	}
	reg := unix.XDPUmemReg{
		Addr:     uint64(uintptr(unsafe.Pointer(&s.UMEM[0]))),
		Len:      uint64(len(s.UMEM)),
		Size:     uint32(cfg.ChunkSize),
		Headroom: uint32(cfg.Headroom),
	}
	if err := Setsockopt(s.FD, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		return nil, fmt.Errorf("XDP_UMEM_REG: %w", err)
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
		if o.n == 0 {
			continue
		}
		if err := unix.SetsockoptInt(s.FD, unix.SOL_XDP, o.opt, o.n); err != nil {
			return nil, fmt.Errorf("%s: %w", o.name, err)
		}
	}
	var off unix.XDPMmapOffsets
	n := uint32(unsafe.Sizeof(off))
	if err := Getsockopt(s.FD, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), &n); err != nil {
		return nil, fmt.Errorf("XDP_MMAP_OFFSETS: %w", err)
	}
	if n != uint32(unsafe.Sizeof(off)) {
		return nil, errors.New("kernel too old: XDP_MMAP_OFFSETS has no ring flags (need Linux 5.4+)")
	}
	if s.Fill, err = MapRing[uint64](s.FD, unix.XDP_UMEM_PGOFF_FILL_RING, cfg.FillRingSize, &off.Fr, true); err != nil {
		return nil, fmt.Errorf("mmap fill ring: %w", err)
	}
	if s.Comp, err = MapRing[uint64](s.FD, unix.XDP_UMEM_PGOFF_COMPLETION_RING, cfg.CompletionRingSize, &off.Cr, false); err != nil {
		return nil, fmt.Errorf("mmap completion ring: %w", err)
	}
	if cfg.RXRingSize > 0 {
		if s.RX, err = MapRing[unix.XDPDesc](s.FD, unix.XDP_PGOFF_RX_RING, cfg.RXRingSize, &off.Rx, false); err != nil {
			return nil, fmt.Errorf("mmap rx ring: %w", err)
		}
	}
	if cfg.TXRingSize > 0 {
		if s.TX, err = MapRing[unix.XDPDesc](s.FD, unix.XDP_PGOFF_TX_RING, cfg.TXRingSize, &off.Tx, true); err != nil {
			return nil, fmt.Errorf("mmap tx ring: %w", err)
		}
		// Best effort: let one copy-mode sendto drain the whole TX ring.
		s.TXBudget = unix.SetsockoptInt(s.FD, unix.SOL_XDP, OptMaxTXSkbBudget, cfg.TXRingSize) == nil
	}

	flags := cfg.BindFlags
	if cfg.NeedWakeup {
		flags |= unix.XDP_USE_NEED_WAKEUP
	}
	sa := &unix.SockaddrXDP{Flags: flags, Ifindex: uint32(cfg.Ifindex), QueueID: uint32(cfg.Queue)}
	err = Bind(s.FD, sa)
	if err == unix.EINVAL && flags&unix.XDP_USE_NEED_WAKEUP != 0 {
		// Kernels before 5.4 reject the flag; bind without it.
		sa.Flags &^= unix.XDP_USE_NEED_WAKEUP
		err = Bind(s.FD, sa)
	}
	if err != nil {
		return nil, fmt.Errorf("bind to ifindex %d queue %d: %w", cfg.Ifindex, cfg.Queue, err)
	}
	s.NeedWakeup = sa.Flags&unix.XDP_USE_NEED_WAKEUP != 0
	s.ZeroCopy = BoundZeroCopy(s.FD)
	return s, nil
}

// bindBusyRetries and bindBusyWait bound how long Bind waits for a queue
// that is still busy.
const (
	bindBusyRetries = 50
	bindBusyWait    = 20 * time.Millisecond
)

// Bind binds fd, retrying while the queue is busy: the kernel releases a
// closed socket's hold on its queue asynchronously (from a workqueue), so
// reopening a queue right after closing it can briefly fail with EBUSY.
// A queue held by a live socket still fails, after about a second.
func Bind(fd int, sa *unix.SockaddrXDP) error {
	var err error
	for i := 0; i < bindBusyRetries; i++ {
		if err = unix.Bind(fd, sa); err != unix.EBUSY {
			return err
		}
		time.Sleep(bindBusyWait)
	}
	return err
}

// BoundZeroCopy asks the kernel whether fd was bound in zero-copy mode.
func BoundZeroCopy(fd int) bool {
	var opts struct{ flags uint32 }
	n := uint32(unsafe.Sizeof(opts))
	if Getsockopt(fd, unix.XDP_OPTIONS, unsafe.Pointer(&opts), &n) != nil {
		return false
	}
	return opts.flags&unix.XDP_OPTIONS_ZEROCOPY != 0
}

// Close unmaps the rings and the UMEM and closes the socket. The socket is
// closed first so the kernel stops using the rings before they go. It is
// idempotent.
func (s *Socket) Close() error {
	var err error
	if s.FD >= 0 {
		err = unix.Close(s.FD)
		s.FD = -1
	}
	s.Fill.Unmap()
	s.Comp.Unmap()
	s.RX.Unmap()
	s.TX.Unmap()
	if s.umem != nil {
		if e := unix.Munmap(s.umem); err == nil {
			err = e
		}
		s.umem, s.UMEM = nil, nil
	}
	return err
}

// hugePageSize is the transparent huge page size mapUMEM aligns to
// (x86-64 and arm64 with 4 KiB base pages).
const hugePageSize = 2 << 20

// mapUMEM maps a UMEM of size bytes and faults it in. A UMEM of at least
// a huge page starts on a huge-page boundary inside a mapping a huge page
// larger (the rest is never touched, so never backed), and is advised to
// the kernel for transparent huge pages (MADV_HUGEPAGE, which systems in
// THP mode "madvise", a common default, need): frames are spread over
// the whole UMEM, so with 4 KiB pages nearly every frame the data path
// reads is also a TLB miss (8 MiB is 2,048 pages, as many as a core's
// second-level TLB holds). It returns the mapping, to unmap, and the
// UMEM inside it. Advice the kernel refuses (no THP) changes only speed.
func mapUMEM(size int) (mapping, umem []byte, err error) {
	extra := 0
	if size >= hugePageSize {
		extra = hugePageSize
	}
	mapping, err = unix.Mmap(-1, 0, size+extra, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap UMEM of %d bytes: %w", size, err)
	}
	off := 0
	if extra != 0 {
		a := uintptr(unsafe.Pointer(&mapping[0]))
		off = int((a+hugePageSize-1)&^(hugePageSize-1) - a)
		umem = mapping[off : off+size : off+size]
		_ = unix.Madvise(umem, unix.MADV_HUGEPAGE)
	} else {
		umem = mapping[:size:size]
	}
	// Fault it in now (as MAP_POPULATE would have), not frame by frame
	// on the data path; before Linux 5.14 (no MADV_POPULATE_WRITE) by
	// writing to every page.
	if unix.Madvise(umem, unix.MADV_POPULATE_WRITE) != nil {
		for i := 0; i < len(umem); i += unix.Getpagesize() {
			umem[i] = 0
		}
	}
	return mapping, umem, nil
}

// Setsockopt sets SOL_XDP option opt of fd to the size bytes at val.
func Setsockopt(fd, opt int, val unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(val), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Getsockopt reads SOL_XDP option opt of fd into val, of *size bytes;
// *size becomes the length the kernel wrote.
func Getsockopt(fd, opt int, val unsafe.Pointer, size *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(val), uintptr(unsafe.Pointer(size)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// Statistics reads XDP_STATISTICS from fd.
func Statistics(fd int) (unix.XDPStatistics, error) {
	var st unix.XDPStatistics
	n := uint32(unsafe.Sizeof(st))
	if err := Getsockopt(fd, unix.XDP_STATISTICS, unsafe.Pointer(&st), &n); err != nil {
		return unix.XDPStatistics{}, fmt.Errorf("XDP_STATISTICS: %w", err)
	}
	return st, nil
}

// KickTX wakes the kernel to transmit (sendto with no data). It returns 0
// or the errno.
func KickTX(fd int) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return e
}

// KickRX wakes the driver to refill from the fill ring (recvfrom with no
// buffer). It returns 0 or the errno.
func KickRX(fd int) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return e
}
