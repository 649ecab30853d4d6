package balance_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/flow"
)

// returnSource is a batch snapshot carrying only a range table (the
// rules come from the stage's own flow.Rules).
type returnSource struct{ t *balance.Returns }

func (s returnSource) Returns() *balance.Returns { return s.t }

var (
	owner1 = flow.PortOwner{DIP: netip.MustParseAddr("198.19.9.1"), Host: netip.MustParseAddr("198.19.0.9"), VNI: 7, MAC: [6]byte{2, 0, 0, 0, 9, 1}}
	owner6 = flow.PortOwner{DIP: netip.MustParseAddr("2001:db8:9::1"), Host: netip.MustParseAddr("2001:db8:254::9"), VNI: 8, MAC: [6]byte{2, 0, 0, 0, 9, 6}}
)

func testReturns(t *testing.T) *balance.Returns {
	rt, err := balance.NewReturns(balance.ReturnsConfig{
		Pools: []flow.PortAllocation{{VIP: vip4, First: 1024, Last: 65535}, {VIP: vip6, First: 1024, Last: 65535}},
		Allocations: []flow.PortAllocation{
			{VIP: vip4, First: 1024, Last: 2047, Owner: owner1},
			{VIP: vip6, First: 4096, Last: 4159, Owner: owner6},
		},
		Counter: func(a netip.Addr) uint32 { return map[netip.Addr]uint32{vip4: 3, vip6: 5}[a] },
	})
	require.NoError(t, err)
	return rt
}

func TestNewReturnsErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		alloc []flow.PortAllocation
		want  string
	}{
		{"no host", []flow.PortAllocation{{VIP: vip4, First: 1024, Last: 2047, Owner: flow.PortOwner{DIP: owner1.DIP, MAC: owner1.MAC}}}, "no host"},
		{"no MAC", []flow.PortAllocation{{VIP: vip4, First: 1024, Last: 2047, Owner: flow.PortOwner{DIP: owner1.DIP, Host: owner1.Host}}}, "no MAC"},
		{"VNI", []flow.PortAllocation{{VIP: vip4, First: 1024, Last: 2047, Owner: flow.PortOwner{Host: owner1.Host, MAC: owner1.MAC, VNI: 1 << 24}}}, "24 bits"},
		{"overlap", []flow.PortAllocation{{VIP: vip4, First: 1024, Last: 2047, Owner: owner1}, {VIP: vip4, First: 2000, Last: 3000, Owner: owner1}}, "overlap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := balance.NewReturns(balance.ReturnsConfig{Allocations: tc.alloc})
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestReturns: with and without a connection table, a packet without a
// rule goes to the owner of its port (a one-backend rule: the owner's
// DIP, host, VNI and MAC, backend ID flow.ReservedID, the address's
// counter index as the rule's ID) or is dropped as outbound_unallocated
// in the pool, no_rule outside it; a rule's packets are balanced as ever;
// without a range table in the batch's snapshot nothing changes.
func TestReturns(t *testing.T) {
	client4, client6 := netip.MustParseAddr("198.18.0.7"), netip.MustParseAddr("2001:db8::7")
	rt := testReturns(t)
	for _, stateful := range []bool{true, false} {
		h := newHarness(t, stateful, flow.Rule{Name: "web", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(2, 1)})
		for _, tc := range []struct {
			p    pkt
			want string
			own  *flow.PortOwner
		}{
			{pkt{src: client4, dst: vip4, sport: 443, dport: 1500, tcp: true, ack: true}, owner1.DIP.String(), &owner1},
			{pkt{src: client4, dst: vip4, sport: 53, dport: 2047}, owner1.DIP.String(), &owner1},
			{pkt{src: client4, dst: vip4, sport: 53, dport: 1500, frag: 1}, owner1.DIP.String(), &owner1},
			{pkt{src: client6, dst: vip6, sport: 443, dport: 4100, tcp: true, ack: true}, owner6.DIP.String(), &owner6},
			{pkt{src: client4, dst: vip4, sport: 443, dport: 2048, tcp: true, ack: true}, "drop:outbound_unallocated", nil},
			{pkt{src: client6, dst: vip6, sport: 443, dport: 4160}, "drop:outbound_unallocated", nil},
			{pkt{src: client4, dst: vip4, sport: 443, dport: 1000, tcp: true}, "drop:no_rule", nil},
			{pkt{src: client4, dst: vip4, sport: 53, dport: 1500, frag: 2}, "drop:no_rule", nil},
			{pkt{src: client4, dst: netip.MustParseAddr("198.18.100.2"), sport: 443, dport: 1500, tcp: true}, "drop:no_rule", nil},
		} {
			h.batch.Snapshot = returnSource{rt}
			got := h.run(tc.p.build())
			assert.Equal(t, tc.want, got, "stateful %v: %+v", stateful, tc.p)
			if tc.own != nil && got == tc.want {
				p := &h.pool[0]
				b := p.Rule.Backends[p.Backend]
				assert.Equal(t, flow.ReservedID, b.ID)
				assert.Equal(t, tc.own.Host, b.Host)
				assert.Equal(t, tc.own.MAC, b.MAC)
				assert.Equal(t, tc.own.VNI, p.Rule.VIP.VNI)
				assert.Equal(t, map[bool]uint32{true: 3, false: 5}[tc.own.DIP.Is4()], p.Rule.ID)
				assert.NotZero(t, p.Hash)
			}
			// Without the range table: no rule.
			h.batch.Snapshot = nil
			if tc.own != nil {
				assert.Equal(t, "drop:no_rule", h.run(tc.p.build()))
			}
		}
		h.batch.Snapshot = returnSource{rt}
		got := h.run(pkt{src: client4, dst: vip4, sport: 4000, dport: 80, tcp: true, syn: true}.build())
		assert.Contains(t, []string{"dip00", "dip01"}, got, "balanced")
	}
}
