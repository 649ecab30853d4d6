package steer

import (
	"errors"
	"fmt"
)

// ProgramName is the kernel name of the steering program (bpftool prog
// show); Attach recognises a stale copy of itself by it.
const ProgramName = steerProgXdpSteer

// More sentinel errors.
var (
	// ErrNotSupported is returned by Load where XDP is not available (not
	// Linux). It wraps errors.ErrUnsupported.
	ErrNotSupported = fmt.Errorf("steer: XDP needs Linux: %w", errors.ErrUnsupported)
	// ErrClosed: the Program was closed.
	ErrClosed = errors.New("steer: program closed")
	// ErrAttached: Attach on a Program that is already attached.
	ErrAttached = errors.New("steer: already attached")
	// ErrForeignProgram: the interface carries a netlink-attached XDP
	// program that is not a steering program; Attach leaves it alone
	// unless Options.ReplaceForeign is set.
	ErrForeignProgram = errors.New("steer: interface has a foreign XDP program")
	// ErrInUse: the interface carries an XDP program held by a live
	// bpf_link (another running Program, possibly in another process) or
	// offloaded to hardware. Attach never removes those.
	ErrInUse = errors.New("steer: interface XDP hook in use")
)

// Options size the maps. The zero value gives the defaults.
type Options struct {
	// MaxRules bounds destination, VXLAN and source rules together.
	// Default 4096.
	MaxRules uint32
	// MaxInfraPrefixes bounds the infrastructure prefix trie. Default 256.
	MaxInfraPrefixes uint32
	// MaxQueues is the XSKMAP size: RX queues 0..MaxQueues-1 can have a
	// socket. Default 64.
	MaxQueues uint32
	// ReplaceForeign lets Attach remove a netlink-attached XDP program that
	// is not a steering program. By default only a stale steering program
	// (same ProgramName, left by a crashed run) is replaced.
	ReplaceForeign bool
}

func (o Options) withDefaults() Options {
	if o.MaxRules == 0 {
		o.MaxRules = 4096
	}
	if o.MaxInfraPrefixes == 0 {
		o.MaxInfraPrefixes = 256
	}
	if o.MaxQueues == 0 {
		o.MaxQueues = 64
	}
	return o
}

// AttachMode chooses the XDP hook.
type AttachMode uint8

const (
	// AttachAuto lets the kernel choose: driver (native) mode when the
	// driver supports XDP, generic otherwise.
	AttachAuto AttachMode = iota
	// AttachDriver requires native XDP in the driver.
	AttachDriver
	// AttachGeneric uses generic (skb) XDP: works on any device, slower,
	// and AF_XDP sockets on it run in copy mode.
	AttachGeneric
)

func (m AttachMode) String() string {
	switch m {
	case AttachAuto:
		return "auto"
	case AttachDriver:
		return "driver"
	case AttachGeneric:
		return "generic"
	}
	return fmt.Sprintf("AttachMode(%d)", m)
}

// MarshalText implements encoding.TextMarshaler ("auto", "driver",
// "generic"), so an AttachMode can be a flag (flag.TextVar) or a
// configuration value.
func (m AttachMode) MarshalText() ([]byte, error) {
	if m > AttachGeneric {
		return nil, fmt.Errorf("steer: unknown attach mode %d", uint8(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *AttachMode) UnmarshalText(b []byte) error {
	switch string(b) {
	case "auto", "":
		*m = AttachAuto
	case "driver", "native":
		*m = AttachDriver
	case "generic", "skb":
		*m = AttachGeneric
	default:
		return fmt.Errorf("steer: attach mode %q: want auto, driver or generic", b)
	}
	return nil
}

// Stats are the program's counters summed over CPUs. Every packet the
// program sees is counted once in Redirected, NoSocketDropped or in one
// pass reason; a steered packet (Redirected, NoSocket or NoSocketDropped)
// is also counted in one Matched*.
type Stats struct {
	Redirected uint64 // handed to the AF_XDP socket of its RX queue
	NoSocket   uint64 // matched a rule, but its RX queue has no socket: passed
	// NoSocketDropped: matched a rule, its RX queue has no socket, and
	// SetDropNoSocket is on: dropped.
	NoSocketDropped uint64
	NoMatch         uint64 // IP, matched no rule: passed
	NotIP           uint64 // not IPv4/IPv6 (ARP, LLDP, QinQ, ...): passed
	Malformed       uint64 // truncated or inconsistent headers: passed
	Infra           uint64 // source rule vetoed by an infrastructure prefix: passed
	ND              uint64 // ICMPv6 neighbour discovery or MLD: passed

	MatchedDst   uint64
	MatchedVXLAN uint64
	MatchedSrc   uint64
	MatchedAll   uint64 // steered by SetSteerAll, before any rule
}

// Passed is the number of packets given to the kernel.
func (s Stats) Passed() uint64 {
	return s.NoSocket + s.NoMatch + s.NotIP + s.Malformed + s.Infra + s.ND
}

// Packets is the number of packets the program ran on.
func (s Stats) Packets() uint64 { return s.Redirected + s.NoSocketDropped + s.Passed() }

// Sub returns s - o, field by field: the counts between two reads.
func (s Stats) Sub(o Stats) Stats {
	return Stats{
		Redirected:      s.Redirected - o.Redirected,
		NoSocket:        s.NoSocket - o.NoSocket,
		NoSocketDropped: s.NoSocketDropped - o.NoSocketDropped,
		NoMatch:         s.NoMatch - o.NoMatch,
		NotIP:           s.NotIP - o.NotIP,
		Malformed:       s.Malformed - o.Malformed,
		Infra:           s.Infra - o.Infra,
		ND:              s.ND - o.ND,
		MatchedDst:      s.MatchedDst - o.MatchedDst,
		MatchedVXLAN:    s.MatchedVXLAN - o.MatchedVXLAN,
		MatchedSrc:      s.MatchedSrc - o.MatchedSrc,
		MatchedAll:      s.MatchedAll - o.MatchedAll,
	}
}
