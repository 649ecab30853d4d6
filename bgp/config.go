package bgp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"time"
)

// Defaults applied by New to the zero values of Config fields.
const (
	// DefaultHoldTime is the BGP hold time proposed when Config.HoldTime is
	// zero (RFC 4271 suggests 90 s); keepalives are sent every third of it.
	DefaultHoldTime = 90 * time.Second
	// DefaultConnectRetry is the interval between outbound connection
	// attempts when Config.ConnectRetry is zero. GoBGP's own default is
	// 120 s; a Mux wants its sessions back sooner.
	DefaultConnectRetry = 5 * time.Second
	// DefaultWithdrawGrace is the grace period the desired-state document
	// defaults to. Config.WithdrawGrace has no implicit default: zero means
	// "stop right after the withdrawal".
	DefaultWithdrawGrace = 2 * time.Second
	// DefaultPeerPort is the TCP port used when Peer.Port is zero.
	DefaultPeerPort = 179
)

// ErrInvalidConfig is wrapped by every error Config.Validate returns.
var ErrInvalidConfig = errors.New("bgp: invalid config")

// Config describes the embedded BGP speaker of a Mux. It is a plain value:
// it can be built by hand, converted from the desired-state document,
// printed and checked with Validate before anything is started.
type Config struct {
	// ASN is the local autonomous system number (1..4294967295, not
	// AS_TRANS 23456). A peer with the same ASN is an iBGP peer, any other
	// an eBGP peer.
	ASN uint32
	// RouterID is the BGP identifier, an IPv4 address (also for a Mux that
	// only speaks IPv6).
	RouterID netip.Addr
	// ListenPort is the TCP port to accept sessions on; 0 means do not
	// listen at all (sessions are only dialled out, and no peer may be
	// Passive). The document's default is 179.
	ListenPort int32
	// ListenAddresses restricts the listener to these local addresses;
	// empty means all (0.0.0.0 and ::). Only valid with a ListenPort.
	ListenAddresses []netip.Addr
	// HoldTime is the hold time proposed to every peer: 0 means
	// DefaultHoldTime, otherwise whole seconds from 3 s to 65535 s.
	// Keepalives go out every HoldTime/3.
	HoldTime time.Duration
	// ConnectRetry is the interval between outbound connection attempts:
	// 0 means DefaultConnectRetry, otherwise whole seconds, at least 1 s.
	ConnectRetry time.Duration
	// WithdrawGrace is how long Shutdown waits between withdrawing every
	// prefix and closing the sessions, while the caller keeps forwarding
	// the traffic still in flight. 0 means no wait.
	WithdrawGrace time.Duration
	// NextHop is the next hop announced for IPv4 prefixes. The zero value
	// means next-hop self: the local address of each session, which must
	// then be an IPv4 session. Setting it also enables the IPv4 unicast
	// family on IPv6 sessions.
	NextHop netip.Addr
	// NextHop6 is the next hop announced for IPv6 prefixes. The zero value
	// means next-hop self on IPv6 sessions. Setting it also enables the
	// IPv6 unicast family on IPv4 sessions (MP-BGP, RFC 4760), which is how
	// a Mux announces IPv6 VIPs to a router it peers with over IPv4; see
	// the package documentation.
	NextHop6 netip.Addr
	// Peers are the routers to announce to.
	Peers []Peer
	// Logger receives the announcer's and GoBGP's logs; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Peer is one BGP neighbour, normally a router that spreads VIP traffic
// over the Muxes with ECMP.
type Peer struct {
	// Address is the neighbour's address (IPv4 or IPv6). It identifies the
	// peer: two peers may not share it. A link-local IPv6 address must have
	// a zone, and only it may: the name (not the index) of the interface
	// the neighbour is on ("fe80::1%eth0"); without one no session could
	// be dialled or accepted. The session then runs from that interface's
	// link-local address, Config.NextHop6 must be set, and Password must
	// be empty (GoBGP cannot sign such a session). See "Link-local peers"
	// in the package documentation.
	Address netip.Addr
	// ASN is the neighbour's AS number. Equal to Config.ASN: iBGP;
	// otherwise eBGP.
	ASN uint32
	// Port is the neighbour's TCP port; 0 means DefaultPeerPort.
	Port uint16
	// Passive makes the Announcer wait for the neighbour to connect
	// instead of dialling it; it needs Config.ListenPort.
	Passive bool
	// Password is the session's TCP-MD5 signature key (RFC 2385), at most
	// MaxPasswordLen bytes; empty means none. It is set on the listener
	// too, for the neighbour's address.
	Password string
	// TTLSecurity turns on the Generalized TTL Security Mechanism (RFC
	// 5082) with the neighbour's distance in hops, 1..254: the session's
	// packets leave with TTL 255 and only those arriving with TTL
	// 256-TTLSecurity or more are accepted (1: directly connected, TTL
	// 255 only). 0 means off (eBGP then sends with TTL 1).
	TTLSecurity uint8
}

// validZone reports whether zone can name the interface of a link-local
// peer: a Linux interface name (1..15 bytes, not "." or "..", no '/', ':',
// space or control character) that is not all digits, since GoBGP looks
// the interface up by name, never by index, when it picks the session's
// local address.
func validZone(zone string) bool {
	if zone == "" || len(zone) > 15 || zone == "." || zone == ".." {
		return false
	}
	digits := true
	for i := 0; i < len(zone); i++ {
		c := zone[i]
		if c <= ' ' || c >= 0x7f || c == '/' || c == ':' {
			return false
		}
		digits = digits && c >= '0' && c <= '9'
	}
	return !digits
}

// MaxPasswordLen is the longest TCP-MD5 key the kernel takes
// (TCP_MD5SIG_MAXKEYLEN).
const MaxPasswordLen = 80

// HostPrefix returns the host route for a VIP: a /32 for an IPv4 address,
// a /128 for an IPv6 one. An IPv4-mapped IPv6 address is unmapped first.
func HostPrefix(vip netip.Addr) netip.Prefix {
	vip = vip.Unmap()
	return netip.PrefixFrom(vip, vip.BitLen())
}

// Validate reports every problem with c, each wrapped around
// ErrInvalidConfig and naming the offending field, joined into one error.
// It returns nil for a usable Config.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...)))
	}

	if err := checkASN(c.ASN); err != "" {
		bad("asn", "%s", err)
	}
	switch {
	case !c.RouterID.IsValid():
		bad("router_id", "missing")
	case !c.RouterID.Is4():
		bad("router_id", "%s is not an IPv4 address", c.RouterID)
	case c.RouterID.IsUnspecified():
		bad("router_id", "0.0.0.0 is not a router id")
	}
	if c.ListenPort < 0 || c.ListenPort > 65535 {
		bad("listen_port", "%d is outside 0..65535", c.ListenPort)
	}
	if c.ListenPort == 0 && len(c.ListenAddresses) > 0 {
		bad("listen_addresses", "set without a listen_port")
	}
	seenListen := map[netip.Addr]bool{}
	for i, a := range c.ListenAddresses {
		f := fmt.Sprintf("listen_addresses[%d]", i)
		switch {
		case !a.IsValid():
			bad(f, "invalid address")
		case a.Zone() != "":
			bad(f, "%s: zones are not supported", a)
		case seenListen[a]:
			bad(f, "%s listed twice", a)
		}
		seenListen[a] = true
	}
	if c.HoldTime != 0 && (c.HoldTime < 3*time.Second || c.HoldTime > 65535*time.Second || c.HoldTime%time.Second != 0) {
		bad("hold_time", "%v: must be whole seconds from 3s to 65535s (or 0 for %v)", c.HoldTime, DefaultHoldTime)
	}
	if c.ConnectRetry != 0 && (c.ConnectRetry < time.Second || c.ConnectRetry%time.Second != 0) {
		bad("connect_retry", "%v: must be whole seconds, at least 1s (or 0 for %v)", c.ConnectRetry, DefaultConnectRetry)
	}
	if c.WithdrawGrace < 0 {
		bad("withdraw_grace", "%v is negative", c.WithdrawGrace)
	}
	if c.NextHop.IsValid() && (!c.NextHop.Is4() || c.NextHop.IsUnspecified() || c.NextHop.IsMulticast()) {
		bad("next_hop", "%s is not a unicast IPv4 address", c.NextHop)
	}
	if c.NextHop6.IsValid() && (!c.NextHop6.Is6() || c.NextHop6.Is4In6() || c.NextHop6.IsUnspecified() ||
		c.NextHop6.IsMulticast() || c.NextHop6.IsLinkLocalUnicast() || c.NextHop6.Zone() != "") {
		bad("next_hop6", "%s is not a global unicast IPv6 address", c.NextHop6)
	}
	seen := map[netip.Addr]int{}
	for i, p := range c.Peers {
		f := fmt.Sprintf("peers[%d]", i)
		switch {
		case !p.Address.IsValid():
			bad(f+".address", "missing")
		case p.Address.Zone() != "" && !p.Address.IsLinkLocalUnicast():
			bad(f+".address", "%s: only a link-local (fe80::/10) address may have a zone", p.Address)
		case p.Address.Zone() != "" && !validZone(p.Address.Zone()):
			bad(f+".address", "%s: the zone %q is not an interface name (1..15 bytes, no '/', ':' or space, not all digits)", p.Address, p.Address.Zone())
		case p.Address.Zone() == "" && p.Address.IsLinkLocalUnicast():
			bad(f+".address", "%s is link-local: give the interface the peer is on as its zone, e.g. %s%%eth0 (without one no session can be dialled or accepted)", p.Address, p.Address)
		case p.Address.Is4In6():
			bad(f+".address", "%s: use the plain IPv4 address", p.Address)
		case p.Address.IsUnspecified() || p.Address.IsMulticast():
			bad(f+".address", "%s is not a unicast address", p.Address)
		default:
			if j, dup := seen[p.Address]; dup {
				bad(f+".address", "%s is also peers[%d]", p.Address, j)
			}
			seen[p.Address] = i
		}
		if err := checkASN(p.ASN); err != "" {
			bad(f+".asn", "%s", err)
		}
		if len(p.Password) > MaxPasswordLen || strings.ContainsRune(p.Password, 0) {
			bad(f+".password", "%d bytes: want at most %d, no NUL", len(p.Password), MaxPasswordLen)
		}
		if p.Address.Zone() != "" {
			// GoBGP 3.37.0 parses the neighbour address with net.ParseIP,
			// which takes no zone, for the TCP-MD5 key (it would sign for ::)
			// and for the session's local address, the next hop it puts
			// into next-hop-self paths (it would announce none).
			if p.Password != "" {
				bad(f+".password", "TCP-MD5 is not supported with a link-local peer (%s)", p.Address)
			}
			if !c.NextHop6.IsValid() {
				bad(f+".address", "%s: a link-local peer needs next_hop6 (next-hop self would announce no usable next hop over a link-local session)", p.Address)
			}
		}
		if p.TTLSecurity == 255 {
			bad(f+".ttl_security", "255 hops: want 1..254 (or 0 for off)")
		}
		if p.Passive && c.ListenPort == 0 {
			bad(f+".passive", "a passive peer needs a listen_port")
		}
	}
	return errors.Join(errs...)
}

