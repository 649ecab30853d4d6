package mux

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
)

// TestBGPConfigAgrees: the document (control.Parse) and the BGP speaker's
// Config (bgp.Config.Validate, through bgpConfig, what the Mux applies)
// accept the same peers. A peer the document took and the speaker then
// refused failed only when the Mux applied the document; one the speaker
// takes and the document refuses cannot be used. Each case is written once
// as a document and once as the control.BGP the document would decode to.
func TestBGPConfigAgrees(t *testing.T) {
	tests := []struct {
		name     string
		address  string
		password string
		nextHop6 string // empty: none
		accepted bool   // by both
		why      string // when refused, in both errors (if set)
	}{
		{"IPv4", "198.18.0.1", "", "", true, ""},
		{"IPv4 with a password", "198.18.0.1", "secret", "", true, ""},
		{"IPv6", "2001:db8::1", "", "", true, ""},
		{"IPv6 with next_hop6", "2001:db8::1", "", "2001:db8::10", true, ""},
		{"link-local without zone", "fe80::1", "", "", false, "is link-local: give the interface the peer is on as its zone, e.g. fe80::1%eth0"},
		{"link-local without zone, with next_hop6", "fe80::1", "", "2001:db8::10", false, "is link-local: give the interface the peer is on as its zone, e.g. fe80::1%eth0"},
		{"link-local with zone", "fe80::1%eth0", "", "2001:db8::10", true, ""},
		{"link-local with zone, no next_hop6", "fe80::1%eth0", "", "", false, ""},
		{"link-local with zone and a password", "fe80::1%eth0", "secret", "2001:db8::10", false, ""},
		{"link-local with an index as zone", "fe80::1%2", "", "2001:db8::10", false, ""},
		{"link-local with a zone no interface can have", "fe80::1%a/b", "", "2001:db8::10", false, ""},
		{"global IPv6 with zone", "2001:db8::1%eth0", "", "2001:db8::10", false, ""},
		{"link-local with zone, link-local next_hop6", "fe80::1%eth0", "", "fe80::10", false, ""},
		{"IPv6, link-local next_hop6", "2001:db8::1", "", "fe80::10", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := "version: 1\nbgp:\n  asn: 65010\n  router_id: 198.18.0.10\n"
			if tt.nextHop6 != "" {
				doc += fmt.Sprintf("  next_hop6: '%s'\n", tt.nextHop6)
			}
			doc += fmt.Sprintf("  peers:\n    - address: '%s'\n      asn: 65000\n", tt.address)
			if tt.password != "" {
				doc += fmt.Sprintf("      password: %s\n", tt.password)
			}
			d, parseErr := control.Parse([]byte(doc))

			b := &control.BGP{ASN: 65010, RouterID: netip.MustParseAddr("198.18.0.10"), ListenPort: control.DefaultListenPort,
				HoldTime: control.DefaultHoldTime, WithdrawGrace: control.DefaultWithdrawGrace,
				Peers: []control.Peer{{Address: netip.MustParseAddr(tt.address), ASN: 65000, Port: control.DefaultListenPort, Password: tt.password}}}
			if tt.nextHop6 != "" {
				b.NextHop6 = netip.MustParseAddr(tt.nextHop6)
			}
			if parseErr == nil {
				require.Equal(t, b, d.BGP, "the control.BGP the document decodes to")
			}
			bgpErr := bgpConfig(b, nil).Validate()

			if tt.accepted {
				require.NoError(t, parseErr, "document:\n%s", doc)
				require.NoError(t, bgpErr, "the document was accepted, the BGP config it maps to must be too")
			} else {
				require.Error(t, parseErr, "document:\n%s", doc)
				require.Error(t, bgpErr, "the document was refused, so must the BGP config be")
				if tt.why != "" {
					require.ErrorContains(t, parseErr, tt.why)
					require.ErrorContains(t, bgpErr, tt.why)
				}
			}
		})
	}
}

// TestBGPConfigAgreesForFleetNode: in a fleet document the link-local
// peer and the next_hop6 it needs may come from different levels; the
// node's merged bgp (ForNode) is what the Mux applies.
func TestBGPConfigAgreesForFleetNode(t *testing.T) {
	tests := []struct {
		name       string
		fleetExtra string
		nodeExtra  string
	}{
		{"fleet peer, node next_hop6", "  peers: [{address: 'fe80::1%eth0', asn: 65000}]\n", "      next_hop6: '2001:db8::11'\n"},
		{"node peer, fleet next_hop6", "  next_hop6: '2001:db8::10'\n", "      peers: [{address: 'fe80::1%eth0', asn: 65000}]\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := "version: 1\nbgp:\n  asn: 65010\n" + tt.fleetExtra +
				"nodes:\n  mux-1:\n    bgp:\n      router_id: 198.18.0.11\n" + tt.nodeExtra
			d, err := control.Parse([]byte(doc))
			require.NoError(t, err, "document:\n%s", doc)
			n, err := d.ForNode("mux-1")
			require.NoError(t, err)
			require.NoError(t, bgpConfig(n.BGP, nil).Validate())
		})
	}
}
