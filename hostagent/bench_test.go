package hostagent

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/internal/lab/benchutil"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/nat"
)

// The Host Agent's two pipelines in memory, as the AF_XDP data path wires
// them (Agent.pipelines over pipeDoc: one host, two VMs on two VM ports),
// with a fixed next hop:
//
//	inbound  uplink MemPort → Decap → nat.Inbound                 → VM port
//	return   VM MemPorts → Parse{VNI} → nat.Return → nexthop.Stage(L3Dst) → uplink
//
// Each direction has a worker of its own over the same ports, so each is
// timed alone.

// haBenchRig is the agent's pipelines on in-memory ports: port 0 the
// uplink, then the VM ports in plan order.
type haBenchRig struct {
	ports   []*engine.MemPort
	inbound *engine.Worker // polls the uplink
	returns *engine.Worker // polls every VM port
	tr      *nat.Translator
	vmPorts []int // worker port of vm_a and vm_b, by backend (a, b)
}

func newHABenchRig(tb testing.TB, natCapacity int) *haBenchRig {
	doc, err := control.Parse([]byte(pipeDoc))
	require.NoError(tb, err)
	a, plan, tr, inbound, returns := agentPipelines(tb, doc, natCapacity)
	r := &haBenchRig{tr: tr}
	var ports []engine.Port
	for i := 0; i < 1+len(plan.Ports); i++ {
		p, err := engine.NewMemPort(engine.MemPortConfig{})
		require.NoError(tb, err)
		r.ports = append(r.ports, p)
		ports = append(ports, p)
	}
	var retInputs []engine.Input
	for i, vp := range plan.Ports {
		retInputs = append(retInputs, engine.Input{Port: int(vp.Index), Pipeline: returns[i]})
		r.vmPorts = append(r.vmPorts, int(vp.Index))
	}
	require.Equal(tb, []string{"vm_a", "vm_b"}, []string{plan.Ports[0].Interface, plan.Ports[1].Interface})
	// As a running agent's workers: the agent's snapshot once per batch.
	r.inbound, err = engine.NewWorker(engine.WorkerConfig{Ports: ports, Snapshot: a.batchSnapshot,
		Inputs: []engine.Input{{Port: UplinkPort, Pipeline: inbound}}})
	require.NoError(tb, err)
	r.returns, err = engine.NewWorker(engine.WorkerConfig{Ports: ports, Snapshot: a.batchSnapshot, Inputs: retInputs})
	require.NoError(tb, err)
	return r
}

// haBackends are pipeDoc's two VMs: MAC and DIP endpoint.
var haBackends = []struct {
	mac net.HardwareAddr
	dip netip.AddrPort
}{
	{net.HardwareAddr{2, 0, 0, 0, 4, 1}, netip.MustParseAddrPort("198.18.4.1:8080")},
	{net.HardwareAddr{2, 0, 0, 0, 4, 2}, netip.MustParseAddrPort("198.18.4.2:8080")},
}

// haBenchClient returns flow i's client: distinct addresses in
// 198.19.0.0/16 (not an infrastructure prefix of pipeDoc).
func haBenchClient(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}), uint16(20000+i%40000))
}

// haBenchFrames returns, for n flows (at most 65536) spread over the two
// VMs, the VXLAN frames a Mux sends (client → VIP, TCP ACK with 10 bytes of
// data, an established connection) and each VM's replies (DIP → client,
// TCP ACK with 10 bytes).
func haBenchFrames(tb testing.TB, n int) (in [][]byte, ret [2][][]byte) {
	require.LessOrEqual(tb, n, 1<<16)
	data := string(make([]byte, 10))
	for i := 0; i < n; i++ {
		be := haBackends[i%2]
		c := haBenchClient(i)
		inner := gpkt.Serialize(tb, tcpLayers(be.mac, net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, c, pipeVIP, false, true, data)...)
		eth := &layers.Ethernet{SrcMAC: routerMAC, DstMAC: uplinkMAC, EthernetType: layers.EthernetTypeIPv4}
		ip := &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
			SrcIP: pipeMux.AsSlice(), DstIP: pipeHost.AsSlice()}
		udp := &layers.UDP{SrcPort: layers.UDPPort(49152 + i%16384), DstPort: 4789}
		_ = udp.SetNetworkLayerForChecksum(ip)
		vx := &layers.VXLAN{ValidIDFlag: true, VNI: 100}
		in = append(in, gpkt.Serialize(tb, eth, ip, udp, vx, gopacket.Payload(inner)))
		ret[i%2] = append(ret[i%2], gpkt.Serialize(tb, tcpLayers(uplinkMAC, be.mac, be.dip, c, false, true, data)...))
	}
	return in, ret
}

