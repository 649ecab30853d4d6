//go:build !linux

package steer

import (
	"net/netip"

	"github.com/cilium/ebpf"
)

// Program is the loaded steering program; on this system Load fails with
// ErrNotSupported, so no Program exists, and every method of the zero
// value fails the same way.
type Program struct{}

// Load returns ErrNotSupported: the steering program needs Linux.
func Load(opts Options) (*Program, error) { return nil, ErrNotSupported }

// Options returns the zero Options.
func (p *Program) Options() Options { return Options{} }

// ProgramFD returns -1.
func (p *Program) ProgramFD() int { return -1 }

// XSKMap returns nil.
func (p *Program) XSKMap() *ebpf.Map { return nil }

// Attach returns ErrNotSupported.
func (p *Program) Attach(ifindex int, mode AttachMode) error { return ErrNotSupported }

// Detach returns nil: nothing is attached.
func (p *Program) Detach() error { return nil }

// Close returns nil: nothing is held.
func (p *Program) Close() error { return nil }

// RegisterSocket returns ErrNotSupported.
func (p *Program) RegisterSocket(queue int, fd int) error { return ErrNotSupported }

// UnregisterSocket returns ErrNotSupported.
func (p *Program) UnregisterSocket(queue int) error { return ErrNotSupported }

// Stats returns ErrNotSupported.
func (p *Program) Stats() (Stats, error) { return Stats{}, ErrNotSupported }

// SteerDst returns ErrNotSupported.
func (p *Program) SteerDst(addr netip.Addr, proto uint8, port uint16) error { return ErrNotSupported }

// UnsteerDst returns ErrNotSupported.
func (p *Program) UnsteerDst(addr netip.Addr, proto uint8, port uint16) error {
	return ErrNotSupported
}

// SteerVXLAN returns ErrNotSupported.
func (p *Program) SteerVXLAN(local netip.Addr, port uint16) error { return ErrNotSupported }

// UnsteerVXLAN returns ErrNotSupported.
func (p *Program) UnsteerVXLAN(local netip.Addr, port uint16) error { return ErrNotSupported }

// SteerSrc returns ErrNotSupported.
func (p *Program) SteerSrc(dip netip.Addr, port uint16) error { return ErrNotSupported }

// UnsteerSrc returns ErrNotSupported.
func (p *Program) UnsteerSrc(dip netip.Addr, port uint16) error { return ErrNotSupported }

// AddInfraPrefix returns ErrNotSupported.
func (p *Program) AddInfraPrefix(pfx netip.Prefix) error { return ErrNotSupported }

// RemoveInfraPrefix returns ErrNotSupported.
func (p *Program) RemoveInfraPrefix(pfx netip.Prefix) error { return ErrNotSupported }

// Config returns the zero Config.
func (p *Program) Config() Config { return Config{} }

// Sync returns ErrNotSupported.
func (p *Program) Sync(desired Config) error { return ErrNotSupported }

// SetSteerAll returns ErrNotSupported.
func (p *Program) SetSteerAll(on bool) error { return ErrNotSupported }

// SetDropNoSocket returns ErrNotSupported.
func (p *Program) SetDropNoSocket(on bool) error { return ErrNotSupported }
