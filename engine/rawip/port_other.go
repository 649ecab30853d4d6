//go:build !linux

package rawip

import "github.com/xdplb/xdplb/engine"

// Port is the raw-socket port; on this system Open always fails.
type Port struct{ ctr counters }

// Open fails with ErrNotSupported.
func Open(name string) (*Port, error) { return nil, ErrNotSupported }

func (p *Port) Name() string                                       { return "rawip" }
func (p *Port) Receive(*engine.Batch, []engine.Packet, uint16) int { return 0 }
func (p *Port) Transmit(pkts []*engine.Packet) int                 { return len(pkts) }
func (p *Port) Release([]*engine.Packet)                           {}
func (p *Port) Flush() error                                       { return nil }
func (p *Port) Close() error                                       { return nil }
func (p *Port) Stats() Stats                                       { return p.ctr.stats() }
