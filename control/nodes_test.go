package control

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fleetDoc is one document for two Muxes: the fleet's BGP settings at the
// top, each Mux's own in nodes.
const fleetDoc = `version: 3
bgp:
  asn: 65010
  hold_time: 9s
  peers:
    - address: 198.18.0.254
      asn: 65000
nodes:
  mux-1:
    bgp:
      router_id: 198.18.0.11
      peers:
        - address: 198.18.0.1
          asn: 65000
  mux-2:
    bgp:
      asn: 65011
      router_id: 198.18.0.12
      next_hop: 198.18.0.12
      listen_addresses: [198.18.0.12]
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    backends:
      - name: vm-a
        address: 198.19.1.1
        mac: "02:00:00:00:01:01"
        host: 198.19.0.1
`

func TestFleetDocumentForNode(t *testing.T) {
	d, err := Parse([]byte(fleetDoc))
	require.NoError(t, err)
	require.Len(t, d.Nodes, 2)
	assert.False(t, d.BGP.RouterID.IsValid(), "the fleet's bgp has no router id")

	m1, err := d.ForNode("mux-1")
	require.NoError(t, err)
	assert.Equal(t, "mux-1", m1.Node.Name)
	assert.Nil(t, m1.Nodes, "a per-node document")
	again, err := m1.ForNode("mux-1")
	require.NoError(t, err)
	assert.Same(t, m1, again, "ForNode of a per-node document is that document")
	text1, err := m1.Marshal()
	require.NoError(t, err)
	back, err := Parse(text1)
	require.NoError(t, err, "the per-node document is a valid document:\n%s", text1)
	assert.Equal(t, m1, back)
	assert.Equal(t, uint32(65010), m1.BGP.ASN)
	assert.Equal(t, netip.MustParseAddr("198.18.0.11"), m1.BGP.RouterID)
	assert.Equal(t, 9e9, float64(m1.BGP.HoldTime), "the fleet's hold time")
	require.Len(t, m1.BGP.Peers, 2, "the fleet's peer and the node's")
	assert.Equal(t, netip.MustParseAddr("198.18.0.254"), m1.BGP.Peers[0].Address)
	assert.Equal(t, netip.MustParseAddr("198.18.0.1"), m1.BGP.Peers[1].Address)

	m2, err := d.ForNode("mux-2")
	require.NoError(t, err)
	assert.Equal(t, uint32(65011), m2.BGP.ASN)
	assert.Equal(t, netip.MustParseAddr("198.18.0.12"), m2.BGP.NextHop)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("198.18.0.12")}, m2.BGP.ListenAddresses)
	require.Len(t, m2.BGP.Peers, 1)
	assert.Same(t, &d.VIPs[0], &m2.VIPs[0], "the rest is shared")
	assert.Len(t, d.BGP.Peers, 1, "merging leaves the document alone")

	_, err = d.ForNode("mux-3")
	assert.ErrorIs(t, err, ErrUnknownNode)
	assert.ErrorContains(t, err, `"mux-3" is not in the nodes section (it lists mux-1, mux-2)`)
	_, err = d.ForNode("")
	assert.ErrorIs(t, err, ErrUnknownNode)
	assert.ErrorContains(t, err, "-node")

	// Marshal writes the nodes section back; the round trip is exact.
	text, err := d.Marshal()
	require.NoError(t, err)
	d2, err := Parse(text)
	require.NoError(t, err, "%s", text)
	assert.Equal(t, d, d2)
}

func TestPerNodeDocumentForNode(t *testing.T) {
	d, err := Parse([]byte(base))
	require.NoError(t, err)
	same, err := d.ForNode("")
	require.NoError(t, err)
	assert.Same(t, d, same)
	named, err := d.ForNode("mux-9")
	require.NoError(t, err)
	assert.Equal(t, "mux-9", named.Node.Name)
	assert.Equal(t, "", d.Node.Name)
}

func TestFleetDocumentErrors(t *testing.T) {
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"router id at the top", "  hold_time: 9s\n", "  hold_time: 9s\n  router_id: 198.18.0.10\n",
			"<doc>:5:14: bgp.router_id: a router id is per node, and this document has a nodes section that serves every node: move it to nodes.<name>.bgp.router_id"},
		{"node.name with nodes", "version: 3\n", "version: 3\nnode:\n  name: mux-1\n",
			"node.name: node.name says which node a per-node file is for"},
		{"shared router id", "      router_id: 198.18.0.12\n", "      router_id: 198.18.0.11\n",
			"nodes.mux-2.bgp.router_id: 198.18.0.11 is node mux-1's router id too"},
		{"node without router id", "      router_id: 198.18.0.11\n", "",
			"nodes.mux-1.bgp: no router_id"},
		{"fleet without asn", "  asn: 65010\n", "",
			"nodes.mux-1.bgp: no AS number: set bgp.asn for the fleet or nodes.mux-1.bgp.asn for this node"},
		{"peer twice", "        - address: 198.18.0.1\n", "        - address: 198.18.0.254\n",
			"nodes.mux-1.bgp.peers: peer 198.18.0.254 is in the fleet's bgp.peers too"},
		{"unknown node key", "  mux-2:\n    bgp:\n", "  mux-2:\n    bpg:\n",
			`nodes.mux-2: unknown key "bpg" (did you mean "bgp"?)`},
		{"hold time per node", "      asn: 65011\n", "      asn: 65011\n      hold_time: 3s\n",
			`nodes.mux-2.bgp: unknown key "hold_time"`},
		{"bad node name", "  mux-2:\n", "  mux 2:\n", "nodes"},
		{"node twice", "  mux-2:\n", "  mux-1:\n", `nodes.mux-1: node "mux-1" is listed twice`},
		{"nodes not a mapping", "nodes:\n  mux-1:\n", "nodes: [mux-1]\nxnodes:\n  mux-1:\n", "nodes: want a mapping from node name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Contains(t, fleetDoc, tc.old)
			doc := []byte(strings.Replace(fleetDoc, tc.old, tc.new, 1))
			_, err := parse("<doc>", doc)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalid))
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
