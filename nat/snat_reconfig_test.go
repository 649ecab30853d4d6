package nat_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/nat"
)

// runWorker puts frame through stage alone, in a batch of worker w, and
// returns the packet (nil when the frame does not parse).
func runWorker(t testing.TB, stage engine.Stage, frame []byte, vni uint32, w int) *engine.Packet {
	t.Helper()
	buf := make([]byte, engine.DefaultHeadroom+len(frame)+64)
	copy(buf[engine.DefaultHeadroom:], frame)
	p := new(engine.Packet)
	p.SetBuffer(nil, 0, buf, engine.DefaultHeadroom, len(frame), 3)
	require.Zero(t, engine.ParsePacket(p, vni))
	var b engine.Batch
	b.Worker = w
	b.Append(p)
	stage.Process(&b)
	return p
}

// TestSNATReconfiguredDuringBatch: a worker whose batch began under the
// previous outbound configuration meets a connection another worker made
// under the new one, whose VIP or DIP has an ID the batch's configuration
// does not list yet (IDs are handed out when an address is first
// configured, and never reused). The connection is translated by its
// state, in both directions, like any other: no panic, no second port
// claimed, no reply dropped.
//
// The SNAT's clock is read right after a batch loads the configuration, so
// the test changes the configuration and runs the other worker's packet
// from there: deterministically, the interleaving of two workers.
func TestSNATReconfiguredDuringBatch(t *testing.T) {
	vipN := netip.MustParseAddr("198.18.100.11") // a VIP address the SNAT has not seen yet
	moved := []nat.Outbound{{VIP: vipN, VNI: vni, DIPs: []netip.Addr{dipA, dipB}, Local: []netip.Prefix{localNet}}}
	for _, tc := range []struct {
		name string
		// first: the VM's packet the other worker sends under the new
		// configuration; later: the packet the batch that began before
		// it carries (the same connection's).
		first, later pkt
		back         bool // later is the remote's answer (Inbound), else the VM's next packet (Return)
	}{
		{"outgoing, a DIP moved to a new VIP", syn(ap(dipA, 40000), ap(remote, 443)), tcp(ap(dipA, 40000), ap(remote, 443)), false},
		// dipB has one port: its connection's is known in advance.
		{"returning, a new DIP", syn(ap(dipB, 40001), ap(remote, 443)), pkt{src: ap(remote, 443), dst: ap(vipN, 3100), syn: true, ack: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var now flow.Tick = 1000
			var hook func()
			s, err := nat.NewSNAT(nat.SNATConfig{Capacity: 4096, Seed: 1, Clock: func() flow.Tick {
				if h := hook; h != nil {
					hook = nil
					h()
				}
				return now
			}})
			require.NoError(t, err)
			require.NoError(t, s.SetOutbound(defaultSections()))
			s.SetAllocations([]flow.PortAllocation{alloc(vipO, 2048, 2111, dipA, vni),
				alloc(vipN, 3000, 3063, dipA, vni), alloc(vipN, 3100, 3100, dipB, vni)})
			e := newEnv(t, testRules(), testLocals(), func(c *nat.Config) { c.SNAT, c.Direct, c.HasDirect = s, directPort, true })

			var vp uint16
			hook = func() {
				// Another worker, under the new configuration.
				require.NoError(t, s.SetOutbound(moved))
				p := runWorker(t, e.ret, tc.first.frame(), vni, 1)
				require.Zero(t, p.Reason)
				require.Equal(t, vipN, p.Key.SrcAddr())
				vp = p.Key.SrcPort
			}
			frame, stage := tc.later.frame(), engine.Stage(e.ret)
			if tc.back {
				frame, stage = tc.later.to(macA).frame(), e.in
			}
			var p *engine.Packet
			require.NotPanics(t, func() { p = runWorker(t, stage, frame, vni, 0) })
			require.Zero(t, p.Reason, "dropped as %v", p.Reason)
			if tc.back {
				require.Equal(t, tc.first.src, netip.AddrPortFrom(p.Key.DstAddr(), p.Key.DstPort))
			} else {
				require.Equal(t, ap(vipN, vp), netip.AddrPortFrom(p.Key.SrcAddr(), p.Key.SrcPort), "the connection's port")
			}
			require.EqualValues(t, 1, s.Stats().Created, "one connection, one port")
		})
	}
}
