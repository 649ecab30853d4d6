//go:build !linux

package node

import "errors"

// MuxCaps and HostAgentCaps are empty outside Linux.
var MuxCaps, HostAgentCaps []uintptr

// DropCapabilities is not supported outside Linux.
func DropCapabilities(keep ...uintptr) error {
	return errors.New("dropping capabilities needs Linux")
}

// ErrCgo is the Linux DropCapabilities' refusal in a cgo binary.
var ErrCgo = errors.New("capabilities are per thread and Go cannot change every thread's in a cgo binary")

// CapNames is empty outside Linux.
func CapNames(caps []uintptr) string { return "" }
