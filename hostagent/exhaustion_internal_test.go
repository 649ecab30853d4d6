package hostagent

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
)

// TestBusiestDIPs: the exhaustion warning names the DIPs with the largest
// share of their ranges' ports in use, summed over their ranges.
func TestBusiestDIPs(t *testing.T) {
	a, b, c := netip.MustParseAddr("198.18.31.1"), netip.MustParseAddr("198.18.31.2"), netip.MustParseAddr("198.18.32.1")
	use := func(dip netip.Addr, first, last uint16, ports, conns int) flow.PortRangeUse {
		return flow.PortRangeUse{PortAllocation: flow.PortAllocation{First: first, Last: last, Owner: flow.PortOwner{DIP: dip}},
			Ports: ports, Conns: conns}
	}
	got := busiestDIPs([]flow.PortRangeUse{
		use(a, 1024, 1087, 10, 12),
		use(b, 2048, 2055, 8, 30),
		use(a, 1088, 1151, 40, 40),
		use(c, 4096, 4159, 1, 1),
	}, 2)
	require.Equal(t, []string{"198.18.31.2 8/8 ports, 30 connections", "198.18.31.1 50/128 ports, 52 connections"}, got)
	require.Empty(t, busiestDIPs(nil, 3))
}
