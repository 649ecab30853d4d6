package engine

import (
	"fmt"
	"sync"
)

// DropReason says why a packet was dropped. Reasons are registered once, by
// name, at package initialisation (RegisterDropReason); the name is what
// metrics and logs show. The zero value means "not dropped".
type DropReason uint8

// MaxDropReasons bounds the number of registered reasons, so counters are a
// fixed array per worker.
const MaxDropReasons = 64

var (
	reasonMu    sync.Mutex
	reasonNames = []string{"none"}
)

// RegisterDropReason registers a reason by name and returns its value. Call
// it from a package-level var declaration; registering the same name twice
// returns the same value. It panics past MaxDropReasons (a programming
// error, found at start-up).
func RegisterDropReason(name string) DropReason {
	reasonMu.Lock()
	defer reasonMu.Unlock()
	for i, n := range reasonNames {
		if n == name {
			return DropReason(i)
		}
	}
	if len(reasonNames) >= MaxDropReasons {
		panic(fmt.Sprintf("engine: too many drop reasons registering %q", name))
	}
	reasonNames = append(reasonNames, name)
	return DropReason(len(reasonNames) - 1)
}

// String returns the registered name of r.
func (r DropReason) String() string {
	reasonMu.Lock()
	defer reasonMu.Unlock()
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// DropReasons returns all registered reasons, in value order (index 0 is
// "none").
func DropReasons() []string {
	reasonMu.Lock()
	defer reasonMu.Unlock()
	return append([]string(nil), reasonNames...)
}

// Drop reasons of the engine itself.
var (
	DropTruncated    = RegisterDropReason("truncated")   // frame shorter than its headers say
	DropNotIP        = RegisterDropReason("not_ip")      // EtherType is neither IPv4 nor IPv6
	DropBadIPv4      = RegisterDropReason("bad_ipv4")    // malformed IPv4 header
	DropBadIPv6      = RegisterDropReason("bad_ipv6")    // malformed IPv6 header or extension chain
	DropBadL4        = RegisterDropReason("bad_l4")      // malformed TCP/UDP/ICMP header
	DropBadL2        = RegisterDropReason("bad_l2")      // malformed Ethernet/VLAN header
	DropNoOutPort    = RegisterDropReason("no_out_port") // OutPort is not a port of the worker
	DropTXFull       = RegisterDropReason("tx_full")     // the out port's transmit ring was full
	DropTXTooBig     = RegisterDropReason("tx_too_big")  // frame larger than the out port's frames
	DropUnsupported  = RegisterDropReason("unsupported") // a stage cannot handle this kind of packet
	DropNoRule       = RegisterDropReason("no_rule")     // no configuration matches the packet
	DropNoBackend    = RegisterDropReason("no_backend")  // the rule has no active backend
	DropNoHeadroom   = RegisterDropReason("no_headroom") // no room to prepend headers
	DropNextHopUnres = RegisterDropReason("nexthop_unresolved")
)
