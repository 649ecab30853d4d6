package hostagent

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/nat"
)

// The pipelines an Agent assembles, run on in-memory ports with a fixed
// next hop: the same stages and wiring as the AF_XDP data path, without
// privileges.

const pipeDoc = `version: 1
infra_prefixes: [198.18.1.0/24]
mux_prefixes: [198.18.1.2/32]
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    backends:
      - {name: a, address: 198.18.4.1, port: 8080, mac: "02:00:00:00:04:01", host: 198.18.3.2}
      - {name: b, address: 198.18.4.2, port: 8080, mac: "02:00:00:00:04:02", host: 198.18.3.2}
hosts:
  - name: host-1
    address: 198.18.3.2
    vms:
      - {vni: 100, address: 198.18.4.1, mac: "02:00:00:00:04:01", interface: vm_a}
      - {vni: 100, address: 198.18.4.2, mac: "02:00:00:00:04:02", interface: vm_b}
`

var (
	pipeClient  = netip.MustParseAddrPort("198.18.5.2:40000")
	pipeVIP     = netip.MustParseAddrPort("198.18.100.1:80")
	pipeMux     = netip.MustParseAddr("198.18.1.2")
	pipeHost    = netip.MustParseAddr("198.18.3.2")
	routerMAC   = net.HardwareAddr{2, 0, 0, 0, 0xfe, 1}
	uplinkMAC   = net.HardwareAddr{2, 0, 0, 0, 0xfe, 2}
	uplinkIndex = 7
)

// fixedHop resolves every destination to the router through the uplink,
// as a warm nexthop.Resolver between route or neighbour changes.
var fixedHop = nexthop.Static{Default: nexthop.Hop{IfIndex: uplinkIndex, SrcMAC: [6]byte(uplinkMAC), DstMAC: [6]byte(routerMAC)}}

type pipeRig struct {
	a     *Agent
	w     *engine.Worker
	ports []*engine.MemPort // uplink, vm_a, vm_b, slow path
	tr    *nat.Translator
}

func newPipeRig(t testing.TB, capture bool) *pipeRig { return newPipeRigDoc(t, pipeDoc, capture) }

// newPipeRigDoc is newPipeRig for document text (host-1 must list VMs on
// vm_a and vm_b).
func newPipeRigDoc(t testing.TB, text string, capture bool) *pipeRig {
	doc, err := control.Parse([]byte(text))
	require.NoError(t, err)
	a, plan, tr, inbound, returns := agentPipelines(t, doc, 1<<12)
	r := &pipeRig{a: a, tr: tr}
	// The workers of a running agent read its snapshot once per batch.
	cfg := engine.WorkerConfig{Inputs: []engine.Input{{Port: UplinkPort, Pipeline: inbound}}, Snapshot: a.batchSnapshot}
	// The uplink, the VM ports and the slow path (direct connections).
	for i := 0; i < 2+len(plan.Ports); i++ {
		p, err := engine.NewMemPort(engine.MemPortConfig{Capture: capture})
		require.NoError(t, err)
		r.ports = append(r.ports, p)
		cfg.Ports = append(cfg.Ports, p)
	}
	for i, vp := range plan.Ports {
		cfg.Inputs = append(cfg.Inputs, engine.Input{Port: int(vp.Index), Pipeline: returns[i]})
	}
	r.w, err = engine.NewWorker(cfg)
	require.NoError(t, err)
	return r
}

// agentPipelines makes an agent for host-1 (with a NAT table of
// natCapacity connections) that has applied and published doc (without a
// data path), a Translator for its plan, and the pipelines a running
// agent would build (next hops: fixedHop).
func agentPipelines(t testing.TB, doc *control.Document, natCapacity int) (*Agent, *Plan, *nat.Translator, *engine.Pipeline, []*engine.Pipeline) {
	a, err := New(Config{Uplink: "up", ConfigPath: "unused", Logger: slog.New(slog.DiscardHandler), NAT: nat.TableConfig{Capacity: natCapacity}})
	require.NoError(t, err)
	a.cfg.Host = "host-1"
	require.NoError(t, a.apply(doc))
	a.mu.Lock()
	a.publish()
	plan, dips := a.plan, a.dips
	a.mu.Unlock()
	tr, err := nat.New(nat.Config{Rules: a.rules, Table: a.table, Uplink: UplinkPort, Infra: plan.Infra,
		Direct: slowPort(plan), HasDirect: true, SNAT: a.snat})
	require.NoError(t, err)
	tr.SetDIPs(dips)
	inbound, returns, err := a.pipelines(plan, tr, uplinkIndex, fixedHop)
	require.NoError(t, err)
	return a, plan, tr, inbound, returns
}