// run polls w until at least pkts packets were received and returns how
// many were.
func (r *haBenchRig) run(w *engine.Worker, pkts int) int {
	n := 0
	for n < pkts {
		n += w.Poll()
	}
	return n
}

// BenchmarkHostAgentPipeline runs each direction of the Host Agent's data
// path on its own worker: Poll over MemPorts replaying one frame per flow
// (each copied into a port buffer as a NIC would write it), transmitted on
// the pipeline's out port. Before timing every flow's client packet is seen
// twice (the NAT entry exists and is established) and every reply once, so
// the timed part is the steady state: every NAT lookup hits.
//
//	dir=inbound  VXLAN on the uplink → Decap → nat.Inbound → VM port
//	dir=return   VM ports → Parse → nat.Return → nexthop.Stage(L3Dst) → uplink;
//	             avg-ns/pkt is the mean of this line and the last
//	             inbound run at the same flow count (a connection's two
//	             directions, one packet each)
//
// ns/pkt is wall time per packet, Mpps its inverse. Run it with -cpu 1.
func BenchmarkHostAgentPipeline(b *testing.B) {
	for _, sz := range []struct {
		name  string
		flows int
	}{{"1k", 1000}, {"64k", 1 << 16}} {
		var (
			r         *haBenchRig
			inboundNs float64
		)
		for _, dir := range []string{"inbound", "return"} {
			b.Run(fmt.Sprintf("flows=%s/dir=%s", sz.name, dir), func(b *testing.B) {
				if r == nil {
					in, ret := haBenchFrames(b, sz.flows)
					r = newHABenchRig(b, max(2*sz.flows, 1<<12))
					r.ports[UplinkPort].Replay(in)
					r.ports[r.vmPorts[0]].Replay(ret[0])
					r.ports[r.vmPorts[1]].Replay(ret[1])
					r.run(r.inbound, 2*sz.flows)
					r.run(r.returns, sz.flows)
				}
				w := r.inbound
				if dir == "return" {
					w = r.returns
				}
				before := r.tr.Stats()
				b.ReportAllocs()
				var cpu benchutil.CPUTimer
				b.ResetTimer()
				cpu.Start()
				n := r.run(w, b.N)
				cpuNs := cpu.Stop()
				b.StopTimer()
				if cpuNs > 0 {
					// The thread's CPU time: on a shared machine, wall
					// time also counts the waits for a core.
					b.ReportMetric(float64(cpuNs)/float64(n), "cpu-ns/pkt")
				}
				var s engine.Stats
				w.Counters().Snapshot(&s)
				if s.Dropped() != 0 {
					b.Fatalf("drops: %v", s.DropsByName())
				}
				if st := r.tr.Stats(); st.Stateless != before.Stateless || st.NewFlows != before.NewFlows {
					b.Fatalf("NAT state missed while timing: %+v (before %+v)", st, before)
				}
				ns := float64(b.Elapsed().Nanoseconds()) / float64(n)
				b.ReportMetric(ns, "ns/pkt")
				b.ReportMetric(1e3/ns, "Mpps")
				if dir == "inbound" {
					inboundNs = ns
				} else if inboundNs > 0 {
					b.ReportMetric((inboundNs+ns)/2, "avg-ns/pkt")
				}
			})
		}
		r = nil
	}
}
