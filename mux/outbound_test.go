package mux

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/internal/node"
)

// outDoc serves web4 and web6 (port 80) and lets VMs use both addresses
// as their outbound source: web4's from 198.18.200.1 (static 1024-2047)
// and 198.18.200.2 (dynamic, in the tests), web6's from 2001:db8:200::3
// (static 4096-8191) on an IPv6 host.
const outDoc = `
version: %d
hash_seed: 7
hosts:
  - name: h1
    address: 198.18.254.1
    vms:
      - {vni: 100, address: 198.18.200.1, mac: "02:00:00:00:01:01", interface: vm1}
  - name: h2
    address: 198.18.254.2
    vms:
      - {vni: 100, address: 198.18.200.2, mac: "02:00:00:00:01:02", interface: vm2}
  - name: h3
    address: "2001:db8:254::3"
    vms:
      - {vni: 300, address: "2001:db8:200::3", mac: "02:00:00:00:03:03", interface: vm3}
vips:
  - name: web4
    address: 198.19.255.1
    protocol: tcp
    port: 80
    vni: 100
    backends:
      - {name: a, address: 198.18.200.1, mac: "02:00:00:00:01:01", host: 198.18.254.1}
  - name: web6
    address: "2001:db8:100::1"
    protocol: tcp
    port: 80
    vni: 300
    backends:
      - {name: f, address: "2001:db8:200::3", mac: "02:00:00:00:03:03", host: "2001:db8:254::3"}
outbound:
  - address: 198.19.255.1
    vni: 100
    dips: [198.18.200.1, 198.18.200.2]
    unit: 1024
    static:
      - {dip: 198.18.200.1, ports: %s}
  - address: "2001:db8:100::1"
    vni: 300
    dips: ["2001:db8:200::3"]
    static:
      - {dip: "2001:db8:200::3", ports: 4096-8191}
`

var (
	outWeb4   = netip.MustParseAddr("198.19.255.1")
	outWeb6   = netip.MustParseAddr("2001:db8:100::1")
	outRemote = netip.MustParseAddr("198.18.5.6") // the "internet" server the VMs talk to
	outRemot6 = netip.MustParseAddr("2001:db8:1::56")
	outRouter = netip.MustParseAddr("198.18.0.254")
	outRoute6 = netip.MustParseAddr("2001:db8:1::fe")
	// The owners, as hosts[] says.
	outVM1 = flow.PortOwner{DIP: netip.MustParseAddr("198.18.200.1"), Host: netip.MustParseAddr("198.18.254.1"), VNI: 100, MAC: [6]byte{2, 0, 0, 0, 1, 1}}
	outVM2 = flow.PortOwner{DIP: netip.MustParseAddr("198.18.200.2"), Host: netip.MustParseAddr("198.18.254.2"), VNI: 100, MAC: [6]byte{2, 0, 0, 0, 1, 2}}
	outVM3 = flow.PortOwner{DIP: netip.MustParseAddr("2001:db8:200::3"), Host: netip.MustParseAddr("2001:db8:254::3"), VNI: 300, MAC: [6]byte{2, 0, 0, 0, 3, 3}}
)

func outDocument(t testing.TB, version int, static string) *control.Document {
	doc, err := control.Parse([]byte(fmt.Sprintf(outDoc, version, static)))
	require.NoError(t, err)
	return doc
}

// outRig is a Mux that has applied outDoc (without a data path): one
// worker runs its pipeline (Mux.pipeline) over MemPorts with the
// Controller's snapshot, as Run wires it.
type outRig struct {
	m      *Mux
	w      *engine.Worker
	uplink *engine.MemPort
}

func newOutRig(t testing.TB) *outRig { return newOutRigCapture(t, true) }

