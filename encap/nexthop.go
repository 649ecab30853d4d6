package encap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/header"
)

// Resolver finds the next hop for a destination without blocking: a miss
// returns false (and the resolver queues the destination for resolution
// itself). *nexthop.Resolver implements it; tests use a map.
type Resolver interface {
	Lookup(dst netip.Addr) (nexthop.Hop, bool)
}

// NextHopMode says which address of a packet the NextHop stage resolves.
type NextHopMode uint8

const (
	// OuterDst resolves the destination of the outermost IP header, which
	// directly follows an untagged Ethernet header: the backend's host
	// address the Encap stage wrote. For the Mux.
	OuterDst NextHopMode = iota
	// L3Dst resolves the destination of the IP header the parser found
	// (Packet.L3Off): the client, on the Host Agent's DSR return path.
	L3Dst
)

// String returns "outer-dst" or "l3-dst".
func (m NextHopMode) String() string {
	switch m {
	case OuterDst:
		return "outer-dst"
	case L3Dst:
		return "l3-dst"
	}
	return fmt.Sprintf("NextHopMode(%d)", uint8(m))
}

// MarshalText implements encoding.TextMarshaler.
func (m NextHopMode) MarshalText() ([]byte, error) {
	if m > L3Dst {
		return nil, fmt.Errorf("encap: unknown next-hop mode %d", uint8(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler; the empty string
// means OuterDst.
func (m *NextHopMode) UnmarshalText(b []byte) error {
	switch string(b) {
	case "", "outer-dst":
		*m = OuterDst
	case "l3-dst":
		*m = L3Dst
	default:
		return fmt.Errorf(`encap: unknown next-hop mode %q (want "outer-dst" or "l3-dst")`, b)
	}
	return nil
}

// NextHopConfig is the plain configuration of a NextHop stage.
type NextHopConfig struct {
	// Mode says which address to resolve.
	Mode NextHopMode
	// Ports maps an egress interface index (nexthop.Hop.IfIndex) to the
	// index of the worker port that transmits on that interface
	// (Packet.OutPort). A hop through an interface not listed is dropped
	// with no_out_port.
	Ports map[int]uint16
}

// Validate reports a configuration that cannot work.
func (c NextHopConfig) Validate() error {
	if c.Mode > L3Dst {
		return fmt.Errorf("encap: unknown next-hop mode %d", uint8(c.Mode))
	}
	if len(c.Ports) == 0 {
		return errors.New("encap: NextHopConfig.Ports is empty")
	}
	for ifi := range c.Ports {
		if ifi <= 0 {
			return fmt.Errorf("encap: NextHopConfig.Ports: invalid interface index %d", ifi)
		}
	}
	return nil
}

// NextHop is the stage that addresses frames to their next hop: for each
// packet it resolves an address (NextHopConfig.Mode), writes the hop's
// MACs as the frame's Ethernet source and destination and sets
// Packet.OutPort to the port of the hop's interface. An unresolved
// destination is dropped with nexthop_unresolved (the resolver is already
// resolving it), a non-IP frame with unsupported.
//
// Consecutive packets of a batch to the same address cost one lookup: the
// stage remembers the last answer, hit or miss, for the rest of the batch.
// It is safe for concurrent use by several workers.
type NextHop struct {
	cfg   NextHopConfig
	r     Resolver
	ports []ifPort // few entries: a linear scan, behind the batch cache
}

type ifPort struct {
	ifindex int
	port    uint16
}

// NewNextHop validates cfg and returns a NextHop stage resolving through r.
func NewNextHop(cfg NextHopConfig, r Resolver) (*NextHop, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if r == nil {
		return nil, errors.New("encap: NewNextHop: nil Resolver")
	}
	s := &NextHop{cfg: cfg, r: r}
	for ifi, port := range cfg.Ports {
		s.ports = append(s.ports, ifPort{ifi, port})
	}
	slices.SortFunc(s.ports, func(a, b ifPort) int { return a.ifindex - b.ifindex })
	return s, nil
}

// Config returns the stage's configuration.
func (s *NextHop) Config() NextHopConfig { return s.cfg }

// Process implements engine.Stage.
func (s *NextHop) Process(b *engine.Batch) {
	var (
		last   netip.Addr // the address of the cached answer; invalid: none
		src    header.MAC
		dst    header.MAC
		out    uint16
		reason engine.DropReason
	)
	for _, p := range b.Packets() {
		a := s.dest(p)
		if !a.IsValid() {
			b.Drop(p, engine.DropUnsupported)
			continue
		}
		if a != last {
			last = a
			reason = 0
			if h, ok := s.r.Lookup(a); !ok {
				reason = engine.DropNextHopUnres
			} else if o, ok := s.port(h.IfIndex); !ok {
				reason = engine.DropNoOutPort
			} else {
				src, dst, out = h.SrcMAC, h.DstMAC, o
			}
		}
		if reason != 0 {
			b.Drop(p, reason)
			continue
		}
		eth := header.Ethernet(p.Data())
		eth.SetDst(dst)
		eth.SetSrc(src)
		p.OutPort = out
	}
}

func (s *NextHop) port(ifindex int) (uint16, bool) {
	for _, e := range s.ports {
		if e.ifindex == ifindex {
			return e.port, true
		}
	}
	return 0, false
}

// dest returns the address to resolve for p, or the invalid Addr when the
// frame has no IP header where the mode looks.
func (s *NextHop) dest(p *engine.Packet) netip.Addr {
	data := p.Data()
	if s.cfg.Mode == OuterDst {
		if len(data) < header.EthernetSize {
			return netip.Addr{}
		}
		switch binary.BigEndian.Uint16(data[12:]) {
		case header.EtherTypeIPv4:
			return dst4(data, header.EthernetSize)
		case header.EtherTypeIPv6:
			return dst6(data, header.EthernetSize)
		}
		return netip.Addr{}
	}
	switch {
	case p.Flags&engine.FlagIPv4 != 0:
		return dst4(data, int(p.L3Off))
	case p.Flags&engine.FlagIPv6 != 0:
		return dst6(data, int(p.L3Off))
	}
	return netip.Addr{}
}

func dst4(data []byte, l3 int) netip.Addr {
	if len(data) < l3+header.IPv4MinSize {
		return netip.Addr{}
	}
	return netip.AddrFrom4([4]byte(data[l3+16 : l3+20]))
}

func dst6(data []byte, l3 int) netip.Addr {
	if len(data) < l3+header.IPv6Size {
		return netip.Addr{}
	}
	return netip.AddrFrom16([16]byte(data[l3+24 : l3+40]))
}

var _ Resolver = (*nexthop.Resolver)(nil)
var _ engine.Stage = (*NextHop)(nil)
