//go:build !linux

package afxdp

import "github.com/xdplb/xdplb/engine"

// Port is an AF_XDP port; on this system every operation fails with
// ErrNotSupported.
type Port struct{}

var _ engine.Port = (*Port)(nil)

// Open returns ErrNotSupported: AF_XDP needs Linux.
func Open(cfg Config) (*Port, error) { return nil, ErrNotSupported }

// OpenAll returns ErrNotSupported: AF_XDP needs Linux.
func OpenAll(cfg Config) ([]*Port, error) { return nil, ErrNotSupported }

// QueueCount returns ErrNotSupported: AF_XDP needs Linux.
func QueueCount(ifname string) (int, error) { return 0, ErrNotSupported }

// Name implements engine.Port.
func (p *Port) Name() string { return "afxdp:unsupported" }

// Config returns the zero Config.
func (p *Port) Config() Config { return Config{} }

// FD returns -1.
func (p *Port) FD() int { return -1 }

// Queue returns 0.
func (p *Port) Queue() int { return 0 }

// Ifindex returns 0.
func (p *Port) Ifindex() int { return 0 }

// ZeroCopy returns false.
func (p *Port) ZeroCopy() bool { return false }

// NeedWakeup returns false.
func (p *Port) NeedWakeup() bool { return false }

// Receive implements engine.Port; it never receives.
func (p *Port) Receive(b *engine.Batch, pool []engine.Packet, inPort uint16) int { return 0 }

// Transmit implements engine.Port; it takes nothing.
func (p *Port) Transmit(pkts []*engine.Packet) int { return 0 }

// Release implements engine.Port.
func (p *Port) Release(pkts []*engine.Packet) {}

// Flush implements engine.Port.
func (p *Port) Flush() error { return ErrNotSupported }

// Wait implements engine.Waiter.
func (p *Port) Wait(timeoutMs int) error { return ErrNotSupported }

// Check reports whether the socket still works; see the Linux version.
func (p *Port) Check() error { return ErrNotSupported }

// Frames returns zero counts.
func (p *Port) Frames() Frames { return Frames{} }

// Stats returns ErrNotSupported.
func (p *Port) Stats() (Stats, error) { return Stats{}, ErrNotSupported }

// Close implements engine.Port.
func (p *Port) Close() error { return nil }