// newOutRigCapture is newOutRig whose uplink keeps what it transmits, or
// not (benchmarks).
func newOutRigCapture(t testing.TB, capture bool) *outRig {
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	require.NoError(t, os.WriteFile(path, []byte("version: 0\n"), 0o644))
	m, err := New(Config{Interface: "uplink0", ConfigPath: path, SourceV4: benchMuxSrc,
		SourceV6: netip.MustParseAddr("2001:db8:254::1"), Conns: flow.ConnTableConfig{Capacity: 4096},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, m.ctl.Apply(outDocument(t, 1, "1024-2047")))
	pl, err := m.pipeline(7, benchUplink, partialHops, 1)
	require.NoError(t, err)
	up, err := engine.NewMemPort(engine.MemPortConfig{Name: "uplink", Capture: capture})
	require.NoError(t, err)
	kernel, err := engine.NewMemPort(engine.MemPortConfig{Name: "kernel", Capture: true})
	require.NoError(t, err)
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{up, kernel}, Snapshot: m.ctl.Snapshot,
		Inputs: []engine.Input{{Port: 0, Pipeline: pl}}})
	require.NoError(t, err)
	return &outRig{m: m, w: w, uplink: up}
}

// send runs frame through the pipeline and returns what left the uplink
// and the drops by reason.
func (r *outRig) send(frame []byte) ([][]byte, map[string]uint64) {
	var before, after engine.Stats
	r.w.Counters().Snapshot(&before)
	n := len(r.uplink.Transmitted())
	r.uplink.Inject(frame)
	for r.uplink.Stats().Queued > 0 {
		r.w.Poll()
	}
	r.w.Counters().Snapshot(&after)
	drops := map[string]uint64{}
	names := engine.DropReasons()
	for i := range after.Drops {
		if d := after.Drops[i] - before.Drops[i]; d > 0 {
			drops[names[i]] = d
		}
	}
	return r.uplink.Transmitted()[n:], drops
}

// Frame builders (gopacket).
func outIP4(src, dst netip.Addr, proto layers.IPProtocol) *layers.IPv4 {
	return &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(), Flags: layers.IPv4DontFragment}
}

func outIP6(src, dst netip.Addr, next layers.IPProtocol) *layers.IPv6 {
	return &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: next, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
}

func outTCP(sport, dport uint16) *layers.TCP {
	return &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: 9, Ack: 1, ACK: true, SYN: true, Window: 65535}
}

func outUDP(sport, dport uint16) *layers.UDP {
	return &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
}

func outICMP4(typ, code uint8, id uint16) *layers.ICMPv4 {
	return &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, code), Id: id, Seq: 1}
}