// tcpLayers are Ethernet/IPv4/TCP headers with a payload.
func tcpLayers(dstMAC, srcMAC net.HardwareAddr, src, dst netip.AddrPort, syn, ack bool, payload string) []gopacket.SerializableLayer {
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()), SYN: syn, ACK: ack, Window: 1000, Seq: 1}
	_ = tcp.SetNetworkLayerForChecksum(ip)
	return []gopacket.SerializableLayer{eth, ip, tcp, gopacket.Payload(payload)}
}

// vxlanFrame is what a Mux sends: the client's frame to the VIP, inner
// destination the backend's MAC, in VXLAN to the host.
func vxlanFrame(t testing.TB, backendMAC net.HardwareAddr, payload string) []byte {
	inner := gpkt.Serialize(t, tcpLayers(backendMAC, net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, pipeClient, pipeVIP, true, false, payload)...)
	return wrapVXLAN(t, inner, nil)
}

// wrapVXLAN puts the frame inner in VXLAN from the Mux to the host (VNI
// 100); edit, when not nil, may change the outer IPv4 and VXLAN headers
// first.
func wrapVXLAN(tb testing.TB, inner []byte, edit func(*layers.IPv4, *layers.VXLAN)) []byte {
	eth := &layers.Ethernet{SrcMAC: routerMAC, DstMAC: uplinkMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
		SrcIP: pipeMux.AsSlice(), DstIP: pipeHost.AsSlice()}
	udp := &layers.UDP{SrcPort: 50000, DstPort: 4789}
	vx := &layers.VXLAN{ValidIDFlag: true, VNI: 100}
	if edit != nil {
		edit(ip, vx)
	}
	return gpkt.Serialize(tb, eth, ip, udp, vx, gopacket.Payload(inner))
}

// decodeTCP decodes a frame with gopacket and checks its checksums.
func decodeTCP(t testing.TB, f []byte) (eth *layers.Ethernet, src, dst netip.AddrPort, tcp *layers.TCP) {
	t.Helper()
	pkt := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
	require.Nil(t, pkt.ErrorLayer())
	eth = pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	ip := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	tcp = pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
	// Recompute the checksums over the decoded layers: they must agree.
	ls := tcpLayers(eth.DstMAC, eth.SrcMAC,
		netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip.SrcIP.To4())), uint16(tcp.SrcPort)),
		netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip.DstIP.To4())), uint16(tcp.DstPort)), tcp.SYN, tcp.ACK, string(tcp.Payload))
	ls[1].(*layers.IPv4).TTL = ip.TTL
	want := gpkt.Serialize(t, ls...)
	wpkt := gopacket.NewPacket(want, layers.LayerTypeEthernet, gopacket.Default)
	assert.Equal(t, wpkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4).Checksum, ip.Checksum, "IPv4 checksum")
	assert.Equal(t, wpkt.Layer(layers.LayerTypeTCP).(*layers.TCP).Checksum, tcp.Checksum, "TCP checksum")
	src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip.SrcIP.To4())), uint16(tcp.SrcPort))
	dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip.DstIP.To4())), uint16(tcp.DstPort))
	return eth, src, dst, tcp
}

func TestPipelinesDSRRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		mac  net.HardwareAddr
		dip  netip.AddrPort
		port int // worker port of the VM
	}{
		{"vm_a", net.HardwareAddr{2, 0, 0, 0, 4, 1}, netip.MustParseAddrPort("198.18.4.1:8080"), 1},
		{"vm_b", net.HardwareAddr{2, 0, 0, 0, 4, 2}, netip.MustParseAddrPort("198.18.4.2:8080"), 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newPipeRig(t, true)
			// Inbound: VXLAN on the uplink → the VM's port, VIP → DIP.
			r.ports[UplinkPort].Inject(vxlanFrame(t, tc.mac, "GET /"))
			r.w.Poll()
			for i, p := range r.ports {
				if i != tc.port {
					require.Empty(t, p.Transmitted(), "port %d", i)
				}
			}
			out := r.ports[tc.port].Transmitted()
			require.Len(t, out, 1)
			eth, src, dst, tcp := decodeTCP(t, out[0])
			assert.Equal(t, tc.mac.String(), eth.DstMAC.String())
			assert.Equal(t, pipeClient, src)
			assert.Equal(t, tc.dip, dst)
			assert.Equal(t, "GET /", string(tcp.Payload))

			// Return: the VM's SYN-ACK → the uplink, DIP → VIP, to the
			// router's MAC.
			r.ports[tc.port].Inject(gpkt.Serialize(t, tcpLayers(uplinkMAC, tc.mac, tc.dip, pipeClient, true, true, "")...))
			r.w.Poll()
			back := r.ports[UplinkPort].Transmitted()
			require.Len(t, back, 1)
			eth, src, dst, _ = decodeTCP(t, back[0])
			assert.Equal(t, uint8(63), back[0][14+8], "the host routes the reply: TTL one less")
			assert.Equal(t, routerMAC.String(), eth.DstMAC.String())
			assert.Equal(t, uplinkMAC.String(), eth.SrcMAC.String())
			assert.Equal(t, pipeVIP, src)
			assert.Equal(t, pipeClient, dst)
			st := r.tr.Stats()
			assert.EqualValues(t, 1, st.Inbound)
			assert.EqualValues(t, 1, st.Return)
		})
	}
}

