package hostagent

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// bindToDevice returns a net.Dialer Control function that binds the socket
// to the interface ifname (SO_BINDTODEVICE): its packets leave through
// ifname whatever the routes say, and only packets arriving on ifname
// reach it.
func bindToDevice(ifname string) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, ifname)
		}); err != nil {
			return err
		}
		return serr
	}
}
