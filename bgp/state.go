package bgp

import (
	"net/netip"
	"time"
)

// SessionState is the state of a BGP session's finite state machine
// (RFC 4271 section 8). The values match GoBGP's API enumeration.
type SessionState uint8

// Session states.
const (
	StateUnknown SessionState = iota
	StateIdle
	StateConnect
	StateActive
	StateOpenSent
	StateOpenConfirm
	StateEstablished
)

var stateNames = [...]string{"unknown", "idle", "connect", "active", "opensent", "openconfirm", "established"}

// String returns the state's lower-case RFC 4271 name ("established").
func (s SessionState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// PeerState is a snapshot of one BGP session.
type PeerState struct {
	Address netip.Addr   // the neighbour's address, as configured
	ASN     uint32       // the neighbour's AS number
	State   SessionState // current session state
	// Families are the address families enabled on the session
	// ("ipv4-unicast", "ipv6-unicast").
	Families []string
	// LocalAddress is the local end of an established session: the next
	// hop announced when next-hop self applies. Zero unless established.
	LocalAddress netip.Addr
	// RouterID is the neighbour's BGP identifier. Zero unless established.
	RouterID netip.Addr
	// Uptime is how long the session has been established (GoBGP keeps
	// whole seconds). Zero unless established.
	Uptime time.Duration
	// Flaps counts how often an established session went down.
	Flaps uint32
	// Advertised is the number of prefixes sent to the neighbour and
	// Received the number it sent us, over all families. Zero unless
	// established.
	Advertised, Received uint64
}
