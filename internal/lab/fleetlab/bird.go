package fleetlab

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
)

// BIRDPeer is one eBGP neighbour of the router: a Mux.
type BIRDPeer struct {
	Name string     // the BIRD protocol's name, as birdc shows it
	Addr netip.Addr // the Mux's address on its link to the router
	ASN  uint32
	// Password, when set, signs the session with TCP-MD5.
	Password string
	// TTLSecurity turns on GTSM for a directly connected peer.
	TTLSecurity bool
	// Passive makes BIRD wait for the Mux to connect.
	Passive bool
}

// BIRDConfig describes the router's BIRD 2 configuration: eBGP sessions
// with the Muxes over IPv4, every route learned imported, the best ones
// exported to the router namespace's kernel table with equal-cost paths
// merged (one ECMP route per VIP over the Muxes that announce it), timers
// short enough for tests (hold 9 s, connect retry 1 s).
type BIRDConfig struct {
	RouterID netip.Addr
	ASN      uint32
	// IPv6 adds IPv6 unicast to every (IPv4) session and a kernel
	// protocol for IPv6: the Muxes announce IPv6 VIPs with an IPv6 next
	// hop over IPv4 transport (MP-BGP).
	IPv6  bool
	Peers []BIRDPeer
}

// Text returns the configuration file.
func (c BIRDConfig) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, `log stderr all;
router id %s;
protocol device { scan time 10; }

# ECMP towards the Muxes: routes of equal BGP preference are merged into
# one multipath kernel route.
protocol kernel kernel4 {
	ipv4 { import none; export all; };
	merge paths on;
}
`, c.RouterID)
	if c.IPv6 {
		b.WriteString(`protocol kernel kernel6 {
	ipv6 { import none; export all; };
	merge paths on;
}
`)
	}
	fmt.Fprintf(&b, `template bgp mux {
	local as %d;
	hold time 9;
	connect delay time 1;
	connect retry time 1;
	error wait time 1, 5;
	ipv4 { import all; export none; };
`, c.ASN)
	if c.IPv6 {
		b.WriteString("\tipv6 { import all; export none; };\n")
	}
	b.WriteString("}\n")
	for _, p := range c.Peers {
		var extra string
		if p.Password != "" {
			extra += fmt.Sprintf(" password %q;", p.Password)
		}
		if p.TTLSecurity {
			extra += " ttl security on;"
		}
		if p.Passive {
			extra += " passive on;"
		}
		fmt.Fprintf(&b, "protocol bgp %s from mux { neighbor %s as %d;%s }\n", p.Name, p.Addr, p.ASN, extra)
	}
	return b.String()
}

// HaveBIRD returns nil when BIRD 2's daemon and client (bird, birdc) are
// installed, and otherwise an error naming the one missing.
func HaveBIRD() error {
	for _, bin := range []string{"bird", "birdc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s not found: install BIRD 2 (Debian/Ubuntu package bird2)", bin)
		}
	}
	return nil
}
