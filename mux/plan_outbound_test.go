package mux

import (
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// TestPlanOutbound: the plan of a document with outbound sections holds
// each section's pool, inbound ports and static allocations with their
// owners completed from hosts[] (host, VNI, MAC); it steers every TCP and
// UDP port and ICMP of the addresses; its text is the golden one
// (-update rewrites it).
func TestPlanOutbound(t *testing.T) {
	p, err := NewPlan(outDocument(t, 1, "1024-2047"), "")
	require.NoError(t, err)
	require.Len(t, p.Outbound, 2)
	o := p.Outbound[0]
	assert.Equal(t, outWeb4, o.Address)
	assert.Equal(t, []control.PortRange{{First: 1024, Last: 65535}}, o.Pool)
	assert.Equal(t, []uint16{80}, o.Inbound)
	assert.Equal(t, []flow.PortAllocation{{VIP: outWeb4, First: 1024, Last: 2047, Owner: outVM1}}, o.Static)
	assert.Equal(t, map[netip.Addr]flow.PortOwner{outVM1.DIP: outVM1, outVM2.DIP: outVM2}, o.Owners)
	assert.Equal(t, []flow.PortAllocation{{VIP: outWeb6, First: 4096, Last: 8191, Owner: outVM3}}, p.Outbound[1].Static)
	for _, r := range []steer.DstRule{
		{Addr: outWeb4, Proto: flow.ProtoTCP}, {Addr: outWeb4, Proto: flow.ProtoUDP}, {Addr: outWeb4, Proto: flow.ProtoICMP},
		{Addr: outWeb6, Proto: flow.ProtoTCP}, {Addr: outWeb6, Proto: flow.ProtoUDP}, {Addr: outWeb6, Proto: flow.ProtoICMPv6},
	} {
		assert.Contains(t, p.Steering.Dst, r)
	}
	golden := filepath.Join("testdata", "plan_outbound.golden")
	if *updateGolden {
		require.NoError(t, os.WriteFile(golden, []byte(p.String()), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	assert.Equal(t, string(want), p.String())
	d := p.Diff(p)
	assert.True(t, d.Empty(), "a plan differs from itself: %+v", d)
}

// TestPlanDiffOutbound: moving a static range, changing a pool and
// removing a section are each told apart.
func TestPlanDiffOutbound(t *testing.T) {
	p0, err := NewPlan(outDocument(t, 1, "1024-2047"), "")
	require.NoError(t, err)
	cases := []struct {
		name string
		edit func(d *control.Document)
		want func(t *testing.T, d PlanDiff)
	}{
		{"move a static range", func(d *control.Document) { d.Outbound[0].Static[0].Ports = control.PortRange{First: 3072, Last: 4095} }, func(t *testing.T, d PlanDiff) {
			assert.Equal(t, []flow.PortAllocation{{VIP: outWeb4, First: 3072, Last: 4095, Owner: outVM1}}, d.AllocationsAdded)
			assert.Equal(t, []flow.PortAllocation{{VIP: outWeb4, First: 1024, Last: 2047, Owner: outVM1}}, d.AllocationsRemoved)
			assert.Empty(t, d.Outbound)
		}},
		{"give a range to another DIP", func(d *control.Document) { d.Outbound[0].Static[0].DIP = outVM2.DIP }, func(t *testing.T, d PlanDiff) {
			assert.Equal(t, []flow.PortAllocation{{VIP: outWeb4, First: 1024, Last: 2047, Owner: outVM2}}, d.AllocationsAdded)
			assert.Equal(t, []flow.PortAllocation{{VIP: outWeb4, First: 1024, Last: 2047, Owner: outVM1}}, d.AllocationsRemoved)
		}},
		{"shrink a pool", func(d *control.Document) { d.Outbound[0].Pool[0].Last = 32767 }, func(t *testing.T, d PlanDiff) {
			assert.Equal(t, []netip.Addr{outWeb4}, d.Outbound)
			assert.Empty(t, d.AllocationsAdded)
		}},
		{"remove a section", func(d *control.Document) { d.Outbound = d.Outbound[:1] }, func(t *testing.T, d PlanDiff) {
			assert.Equal(t, []netip.Addr{outWeb6}, d.Outbound)
			assert.Equal(t, []flow.PortAllocation{{VIP: outWeb6, First: 4096, Last: 8191, Owner: outVM3}}, d.AllocationsRemoved)
			assert.Contains(t, d.SteerRemoved, steer.DstRule{Addr: outWeb6, Proto: flow.ProtoUDP})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := outDocument(t, 2, "1024-2047")
			c.edit(doc)
			p1, err := NewPlan(doc, "")
			require.NoError(t, err)
			d := p0.Diff(p1)
			t.Logf("%+v", d)
			require.False(t, d.Empty())
			c.want(t, d)
		})
	}
}

// TestOutboundAnnounced: an outbound address is announced even when none
// of its inbound backends can take new flows: its replies must reach the
// Muxes. Draining withdraws it like any VIP.
func TestOutboundAnnounced(t *testing.T) {
	doc := outDocument(t, 1, "1024-2047")
	for i := range doc.VIPs {
		doc.VIPs[i].Backends[0].State = flow.BackendDraining // nothing servable
	}
	ann := &fakeAnnouncer{}
	ctl, err := NewController(ControllerConfig{Rules: flow.NewRules(), Checker: &fakeChecker{states: map[string]health.State{}},
		Announcer: ann, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, ctl.Apply(doc))
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("198.19.255.1/32"), netip.MustParsePrefix("2001:db8:100::1/128")}, ctl.Announced())
	require.NoError(t, ctl.SetDraining(true))
	assert.Empty(t, ctl.Announced())
}