// outCases are the returning packets of the golden test and where they
// must go: an owner (VXLAN to its host, its VNI, its MAC), the Mux's echo
// reply, or a drop.
func outCases(t testing.TB) []outCase {
	p := gopacket.Payload("reply bytes")
	// Quotes: what a router on the way out saw of a VM's source-NATed
	// packet (VIP:port → remote), 28 or 48 bytes of it as routers do.
	quote4 := gpkt.Serialize(t, outIP4(outWeb4, outRemote, layers.IPProtocolTCP), outTCP(1500, 443), gopacket.Payload(make([]byte, 1400)))[:28]
	quoteU4 := gpkt.Serialize(t, outIP4(outWeb4, outRemote, layers.IPProtocolUDP), outUDP(2100, 53), gopacket.Payload("q"))[:28]
	quotePing4 := gpkt.Serialize(t, outIP4(outWeb4, outRemote, layers.IPProtocolICMPv4), outICMP4(8, 0, 2200), gopacket.Payload("ping"))[:28]
	quoteU6 := gpkt.Serialize(t, outIP6(outWeb6, outRemot6, layers.IPProtocolUDP), outUDP(5000, 53), gopacket.Payload(make([]byte, 1400)))[:48]
	quoteUnalloc := gpkt.Serialize(t, outIP4(outWeb4, outRemote, layers.IPProtocolTCP), outTCP(9000, 443), gopacket.Payload("x"))[:28]
	return []outCase{
		{name: "tcp4 reply, static allocation", frame: seedFrame(t, outIP4(outRemote, outWeb4, layers.IPProtocolTCP), outTCP(443, 1500), p), owner: &outVM1},
		{name: "udp4 reply, dynamic allocation (host and MAC from hosts[])", frame: seedFrame(t, outIP4(outRemote, outWeb4, layers.IPProtocolUDP), outUDP(53, 2100), p), owner: &outVM2},
		{name: "tcp6 reply, static allocation, IPv6 host", frame: seedFrame(t, outIP6(outRemot6, outWeb6, layers.IPProtocolTCP), outTCP(443, 4100), p), owner: &outVM3},
		{name: "udp6 reply", frame: seedFrame(t, outIP6(outRemot6, outWeb6, layers.IPProtocolUDP), outUDP(53, 8191), p), owner: &outVM3},
		{name: "icmp4 frag needed quoting an outbound tcp connection", frame: seedFrame(t, outIP4(outRouter, outWeb4, layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 4), Seq: 1400}, gopacket.Payload(quote4)), owner: &outVM1},
		{name: "icmp4 port unreachable quoting an outbound udp exchange", frame: seedFrame(t, outIP4(outRemote, outWeb4, layers.IPProtocolICMPv4),
			outICMP4(3, 3, 0), gopacket.Payload(quoteU4)), owner: &outVM2},
		{name: "icmp4 time exceeded quoting a VM's ping", frame: seedFrame(t, outIP4(outRouter, outWeb4, layers.IPProtocolICMPv4),
			outICMP4(11, 0, 0), gopacket.Payload(quotePing4)), owner: &outVM2},
		{name: "icmp6 packet too big quoting an outbound udp exchange", frame: seedFrame(t, outIP6(outRoute6, outWeb6, layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypePacketTooBig, 0)},
			gopacket.Payload(append([]byte{0, 0, 0x05, 0x00}, quoteU6...))), owner: &outVM3},
		{name: "echo4 reply to a VM's ping", frame: seedFrame(t, outIP4(outRemote, outWeb4, layers.IPProtocolICMPv4), outICMP4(0, 0, 1600), p), owner: &outVM1},
		{name: "echo6 reply to a VM's ping", frame: seedFrame(t, outIP6(outRemot6, outWeb6, layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoReply, 0)}, &layers.ICMPv6Echo{Identifier: 6000, SeqNumber: 1}, p), owner: &outVM3},
		// Not returning traffic.
		{name: "echo4 request: answered by the Mux", frame: seedFrame(t, outIP4(outRemote, outWeb4, layers.IPProtocolICMPv4), outICMP4(8, 0, 1600), p), echo: true},
		{name: "echo6 request: answered by the Mux", frame: seedFrame(t, outIP6(outRemot6, outWeb6, layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)}, &layers.ICMPv6Echo{Identifier: 6000, SeqNumber: 1}, p), echo: true},
		{name: "tcp4 to the VIP port: balanced", frame: seedFrame(t, outIP4(outRemote, outWeb4, layers.IPProtocolTCP), outTCP(40000, 80), p), owner: &outVM1, balanced: true},
		{name: "tcp4 to a pool port nobody holds", frame: seedFrame(t, outIP4(outRemote, outWeb4, layers.IPProtocolTCP), outTCP(443, 9000), p), drop: "outbound_unallocated"},
		{name: "echo4 reply with an unallocated id", frame: seedFrame(t, outIP4(outRemote, outWeb4, layers.IPProtocolICMPv4), outICMP4(0, 0, 9000), p), drop: "outbound_unallocated"},
		{name: "icmp4 error quoting an unallocated port", frame: seedFrame(t, outIP4(outRouter, outWeb4, layers.IPProtocolICMPv4),
			outICMP4(3, 3, 0), gopacket.Payload(quoteUnalloc)), drop: "outbound_unallocated"},
		{name: "tcp4 to a port outside the pool", frame: seedFrame(t, outIP4(outRemote, outWeb4, layers.IPProtocolTCP), outTCP(443, 81), p), drop: "no_rule"},
		{name: "echo4 reply to no VIP", frame: seedFrame(t, outIP4(outRemote, netip.MustParseAddr("198.19.255.9"), layers.IPProtocolICMPv4), outICMP4(0, 0, 1600), p), drop: "no_rule"},
	}
}

type outCase struct {
	name     string
	frame    []byte
	owner    *flow.PortOwner // VXLAN to it
	balanced bool            // (and counted as the VIP's, not as returning traffic)
	echo     bool            // the Mux's echo reply
	drop     string
}