func TestPipelinesDrops(t *testing.T) {
	r := newPipeRig(t, true)
	// VXLAN for a MAC no VM has, and a VM reply to an infrastructure
	// address (a probe answer the steering would have passed).
	r.ports[UplinkPort].Inject(vxlanFrame(t, net.HardwareAddr{2, 0, 0, 0, 9, 9}, "x"))
	r.ports[1].Inject(gpkt.Serialize(t, tcpLayers(uplinkMAC, net.HardwareAddr{2, 0, 0, 0, 4, 1},
		netip.MustParseAddrPort("198.18.4.1:8080"), netip.MustParseAddrPort("198.18.1.2:5000"), true, true, "")...))
	r.w.Poll()
	for _, p := range r.ports {
		require.Empty(t, p.Transmitted())
	}
	var s engine.Stats
	r.w.Counters().Snapshot(&s)
	assert.Equal(t, map[string]uint64{"unknown_local": 1, "nat_infra": 1}, s.DropsByName())
}

func TestPipelinesNoAllocs(t *testing.T) {
	r := newPipeRig(t, false)
	in := vxlanFrame(t, net.HardwareAddr{2, 0, 0, 0, 4, 1}, "GET /")
	reply := gpkt.Serialize(t, tcpLayers(uplinkMAC, net.HardwareAddr{2, 0, 0, 0, 4, 1},
		netip.MustParseAddrPort("198.18.4.1:8080"), pipeClient, false, true, "200 OK")...)
	batch := func(f []byte) [][]byte {
		fs := make([][]byte, engine.MaxBatch)
		for i := range fs {
			fs[i] = f
		}
		return fs
	}
	r.ports[UplinkPort].Replay(batch(in))
	r.ports[1].Replay(batch(reply))
	r.w.Poll() // warm up: state, caches
	allocs := testing.AllocsPerRun(100, func() { r.w.Poll() })
	assert.Zero(t, allocs, "allocations per Poll (a batch in each direction)")
	var s engine.Stats
	r.w.Counters().Snapshot(&s)
	assert.Zero(t, s.Dropped(), "drops: %v", s.DropsByName())
	assert.Positive(t, s.TX)
	assert.Equal(t, s.RX, s.TX)
}

