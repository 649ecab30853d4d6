package control

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A link-local peer names its interface as the zone (fe80::1%eth0), as
// the bgp package takes it: a zone that is an interface name, on a
// link-local address only and required there, with next_hop6 set (for a
// fleet, in each node's merged bgp) and no password. mux's TestBGPConfigAgrees checks that what
// Parse accepts here the bgp package accepts too.
func TestParseLinkLocalPeers(t *testing.T) {
	// bgpDoc is base with a per-node bgp section (line 12 on) holding one
	// peer (lines 16-17) and extra lines after router_id.
	bgpDoc := func(extra, address string, peerExtra string) string {
		return base + "bgp:\n  asn: 65010\n  router_id: 198.18.0.10\n" + extra +
			"  peers:\n    - address: '" + address + "'\n      asn: 65000\n" + peerExtra
	}
	const nh6 = "  next_hop6: '2001:db8::10'\n"
	// fleet is base with a fleet bgp section and one node, mux-1 (line 16).
	fleet := func(fleetExtra, nodeExtra string) string {
		return base + "bgp:\n  asn: 65010\n" + fleetExtra + "nodes:\n  mux-1:\n    bgp:\n      router_id: 198.18.0.11\n" + nodeExtra
	}
	const fleetPeer = "  peers: [{address: 'fe80::1%eth0', asn: 65000}]\n"
	const nodePeer = "      peers: [{address: 'fe80::1%eth0', asn: 65000}]\n"
	tests := []struct {
		name string
		doc  string
		want []string // every problem, in order; none: accepted
	}{
		{"zone with next_hop6", bgpDoc(nh6, "fe80::1%eth0", ""), nil},
		{"zone a long interface name", bgpDoc(nh6, "fe80::1%vlan.1234-abcd", ""), nil},
		{"fleet peer, node next_hop6", fleet(fleetPeer, "      next_hop6: '2001:db8::11'\n"), nil},
		{"node peer, fleet next_hop6", fleet(nh6, nodePeer), nil},
		{"link-local without zone", bgpDoc("", "fe80::1", ""), []string{
			`16:16: bgp.peers[0].address: "fe80::1" is link-local: give the interface the peer is on as its zone, e.g. fe80::1%eth0 (without one no session can be dialled or accepted)`}},
		{"link-local without zone, with next_hop6", bgpDoc(nh6, "fe80::2", ""), []string{
			`17:16: bgp.peers[0].address: "fe80::2" is link-local: give the interface the peer is on as its zone, e.g. fe80::2%eth0`}},
		{"node peer link-local without zone", fleet(nh6, "      peers: [{address: 'fe80::1', asn: 65000}]\n"), []string{
			`19:25: nodes.mux-1.bgp.peers[0].address: "fe80::1" is link-local: give the interface the peer is on as its zone`}},
		{"zone an index", bgpDoc(nh6, "fe80::1%2", ""), []string{
			`17:16: bgp.peers[0].address: "fe80::1%2": the zone "2" is not an interface name (want the interface the peer is on, e.g. fe80::1%eth0: a Linux interface name, 1-15 characters, no '/', ':' or spaces, not all digits)`}},
		{"zone too long", bgpDoc(nh6, "fe80::1%vlan.1234-abcdef", ""), []string{
			`17:16: bgp.peers[0].address: "fe80::1%vlan.1234-abcdef": the zone "vlan.1234-abcdef" is not an interface name`}},
		{"zone with a slash", bgpDoc(nh6, "fe80::1%a/b", ""), []string{
			`17:16: bgp.peers[0].address: "fe80::1%a/b": the zone "a/b" is not an interface name`}},
		{"zone on a global address", bgpDoc(nh6, "2001:db8::1%eth0", ""), []string{
			`17:16: bgp.peers[0].address: "2001:db8::1%eth0" has a zone; only a link-local peer address may have one (want an IPv4 or IPv6 address)`}},
		{"zone without next_hop6", bgpDoc("", "fe80::1%eth0", ""), []string{
			`16:16: bgp.peers[0].address: fe80::1%eth0 is a link-local peer, which needs bgp.next_hop6 (a global IPv6 address of this Mux on that link): next-hop self would announce no usable next hop over a link-local session`}},
		{"link-local next_hop6", bgpDoc("  next_hop6: 'fe80::10'\n", "fe80::1%eth0", ""), []string{
			`15:14: bgp.next_hop6: fe80::10 is a link-local address (want a global IPv6 address of this Mux`}},
		{"node's link-local next_hop6", fleet(fleetPeer, "      next_hop6: 'fe80::11'\n"), []string{
			`19:18: nodes.mux-1.bgp.next_hop6: fe80::11 is a link-local address`}},
		{"zone with a password", bgpDoc(nh6, "fe80::1%eth0", "      password: secret\n"), []string{
			`19:17: bgp.peers[0].password: TCP-MD5 is not supported with a link-local peer (fe80::1%eth0): the BGP speaker cannot set the key for an address with a zone; drop the password, or peer over a global address`}},
		{"fleet peer, node without next_hop6", fleet(fleetPeer, ""), []string{
			`17:5: nodes.mux-1.bgp: peer fe80::1%eth0 is link-local, which needs a next_hop6 (a global IPv6 address of this Mux on that link): set bgp.next_hop6 or nodes.mux-1.bgp.next_hop6; next-hop self would announce no usable next hop over a link-local session`}},
		{"node peer without next_hop6", fleet("", nodePeer), []string{
			`16:5: nodes.mux-1.bgp: peer fe80::1%eth0 is link-local, which needs a next_hop6`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Parse([]byte(tt.doc))
			if len(tt.want) == 0 {
				require.NoError(t, err, "document:\n%s", tt.doc)
				require.NotNil(t, d)
				return
			}
			require.ErrorIs(t, err, ErrInvalid)
			msgs := strings.Split(err.Error(), "\n")
			require.Len(t, msgs, len(tt.want), "document:\n%s\nerror:\n%v", tt.doc, err)
			for i, w := range tt.want {
				assert.True(t, strings.HasPrefix(msgs[i], w), "problem %d:\n got %s\nwant %s…", i, msgs[i], w)
			}
		})
	}
}