// TestOutboundReturns is the golden test of the returning traffic: each
// packet (TCP and UDP replies, ICMP errors quoting outbound connections,
// echo replies, both families) goes to the owner of its port, checked
// with gopacket: VXLAN from the Mux to the owner's host, the owner's VNI,
// its MAC as the inner destination (what the Host Agent's decap picks the
// VM port by), the packet itself unchanged but for its TTL / hop limit;
// echo requests stay answered by the Mux; a pool port no allocation holds
// is dropped as outbound_unallocated; the per-address counters count
// exactly the returning packets and their IP bytes.
func TestOutboundReturns(t *testing.T) {
	r := newOutRig(t)
	// vm2's range is dynamic: given with its DIP only (the fleet's
	// allocator's view), the Mux completes host, VNI and MAC.
	require.NoError(t, r.m.ctl.SetPortAllocations([]flow.PortAllocation{{VIP: outWeb4, First: 2048, Last: 3071, Owner: flow.PortOwner{DIP: outVM2.DIP}}}))
	want := map[string]float64{}
	for _, tc := range outCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			out, drops := r.send(tc.frame)
			if tc.drop != "" {
				require.Empty(t, out)
				require.Equal(t, map[string]uint64{tc.drop: 1}, drops)
				return
			}
			require.Empty(t, drops)
			require.Len(t, out, 1)
			if tc.echo {
				pkt := gopacket.NewPacket(out[0], layers.LayerTypeEthernet, gopacket.Default)
				if icmp, ok := pkt.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
					require.Equal(t, uint8(layers.ICMPv4TypeEchoReply), icmp.TypeCode.Type())
				} else {
					icmp6, ok := pkt.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
					require.True(t, ok, "no ICMP in %x", out[0])
					require.Equal(t, uint8(layers.ICMPv6TypeEchoReply), icmp6.TypeCode.Type())
				}
				return
			}
			ipLen := checkOwnerVXLAN(t, out[0], tc.frame, *tc.owner)
			if !tc.balanced {
				pkt := gopacket.NewPacket(tc.frame, layers.LayerTypeEthernet, gopacket.Default)
				dst, _ := netip.AddrFromSlice(pkt.NetworkLayer().NetworkFlow().Dst().Raw())
				k := fmt.Sprintf("xdplb_vip_return_packets_total{address=%q}", dst)
				want[k]++
				want[strings.Replace(k, "packets", "bytes", 1)] += float64(ipLen)
			}
		})
	}
	got := map[string]float64{}
	for k, v := range scrape(t, r.m.Collector()) {
		if strings.HasPrefix(k, "xdplb_vip_return_") {
			got[k] = v
		}
	}
	require.Equal(t, want, got)
}

// checkOwnerVXLAN checks with gopacket that fr is in, encapsulated by the
// Mux towards o, and returns the inner IP packet's length.
func checkOwnerVXLAN(t testing.TB, fr, in []byte, o flow.PortOwner) int {
	t.Helper()
	pkt := gopacket.NewPacket(fr, layers.LayerTypeEthernet, gopacket.Default)
	var outerDst net.IP
	if o.Host.Is4() {
		ip, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		require.True(t, ok, "no outer IPv4 in %x", fr)
		require.Equal(t, benchMuxSrc.AsSlice(), []byte(ip.SrcIP.To4()))
		require.Zero(t, gpkt.Checksum(fr[14:34]), "outer IPv4 header checksum")
		outerDst = ip.DstIP
	} else {
		ip, ok := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		require.True(t, ok, "no outer IPv6 in %x", fr)
		outerDst = ip.DstIP
	}
	require.Equal(t, o.Host.AsSlice(), []byte(outerDst), "outer destination: the owner's host")
	u, ok := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	require.True(t, ok)
	require.EqualValues(t, 4789, u.DstPort)
	vx, ok := pkt.Layer(layers.LayerTypeVXLAN).(*layers.VXLAN)
	require.True(t, ok, "no VXLAN in %x", fr)
	require.Equal(t, o.VNI, vx.VNI, "VNI: the owner's")
	inner := vx.Payload
	require.Equal(t, o.MAC[:], inner[:6], "inner destination: the owner's MAC")
	// The packet itself, TTL / hop limit one less (and the IPv4 header
	// checksum still right).
	want := append([]byte(nil), in[14:]...)
	if want[0]>>4 == 4 {
		want = want[:int(want[2])<<8|int(want[3])] // without the Ethernet padding, which the Mux drops
	}
	got := inner[14:]
	if want[0]>>4 == 4 {
		want[8]--
		require.Zero(t, gpkt.Checksum(got[:20]), "inner IPv4 header checksum")
		copy(want[10:12], got[10:12])
	} else {
		want[7]--
	}
	require.True(t, bytes.Equal(want, got), "inner packet\n want %x\n got  %x", want, got)
	return len(got)
}