// TestPipelinesGuard: the Host Agent drops a request from a spoofed client
// (a VIP, a martian) and VXLAN from anyone but the Muxes (mux_prefixes),
// each with its reason; it drops a reply to a VIP, and routes replies: a
// TTL of 1 is dropped, one of 2 leaves with 1. The VIPs are its own and
// those its document lists by address only (vip_addresses: a fleet
// view's VIPs are the host's, the fleet's other VIPs are addresses).
func TestPipelinesGuard(t *testing.T) {
	otherVIP := netip.MustParseAddrPort("198.18.77.7:80")
	macA := net.HardwareAddr{2, 0, 0, 0, 4, 1}
	dipA := netip.MustParseAddrPort("198.18.4.1:8080")
	clientMAC := net.HardwareAddr{2, 0, 0, 0, 0xee, 1}
	inner := func(src netip.AddrPort) []byte {
		return gpkt.Serialize(t, tcpLayers(macA, clientMAC, src, pipeVIP, true, false, "")...)
	}
	reply := func(dst netip.AddrPort, ttl uint8) []byte {
		ls := tcpLayers(uplinkMAC, macA, dipA, dst, true, true, "")
		ls[1].(*layers.IPv4).TTL = ttl
		return gpkt.Serialize(t, ls...)
	}
	fromClient := func(ip *layers.IPv4, _ *layers.VXLAN) { ip.SrcIP = pipeClient.Addr().AsSlice() }
	for _, tc := range []struct {
		name  string
		port  int
		frame []byte
		want  string // a drop reason, or "tx:<port>"
	}{
		{"a client through the Mux", UplinkPort, wrapVXLAN(t, inner(pipeClient), nil), "tx:1"},
		{"VIP to itself", UplinkPort, wrapVXLAN(t, inner(pipeVIP), nil), "src_vip"},
		{"another VIP to this one", UplinkPort, wrapVXLAN(t, inner(otherVIP), nil), "src_vip"},
		{"from loopback", UplinkPort, wrapVXLAN(t, inner(netip.MustParseAddrPort("127.0.0.1:1")), nil), "src_martian"},
		{"from this network", UplinkPort, wrapVXLAN(t, inner(netip.MustParseAddrPort("0.0.0.1:1")), nil), "src_martian"},
		{"VXLAN sent by a client", UplinkPort, wrapVXLAN(t, inner(pipeClient), fromClient), "bad_tunnel_source"},
		{"a reply", 1, reply(pipeClient, 64), "tx:0"},
		{"a reply with TTL 2", 1, reply(pipeClient, 2), "tx:0"},
		{"a reply with TTL 1", 1, reply(pipeClient, 1), "ttl_exceeded"},
		{"a reply to the VIP", 1, reply(pipeVIP, 64), "src_vip"},
		{"a reply to another VIP", 1, reply(otherVIP, 64), "src_vip"},
		{"a reply to broadcast", 1, reply(netip.MustParseAddrPort("255.255.255.255:1"), 64), "src_martian"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newPipeRigDoc(t, pipeDoc+"vip_addresses: ["+otherVIP.Addr().String()+"]\n", true)
			if tc.port != UplinkPort {
				// The client's SYN first: the reply is a DSR reply.
				r.ports[UplinkPort].Inject(wrapVXLAN(t, inner(pipeClient), nil))
				r.w.Poll()
				require.Len(t, r.ports[1].Transmitted(), 1)
			}
			var before engine.Stats
			r.w.Counters().Snapshot(&before)
			r.ports[tc.port].Inject(tc.frame)
			r.w.Poll()
			var st engine.Stats
			r.w.Counters().Snapshot(&st)
			got := ""
			was := before.DropsByName()
			for name, n := range st.DropsByName() {
				if n > was[name] {
					require.Empty(t, got, "two drops")
					got = name
				}
			}
			for i, p := range r.ports {
				if out := p.Transmitted(); len(out) > 0 {
					require.Empty(t, got)
					got = fmt.Sprintf("tx:%d", i)
					if i != 1 {
						ip := gopacket.NewPacket(out[0], layers.LayerTypeEthernet, gopacket.Default).Layer(layers.LayerTypeIPv4).(*layers.IPv4)
						require.Equal(t, tc.frame[14+8]-1, ip.TTL, "the reply's TTL, one less")
					}
				}
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// TestNoTunnelSources: without mux_prefixes and without
// Config.TunnelSources the agent refuses the document, saying what to add;
// Config.TunnelSources alone is enough and overrides mux_prefixes.
func TestNoTunnelSources(t *testing.T) {
	noMux := strings.Replace(pipeDoc, "mux_prefixes: [198.18.1.2/32]\n", "", 1)
	require.NotEqual(t, pipeDoc, noMux)
	doc, err := control.Parse([]byte(noMux))
	require.NoError(t, err)
	a, err := New(Config{Uplink: "up", ConfigPath: "unused", Host: "host-1", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	err = a.apply(doc)
	require.ErrorIs(t, err, ErrNoTunnelSources)
	require.ErrorContains(t, err, "mux_prefixes: [")
	require.ErrorContains(t, err, "-tunnel-sources")

	flag := []netip.Prefix{netip.MustParsePrefix("198.18.9.0/24")}
	a, err = New(Config{Uplink: "up", ConfigPath: "unused", Host: "host-1", Logger: slog.New(slog.DiscardHandler),
		TunnelSources: flag})
	require.NoError(t, err)
	require.NoError(t, a.apply(doc))
	require.Equal(t, flag, a.Plan().TunnelSources)
	doc, err = control.Parse([]byte(pipeDoc))
	require.NoError(t, err)
	a.cfg.TunnelSources = flag
	require.NoError(t, a.apply(doc2(t, doc)))
	require.Equal(t, flag, a.Plan().TunnelSources, "the flag overrides mux_prefixes")

	// Other tunnel sources are another data path structure (a rebuild).
	p1, err := NewPlan(doc, "host-1", nil)
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("198.18.1.2/32")}, p1.TunnelSources)
	p2 := *p1
	require.True(t, p1.SameStructure(&p2))
	p2.TunnelSources = flag
	require.False(t, p1.SameStructure(&p2))
}

// doc2 returns doc as version 2.
func doc2(t *testing.T, doc *control.Document) *control.Document {
	c := *doc
	c.Version = 2
	return &c
}
