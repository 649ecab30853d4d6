//go:build !linux

package hostagent

import (
	"errors"
	"syscall"
)

// bindToDevice fails: binding a socket to an interface (SO_BINDTODEVICE)
// is Linux's, as is the rest of the data path.
func bindToDevice(ifname string) func(network, address string, c syscall.RawConn) error {
	return func(string, string, syscall.RawConn) error {
		return errors.New("hostagent: probing through a VM port needs Linux (SO_BINDTODEVICE)")
	}
}
