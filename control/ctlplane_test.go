package control

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The control-plane keys of bgp: listen_addresses, and per peer a TCP-MD5
// password and GTSM (ttl_security); they survive Marshal.
func TestParseBGPSecurity(t *testing.T) {
	doc := base + `bgp:
  asn: 65010
  router_id: 198.18.0.10
  listen_addresses: [198.18.0.10, "2001:db8::10"]
  peers:
    - {address: 198.18.0.1, asn: 65000, password: "s3cret: yes", ttl_security: 1}
    - {address: 198.18.0.2, asn: 65000}
`
	d, err := Parse([]byte(doc))
	require.NoError(t, err)
	b := d.BGP
	require.Equal(t, []netip.Addr{netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("2001:db8::10")}, b.ListenAddresses)
	require.Equal(t, "s3cret: yes", b.Peers[0].Password)
	require.EqualValues(t, 1, b.Peers[0].TTLSecurity)
	require.Empty(t, b.Peers[1].Password)
	require.Zero(t, b.Peers[1].TTLSecurity)

	out, err := d.Marshal()
	require.NoError(t, err)
	again, err := Parse(out)
	require.NoError(t, err, "%s", out)
	require.Equal(t, d.BGP, again.BGP)
}

func TestParseBGPSecurityErrors(t *testing.T) {
	doc := base + `bgp:
  asn: 65010
  router_id: 198.18.0.10
  listen_port: 0
  listen_addresses: [198.18.0.10, 198.18.0.10, 0.0.0.0]
  peers:
    - address: 198.18.0.1
      asn: 65000
      password: ""
      ttl_security: 255
    - address: 198.18.0.2
      asn: 65000
      password: ` + strings.Repeat("x", 81) + `
      ttl_security: yes
`
	_, err := Parse([]byte(doc))
	require.Error(t, err)
	got := err.Error()
	for _, want := range []string{
		`16:35: bgp.listen_addresses[1]: 198.18.0.10 is listed twice (first at bgp.listen_addresses[0], line 16)`,
		`16:48: bgp.listen_addresses[2]: "0.0.0.0" is the unspecified address`,
		`16:21: bgp.listen_addresses: set, but listen_port is 0 (do not listen): drop one of them`,
		`20:17: bgp.peers[0].password: 0 bytes (want 1..80 bytes, no NUL (the kernel's TCP-MD5 key limit))`,
		`21:21: bgp.peers[0].ttl_security: 255 is out of range (want 0..254: 0 = off, else the peer's distance in hops (1 = directly connected; GTSM, RFC 5082))`,
		`24:17: bgp.peers[1].password: 81 bytes`,
		`25:21: bgp.peers[1].ttl_security: `,
	} {
		require.Contains(t, got, want)
	}
}
