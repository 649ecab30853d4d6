//go:build linux

package afxdp

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/internal/xsk"
)

// openSocket opens the RingOwn port's socket (internal/xsk) on cfg's
// queue of ifindex, in the calling thread's namespace.
func openSocket(cfg Config, ifindex int) (*xsk.Socket, error) {
	var flags uint16
	switch cfg.Mode {
	case BindCopy:
		flags = unix.XDP_COPY
	case BindZeroCopy:
		flags = unix.XDP_ZEROCOPY
	}
	s, err := xsk.Open(xsk.Config{
		Ifindex:            ifindex,
		Queue:              cfg.Queue,
		UMEMSize:           cfg.NumFrames * cfg.FrameSize,
		ChunkSize:          cfg.FrameSize,
		Headroom:           cfg.chunkHeadroom(),
		FillRingSize:       cfg.FillRingSize,
		CompletionRingSize: cfg.CompletionRingSize,
		RXRingSize:         cfg.RXRingSize,
		TXRingSize:         cfg.TXRingSize,
		BindFlags:          flags,
		NeedWakeup:         !cfg.DisableNeedWakeup,
	})
	if err != nil {
		return nil, fmt.Errorf("afxdp: %w (%s mode)", err, cfg.Mode)
	}
	return s, nil
}

// kernelStats reads XDP_STATISTICS from fd.
func kernelStats(fd int) (KernelStats, error) {
	st, err := xsk.Statistics(fd)
	if err != nil {
		return KernelStats{}, fmt.Errorf("afxdp: %w", err)
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

// transientKickErr reports whether a wake-up error only means "busy, try
// later".
func transientKickErr(e unix.Errno) bool {
	switch e {
	case 0, unix.EAGAIN, unix.EBUSY, unix.ENOBUFS, unix.EINTR, unix.ENETDOWN:
		return true
	}
	return false
}