// TestSetPortAllocations: dynamic allocations that the document does not
// allow are refused (each named, wrapping ErrAllocationRefused, counted),
// the others applied; owners are completed from hosts[]; a new document
// refuses what it no longer allows and keeps the rest.
func TestSetPortAllocations(t *testing.T) {
	r := newOutRig(t)
	ctl := r.m.ctl
	dip2 := flow.PortOwner{DIP: outVM2.DIP}
	good := flow.PortAllocation{VIP: outWeb4, First: 2048, Last: 3071, Owner: dip2}
	cases := []struct {
		alloc flow.PortAllocation
		want  string
	}{
		{flow.PortAllocation{VIP: netip.MustParseAddr("198.19.255.9"), First: 2048, Last: 3071, Owner: dip2}, "no outbound section"},
		{flow.PortAllocation{VIP: outWeb4, First: 1024, Last: 2047, Owner: dip2}, "overlaps a static allocation"},
		{flow.PortAllocation{VIP: outWeb4, First: 128, Last: 255, Owner: dip2}, "not within the pool"},
		{flow.PortAllocation{VIP: outWeb4, First: 80, Last: 80, Owner: dip2}, "inbound port"},
		{flow.PortAllocation{VIP: outWeb4, First: 3000, Last: 4095, Owner: dip2}, "overlaps another dynamic allocation"},
		{flow.PortAllocation{VIP: outWeb4, First: 4096, Last: 5119, Owner: flow.PortOwner{DIP: netip.MustParseAddr("198.18.200.9")}}, "not one of the outbound section's"},
		{flow.PortAllocation{VIP: outWeb4, First: 4096, Last: 5119, Owner: flow.PortOwner{DIP: outVM2.DIP, VNI: 300}}, "VNI 300"},
	}
	allocs := []flow.PortAllocation{good}
	for _, c := range cases {
		allocs = append(allocs, c.alloc)
	}
	err := ctl.SetPortAllocations(allocs)
	require.Error(t, err)
	require.ErrorIs(t, err, ErrAllocationRefused)
	for _, c := range cases {
		assert.ErrorContains(t, err, c.want)
	}
	require.Len(t, err.(interface{ Unwrap() []error }).Unwrap(), len(cases))
	require.EqualValues(t, len(cases), ctl.refused.Load())
	require.EqualValues(t, len(cases), scrape(t, r.m.Collector())["xdplb_outbound_allocations_refused_total"])
	full := good
	full.Owner = outVM2
	require.Contains(t, ctl.PortAllocations(), full, "the good one is applied, its owner completed")
	require.EqualValues(t, 3, scrape(t, r.m.Collector())["xdplb_outbound_allocations"])

	// A document whose static allocation takes vm2's range: the dynamic
	// one is refused (counted), the static one wins.
	refused := ctl.refused.Load()
	require.NoError(t, ctl.Apply(outDocument(t, 2, "2048-3071")))
	require.NotContains(t, ctl.PortAllocations(), full)
	require.Greater(t, ctl.refused.Load(), refused)
	o, ok := ctl.Snapshot().(*muxSnapshot).Returns().Owner(ptr(flow.KeyFrom(100, flow.ProtoTCP, netip.AddrPortFrom(outRemote, 1), netip.AddrPortFrom(outWeb4, 2500))))
	require.True(t, ok)
	require.Equal(t, outVM1, o)
	// Back: the kept set applies again.
	require.NoError(t, ctl.Apply(outDocument(t, 3, "1024-2047")))
	require.Contains(t, ctl.PortAllocations(), full)

	// Only the good one: no error.
	require.NoError(t, ctl.SetPortAllocations([]flow.PortAllocation{good}))
	require.True(t, errors.Is(ctl.SetPortAllocations(allocs[1:2]), ErrAllocationRefused))
}

func ptr[T any](v T) *T { return &v }

