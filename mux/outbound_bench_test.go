package mux

import (
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/benchutil"
)

// outTraffic returns n frames of each kind the outbound benchmark sends:
// replies to outbound connections (TCP over IPv4 to vm1's static range
// and vm2's dynamic one, UDP over IPv6 to vm3's), and requests to web4's
// port 80 (balanced: the connection table, Maglev).
func outTraffic(tb testing.TB, n int) (returns, inbound [][]byte) {
	p := gopacket.Payload("0123456789abcdef")
	for i := range n {
		sport := uint16(10000 + i)
		switch i % 3 {
		case 0:
			returns = append(returns, seedFrame(tb, outIP4(outRemote, outWeb4, layers.IPProtocolTCP), outTCP(443, uint16(1024+i%2048)), p))
		case 1:
			returns = append(returns, seedFrame(tb, outIP4(outRemote, outWeb4, layers.IPProtocolTCP), outTCP(sport, uint16(2048+i%1024)), p))
		default:
			returns = append(returns, seedFrame(tb, outIP6(outRemot6, outWeb6, layers.IPProtocolUDP), outUDP(sport, uint16(4096+i%4096)), p))
		}
		inbound = append(inbound, seedFrame(tb, outIP4(outRemote, outWeb4, layers.IPProtocolTCP), outTCP(sport, 80), p))
	}
	return returns, inbound
}

// BenchmarkMuxReturns runs the Mux's pipeline (Mux.pipeline, the worker
// loading the Controller's snapshot per batch, as Run wires it) over
// outDoc with a dynamic allocation: kind=returns are replies to outbound
// connections (rule lookup misses, range table, encap to the owner),
// kind=inbound requests to the VIP (established flows: rule, connection
// table) in the same run, so x-inbound, returns' ns/pkt over inbound's,
// is a ratio on one machine. Run it with -cpu 1.
func BenchmarkMuxReturns(b *testing.B) {
	const n = 4096
	returns, inbound := outTraffic(b, n)
	var inboundNs float64
	for _, kind := range []struct {
		name   string
		frames [][]byte
	}{{"inbound", inbound}, {"returns", returns}} {
		b.Run("kind="+kind.name, func(b *testing.B) {
			r := newOutRigCapture(b, false)
			require.NoError(b, r.m.ctl.SetPortAllocations([]flow.PortAllocation{{VIP: outWeb4, First: 2048, Last: 3071, Owner: flow.PortOwner{DIP: outVM2.DIP}}}))
			r.uplink.Replay(kind.frames)
			for got := 0; got < 2*n; {
				got += r.w.Poll() // every flow seen twice: established
			}
			b.ReportAllocs()
			var cpu benchutil.CPUTimer
			b.ResetTimer()
			cpu.Start()
			got := 0
			for got < b.N {
				got += r.w.Poll()
			}
			cpuNs := cpu.Stop()
			b.StopTimer()
			if cpuNs > 0 {
				b.ReportMetric(float64(cpuNs)/float64(got), "cpu-ns/pkt")
			}
			st := r.stats()
			if st.Dropped() != 0 {
				b.Fatalf("drops: %v", st.DropsByName())
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(got)
			b.ReportMetric(ns, "ns/pkt")
			if kind.name == "inbound" {
				inboundNs = ns
			} else if inboundNs > 0 {
				b.ReportMetric(ns/inboundNs, "x-inbound")
			}
		})
	}
}

// TestOutboundNoAllocs: a Poll of 64 replies to outbound connections
// through the whole pipeline (range table, encap, counters) allocates
// nothing, nor does one of ICMP errors and echo replies about them.
func TestOutboundNoAllocs(t *testing.T) {
	returns, _ := outTraffic(t, 1024)
	var icmp [][]byte
	for _, c := range outCases(t) {
		if c.owner != nil && !c.balanced {
			icmp = append(icmp, c.frame)
		}
	}
	for name, frames := range map[string][][]byte{"replies": returns, "icmp and every other kind": icmp} {
		t.Run(name, func(t *testing.T) {
			r := newOutRigCapture(t, false)
			require.NoError(t, r.m.ctl.SetPortAllocations([]flow.PortAllocation{{VIP: outWeb4, First: 2048, Last: 3071, Owner: flow.PortOwner{DIP: outVM2.DIP}}}))
			r.uplink.Replay(frames)
			for got := 0; got < 2*len(frames); {
				got += r.w.Poll()
			}
			allocs := testing.AllocsPerRun(200, func() { r.w.Poll() })
			require.Zero(t, allocs, "allocations per Poll")
			st := r.stats()
			require.Zero(t, st.Dropped(), "drops: %v", st.DropsByName())
			require.NotZero(t, st.TX)
		})
	}
}

func (r *outRig) stats() (s engine.Stats) {
	r.w.Counters().Snapshot(&s)
	return s
}