func checkASN(asn uint32) string {
	switch asn {
	case 0:
		return "missing (1..4294967295)"
	case 23456:
		return "23456 is AS_TRANS, reserved (RFC 6793)"
	}
	return ""
}

// withDefaults returns c with the zero values that have defaults filled in.
func (c Config) withDefaults() Config {
	if c.HoldTime == 0 {
		c.HoldTime = DefaultHoldTime
	}
	if c.ConnectRetry == 0 {
		c.ConnectRetry = DefaultConnectRetry
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.ListenAddresses = append([]netip.Addr(nil), c.ListenAddresses...)
	c.Peers = append([]Peer(nil), c.Peers...)
	return c
}

// sameSpeaker reports whether a and b describe the same BGP speaker, the
// part that cannot change without restarting GoBGP.
func (c Config) sameSpeaker(o Config) (bool, string) {
	switch {
	case c.ASN != o.ASN:
		return false, "asn"
	case c.RouterID != o.RouterID:
		return false, "router_id"
	case c.ListenPort != o.ListenPort:
		return false, "listen_port"
	case len(c.ListenAddresses) != len(o.ListenAddresses):
		return false, "listen_addresses"
	}
	for i := range c.ListenAddresses {
		if c.ListenAddresses[i] != o.ListenAddresses[i] {
			return false, "listen_addresses"
		}
	}
	return true, ""
}
