//go:build linux

package afxdp

import (
	"fmt"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtool ETHTOOL_GCHANNELS request and reply (linux/ethtool.h).
const ethtoolGChannels = 0x3c

type ethtoolChannels struct {
	cmd                                         uint32
	maxRX, maxTX, maxOther, maxCombined         uint32
	rxCount, txCount, otherCount, combinedCount uint32
}

// ifreqData is struct ifreq with ifr_data, for SIOCETHTOOL.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [16]byte
}

// QueueCount returns the number of RX queues of the interface: the
// ethtool channel counts (rx + combined) in the calling thread's network
// namespace, else the rx-* entries under /sys/class/net, else 1.
func QueueCount(ifname string) (int, error) {
	if len(ifname) == 0 || len(ifname) >= unix.IFNAMSIZ {
		return 0, fmt.Errorf("afxdp: bad interface name %q", ifname)
	}
	n, err := ethtoolRXQueues(ifname)
	if err == unix.ENODEV {
		return 0, fmt.Errorf("afxdp: interface %s: %w", ifname, err)
	}
	if err == nil && n > 0 {
		return n, nil
	}
	ents, err := filepath.Glob(filepath.Join("/sys/class/net", ifname, "queues", "rx-*"))
	if err == nil && len(ents) > 0 {
		return len(ents), nil
	}
	return 1, nil
}

func ethtoolRXQueues(ifname string) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	ch := ethtoolChannels{cmd: ethtoolGChannels}
	var ifr ifreqData
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(&ch)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	if e != 0 {
		return 0, e
	}
	return int(ch.rxCount + ch.combinedCount), nil
}