// TestOneVersionPerBatchOutbound is TestOneVersionPerBatch for the range
// table: while a worker runs the Mux's pipeline over replies to two
// ranges of web4 — one static (the document moves it between vm1 and
// vm2 at every version) and one dynamic (SetPortAllocations moves it
// between them as fast as it can, from another goroutine) — every reply
// of a batch goes to the owner the batch's snapshot names, and none is
// dropped. A stage reading the range table from anywhere but the batch's
// snapshot would, sooner or later, send a reply by another version.
func TestOneVersionPerBatchOutbound(t *testing.T) {
	r := newOutRig(t)
	ctl := r.m.ctl
	doc := func(v int) *control.Document { // the static range: vm1's at odd versions, vm2's at even ones
		d := outDocument(t, v, "1024-2047")
		if v%2 == 0 {
			d.Outbound[0].Static[0].DIP = outVM2.DIP
		}
		return d
	}
	require.NoError(t, ctl.Apply(doc(1)))
	dyn := func(i int) []flow.PortAllocation {
		o := outVM1.DIP
		if i%2 == 0 {
			o = outVM2.DIP
		}
		return []flow.PortAllocation{{VIP: outWeb4, First: 2048, Last: 3071, Owner: flow.PortOwner{DIP: o}}}
	}
	require.NoError(t, ctl.SetPortAllocations(dyn(1)))

	var batches, pkts, wrong atomic.Int64
	var firstWrong atomic.Value
	check := engine.StageFunc(func(b *engine.Batch) {
		ms, _ := b.Snapshot.(*muxSnapshot)
		batches.Add(1)
		for _, p := range b.Packets() {
			pkts.Add(1)
			o, ok := ms.Returns().Owner(&p.Key)
			switch {
			case !ok:
				wrong.Add(1)
				firstWrong.CompareAndSwap(nil, fmt.Sprintf("port %d has no owner in the batch's snapshot", p.Key.DstPort))
			case p.Rule == nil || p.Rule.Backends[p.Backend].Addr != o.DIP || p.Rule.Backends[p.Backend].MAC != o.MAC:
				wrong.Add(1)
				firstWrong.CompareAndSwap(nil, fmt.Sprintf("port %d sent to %v, the batch's snapshot says %v", p.Key.DstPort, p.Rule.Backends[p.Backend].Addr, o.DIP))
			}
		}
	})
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{r.uplink}, Snapshot: ctl.Snapshot,
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(mustPipeline(t, r.m), check)}}})
	require.NoError(t, err)
	var frames [][]byte
	for i := range 256 {
		port := uint16(1024 + i*8) // 1024..3064: both ranges
		frames = append(frames, seedFrame(t, outIP4(outRemote, outWeb4, layers.IPProtocolTCP), outTCP(443, port), gopacket.Payload("x")))
	}
	r.uplink.Replay(frames)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for v := 2; ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := ctl.Apply(doc(v)); err != nil {
				t.Errorf("apply %d: %v", v, err)
				return
			}
		}
	}()
	var sets atomic.Int64
	go func() {
		defer wg.Done()
		for i := 2; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := ctl.SetPortAllocations(dyn(i)); err != nil {
				t.Errorf("set %d: %v", i, err)
				return
			}
			sets.Add(1)
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	for batches.Load() < 20000 && time.Now().Before(deadline) {
		w.Poll()
	}
	close(stop)
	wg.Wait()
	var st engine.Stats
	w.Counters().Snapshot(&st)
	t.Logf("%d batches, %d packets through %d versions and %d sets of allocations; drops %v", batches.Load(), pkts.Load(),
		ctl.Version(), sets.Load(), st.DropsByName())
	require.Zero(t, wrong.Load(), "first: %v", firstWrong.Load())
	require.Zero(t, st.Dropped(), "drops: %v", st.DropsByName())
	require.Greater(t, ctl.Version(), uint64(10), "too few reloads to show anything")
	require.Greater(t, sets.Load(), int64(10), "too few sets of allocations to show anything")
}

// mustPipeline is the Mux's pipeline of one worker.
func mustPipeline(t testing.TB, m *Mux) *engine.Pipeline {
	pl, err := m.pipeline(7, benchUplink, partialHops, 1)
	require.NoError(t, err)
	return pl
}

// The Controller is what the fleet's allocation watcher hands the Host
// Agents' ranges to (examples/mux: node.Fleet.WatchPortAllocations).
var _ node.PortAllocationSink = (*Controller)(nil)
