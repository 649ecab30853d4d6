package rawip

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/header"
)

// Port is the raw-socket port. Make one with Open.
type Port struct {
	name     string
	fd4, fd6 int
	ctr      counters
}

// Open opens the raw IPv4 and IPv6 sockets in the calling thread's network
// namespace. name is the port's name in logs and metrics.
func Open(name string) (*Port, error) {
	fd4, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, fmt.Errorf("rawip: IPv4 raw socket: %w", err)
	}
	// IPPROTO_RAW implies IP_HDRINCL for IPv4 and IPV6_HDRINCL for IPv6.
	fd6, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		unix.Close(fd4)
		return nil, fmt.Errorf("rawip: IPv6 raw socket: %w", err)
	}
	return &Port{name: name, fd4: fd4, fd6: fd6}, nil
}

// Name implements engine.Port.
func (p *Port) Name() string { return p.name }

// Receive implements engine.Port: the port never receives.
func (p *Port) Receive(*engine.Batch, []engine.Packet, uint16) int { return 0 }

// Transmit implements engine.Port: it sends every packet at once and takes
// them all; the worker gives the frames back to their owners afterwards.
// Packets the kernel refuses are counted in Stats.Errors.
func (p *Port) Transmit(pkts []*engine.Packet) int {
	for _, pk := range pkts {
		p.send(pk.Data())
	}
	return len(pkts)
}

func (p *Port) send(f []byte) {
	off := header.EthernetSize
	if len(f) < off {
		p.ctr.malformed.Add(1)
		return
	}
	et := binary.BigEndian.Uint16(f[12:])
	for (et == header.EtherTypeVLAN || et == header.EtherTypeQinQ) && len(f) >= off+4 {
		et = binary.BigEndian.Uint16(f[off+2:])
		off += 4
	}
	ip := f[off:]
	var err error
	switch {
	case et == header.EtherTypeIPv4 && len(ip) >= header.IPv4MinSize && ip[0]>>4 == 4:
		sa := unix.SockaddrInet4{Addr: [4]byte(ip[16:20])}
		err = unix.Sendto(p.fd4, ip, unix.MSG_DONTWAIT, &sa)
	case et == header.EtherTypeIPv6 && len(ip) >= header.IPv6Size && ip[0]>>4 == 6:
		sa := unix.SockaddrInet6{Addr: [16]byte(ip[24:40])}
		err = unix.Sendto(p.fd6, ip, unix.MSG_DONTWAIT, &sa)
	default:
		p.ctr.malformed.Add(1)
		return
	}
	if err != nil {
		p.ctr.errors.Add(1)
		return
	}
	p.ctr.sent.Add(1)
}

// Release implements engine.Port: the port owns no frames.
func (p *Port) Release([]*engine.Packet) {}

// Flush implements engine.Port: nothing is queued.
func (p *Port) Flush() error { return nil }

// Close closes the sockets.
func (p *Port) Close() error {
	e4 := unix.Close(p.fd4)
	e6 := unix.Close(p.fd6)
	if e4 != nil {
		return e4
	}
	return e6
}

// Stats returns the port's counters.
func (p *Port) Stats() Stats { return p.ctr.stats() }

var _ engine.Port = (*Port)(nil)
