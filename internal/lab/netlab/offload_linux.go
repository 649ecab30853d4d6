package netlab

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtool commands and the ioctl's argument layouts (linux/ethtool.h).
const (
	ethtoolSTXCSUM = 0x00000017 // set TX checksum offload
	ethtoolSRXCSUM = 0x00000015 // set RX checksum offload
)

type ethtoolValue struct {
	cmd  uint32
	data uint32
}

type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer // *ethtoolValue; a pointer, so the GC sees it
}

// DisableChecksumOffload turns TX and RX checksum offload off on
// interface ifname (as `ethtool -K ifname tx off rx off` does).
//
// Why: a veth that offloads checksums hands the peer frames whose TCP/UDP
// checksum field holds only the pseudo-header sum, to be completed "by the
// hardware" that a veth does not have. The kernel on the far end accepts
// them as already verified, but a frame that an XDP program or an AF_XDP
// data plane forwards, encapsulates or NATs carries the unfinished
// checksum on, and its receiver drops it. Lab senders whose frames cross
// an xdplb data plane must therefore compute full checksums.
func (n *NS) DisableChecksumOffload(ifname string) error {
	return n.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("netlab: %s: socket: %w", n.name, err)
		}
		defer unix.Close(fd)
		for _, cmd := range []uint32{ethtoolSTXCSUM, ethtoolSRXCSUM} {
			v := ethtoolValue{cmd: cmd, data: 0}
			var req ifreqData
			copy(req.name[:unix.IFNAMSIZ-1], ifname)
			req.data = unsafe.Pointer(&v)
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&req))); errno != 0 {
				return fmt.Errorf("netlab: %s: %s: turn checksum offload off: %w", n.name, ifname, errno)
			}
		}
		return nil
	})
}
