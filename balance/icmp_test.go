package balance_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

var (
	clientMAC = net.HardwareAddr{2, 0, 0, 0, 0, 1}
	muxMAC    = net.HardwareAddr{2, 0, 0, 0, 0, 2}
)

func echoRequest(t *testing.T, src, dst netip.Addr) []byte {
	eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: muxMAC}
	payload := gopacket.Payload("are you there")
	if src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip := &layers.IPv4{Version: 4, TTL: 17, Protocol: layers.IPProtocolICMPv4, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 77, Seq: 3}
		return gpkt.Serialize(t, eth, ip, icmp, payload)
	}
	eth.EthernetType = layers.EthernetTypeIPv6
	ip := &layers.IPv6{Version: 6, HopLimit: 17, NextHeader: layers.IPProtocolICMPv6, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)}
	_ = icmp.SetNetworkLayerForChecksum(ip)
	echo := &layers.ICMPv6Echo{Identifier: 77, SeqNumber: 3}
	return gpkt.Serialize(t, eth, ip, icmp, echo, payload)
}

// icmpHarness runs parse → ICMP → balance → a recorder over a MemPort.
type icmpHarness struct {
	port *engine.MemPort
	w    *engine.Worker
	seen []string // backend names the balancing stage chose, per packet
	now  time.Time
}

func newICMPHarness(t *testing.T, h *harness, rate float64) *icmpHarness {
	ih := &icmpHarness{now: time.Unix(1000, 0)}
	icmp, err := balance.NewICMP(balance.ICMPConfig{Rules: h.rules, EchoRate: rate, EchoBurst: rate,
		Now: func() time.Time { return ih.now }})
	require.NoError(t, err)
	rec := engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			ih.seen = append(ih.seen, p.Rule.Backends[p.Backend].Name)
		}
	})
	ih.port, err = engine.NewMemPort(engine.MemPortConfig{Capture: true})
	require.NoError(t, err)
	ih.w, err = engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{ih.port},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{}, icmp, h.stage, rec)}}})
	require.NoError(t, err)
	return ih
}

func (ih *icmpHarness) run(frames ...[]byte) [][]byte {
	ih.port.Inject(frames...)
	for ih.w.Poll() > 0 {
	}
	return ih.port.Transmitted()
}

func TestICMPEchoReply(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src, vip netip.Addr
	}{
		{"v4", netip.MustParseAddr("198.18.0.7"), vip4},
		{"v6", netip.MustParseAddr("2001:db8::7"), vip6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, true,
				flow.Rule{Name: "web", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(2, 1)},
				flow.Rule{Name: "web6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoTCP, Port: 443}, Backends: backends(2, 1)})
			ih := newICMPHarness(t, h, 2)
			req := echoRequest(t, tc.src, tc.vip)
			out := ih.run(req)
			require.Len(t, out, 1)
			require.Empty(t, ih.seen, "the reply skips the balancing stage")

			pkt := gopacket.NewPacket(out[0], layers.LayerTypeEthernet, gopacket.Default)
			require.Nil(t, pkt.ErrorLayer())
			eth := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
			require.Equal(t, clientMAC, eth.DstMAC)
			require.Equal(t, muxMAC, eth.SrcMAC)
			// Reserialise with computed checksums: ours must match.
			if tc.src.Is4() {
				ip := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
				require.Equal(t, tc.vip.AsSlice(), []byte(ip.SrcIP.To4()))
				require.Equal(t, tc.src.AsSlice(), []byte(ip.DstIP.To4()))
				require.EqualValues(t, 64, ip.TTL)
				icmp := pkt.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
				require.EqualValues(t, layers.ICMPv4TypeEchoReply, icmp.TypeCode.Type())
				require.EqualValues(t, 77, icmp.Id)
				want := gpkt.Serialize(t, eth, ip, icmp, gopacket.Payload(icmp.Payload))
				require.Equal(t, want, out[0], "checksums as gopacket computes them")
			} else {
				ip := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
				require.Equal(t, tc.vip.AsSlice(), []byte(ip.SrcIP))
				require.EqualValues(t, 64, ip.HopLimit)
				icmp := pkt.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
				require.EqualValues(t, layers.ICMPv6TypeEchoReply, icmp.TypeCode.Type())
				_ = icmp.SetNetworkLayerForChecksum(ip)
				want := gpkt.Serialize(t, eth, ip, icmp, gopacket.Payload(icmp.Payload))
				require.Equal(t, want, out[0], "checksums as gopacket computes them")
			}

			// Rate limit: a burst of 2 per second; the third in the same
			// instant is dropped, and a second later there is room again.
			require.Len(t, ih.run(req, req), 1)
			var s engine.Stats
			ih.w.Counters().Snapshot(&s)
			require.EqualValues(t, 1, s.Drops[balance.DropICMPRate])
			ih.now = ih.now.Add(time.Second)
			require.Len(t, ih.run(req), 1)

			// An echo request to an address that is not a VIP is not answered.
			require.Empty(t, ih.run(echoRequest(t, tc.src, tc.src)))
		})
	}
}

// TestICMPEchoRefused: echo requests to a VIP that a host would not answer
// are dropped (icmp_echo_invalid) — a wrong IPv4 header or ICMP checksum,
// a fragment — and ICMP of the other family's protocol number is not
// taken for an echo request at all.
func TestICMPEchoRefused(t *testing.T) {
	client4, client6 := netip.MustParseAddr("198.18.0.7"), netip.MustParseAddr("2001:db8::7")
	corrupt := func(f []byte, off int) []byte { f[off] ^= 0x40; return f }
	l4Off := func(f []byte) int { // Ethernet + IPv4 without options, or IPv6
		if f[12] == 0x86 {
			return 14 + 40
		}
		return 14 + 20
	}
	for _, tc := range []struct {
		name    string
		frame   func() []byte
		refused bool // dropped as icmp_echo_invalid; else not answered and not refused either
	}{
		{"v4 wrong ICMP checksum", func() []byte {
			f := echoRequest(t, client4, vip4)
			return corrupt(f, l4Off(f)+2)
		}, true},
		{"v4 wrong IPv4 header checksum", func() []byte { return corrupt(echoRequest(t, client4, vip4), 14+10) }, true},
		{"v6 wrong ICMPv6 checksum", func() []byte {
			f := echoRequest(t, client6, vip6)
			return corrupt(f, l4Off(f)+2)
		}, true},
		{"v4 first fragment", func() []byte {
			f := gpkt.Serialize(t, &layers.Ethernet{SrcMAC: clientMAC, DstMAC: muxMAC, EthernetType: layers.EthernetTypeIPv4},
				&layers.IPv4{Version: 4, TTL: 17, Protocol: layers.IPProtocolICMPv4, Flags: layers.IPv4MoreFragments,
					SrcIP: client4.AsSlice(), DstIP: vip4.AsSlice()},
				&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 1},
				gopacket.Payload(make([]byte, 64)))
			return f
		}, true},
		// RFC 1122 3.3.6: a unicast datagram received as a link-layer
		// broadcast is discarded; the reply would leave with the group
		// address as its Ethernet source.
		{"v4 sent as a link-layer broadcast", func() []byte {
			f := echoRequest(t, client4, vip4)
			copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
			return f
		}, true},
		{"v6 sent as a link-layer multicast", func() []byte {
			f := echoRequest(t, client6, vip6)
			copy(f[0:6], []byte{0x33, 0x33, 0, 0, 0, 1})
			return f
		}, true},
		{"IPv4 protocol 58 (ICMPv6) with an ICMPv4 echo request", func() []byte {
			f := echoRequest(t, client4, vip4)
			f[14+9] = 58
			binary.BigEndian.PutUint16(f[14+10:], header.IPv4(f[14:]).CalculateChecksum()) // right again
			return f
		}, false},
		{"IPv6 next header 1 (ICMPv4) with an ICMPv6 echo request", func() []byte {
			f := echoRequest(t, client6, vip6)
			f[14+6] = 1
			return f
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, true,
				flow.Rule{Name: "web", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(2, 1)},
				flow.Rule{Name: "web6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoTCP, Port: 443}, Backends: backends(2, 1)})
			ih := newICMPHarness(t, h, 100)
			require.Empty(t, ih.run(tc.frame()), "not answered")
			var s engine.Stats
			ih.w.Counters().Snapshot(&s)
			require.EqualValues(t, 1, s.Dropped(), "drops: %v", s.DropsByName())
			if tc.refused {
				require.EqualValues(t, 1, s.Drops[balance.DropICMPEchoInvalid], "drops: %v", s.DropsByName())
			} else {
				require.Zero(t, s.Drops[balance.DropICMPEchoInvalid], "drops: %v", s.DropsByName())
			}
			// The same request, well formed, is answered.
			require.Len(t, ih.run(echoRequest(t, client4, vip4)), 1)
		})
	}
}

// TestICMPErrorQuoteWithinDatagram: an ICMP error whose quote holds only
// an IP header names no ports; bytes past the IP datagram (Ethernet
// padding) are not read as the quoted ports, so the error matches no
// port-80 flow and is not forwarded.
func TestICMPErrorQuoteWithinDatagram(t *testing.T) {
	h := newHarness(t, true, flow.Rule{Name: "web", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(8, 1)})
	ih := newICMPHarness(t, h, 100)
	client := netip.MustParseAddr("198.18.0.9")
	qip := &layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolTCP, SrcIP: vip4.AsSlice(), DstIP: client.AsSlice()}
	qtcp := &layers.TCP{SrcPort: 80, DstPort: 40000, ACK: true}
	_ = qtcp.SetNetworkLayerForChecksum(qip)
	quoted := gpkt.Serialize(t, qip, qtcp)
	f := gpkt.Serialize(t,
		&layers.Ethernet{SrcMAC: clientMAC, DstMAC: muxMAC, EthernetType: layers.EthernetTypeIPv4},
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: netip.MustParseAddr("198.18.0.254").AsSlice(), DstIP: vip4.AsSlice()},
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeFragmentationNeeded), Seq: 1400},
		gopacket.Payload(quoted[:20]))
	f = append(append([]byte(nil), f...), 0x00, 0x50, 0x9c, 0x40) // "ports" 80 → 40000 past the datagram
	ih.run(f)
	require.Empty(t, ih.seen, "not forwarded to a backend")
	var s engine.Stats
	ih.w.Counters().Snapshot(&s)
	require.EqualValues(t, 1, s.Drops[engine.DropNoRule], "drops: %v", s.DropsByName())
}

// TestICMPErrorFollowsFlow: a "fragmentation needed" about a reply of a VIP
// flow (VIP → client, quoted) goes to the DIP that serves the flow.
func TestICMPErrorFollowsFlow(t *testing.T) {
	h := newHarness(t, true, flow.Rule{Name: "web", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(8, 1)})
	ih := newICMPHarness(t, h, 100)
	router := netip.MustParseAddr("198.18.0.254")
	for i := 0; i < 50; i++ {
		client := netip.AddrFrom4([4]byte{198, 18, 0, byte(i + 1)})
		sport := uint16(30000 + i)
		ih.seen = nil
		ih.run(pkt{src: client, dst: vip4, sport: sport, dport: 80, tcp: true, syn: true}.build())
		require.Len(t, ih.seen, 1)
		chosen := ih.seen[0]

		// The reply the DIP sent (VIP:80 → client), as a router quotes it.
		qip := &layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolTCP, SrcIP: vip4.AsSlice(), DstIP: client.AsSlice(), Flags: layers.IPv4DontFragment}
		qtcp := &layers.TCP{SrcPort: 80, DstPort: layers.TCPPort(sport), ACK: true, Window: 100}
		_ = qtcp.SetNetworkLayerForChecksum(qip)
		quoted := gpkt.Serialize(t, qip, qtcp)
		fragNeeded := gpkt.Serialize(t,
			&layers.Ethernet{SrcMAC: clientMAC, DstMAC: muxMAC, EthernetType: layers.EthernetTypeIPv4},
			&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: router.AsSlice(), DstIP: vip4.AsSlice()},
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeFragmentationNeeded), Seq: 1400},
			gopacket.Payload(quoted[:28]))
		ih.seen = nil
		ih.run(fragNeeded)
		require.Equal(t, []string{chosen}, ih.seen, "flow %d: the error goes to the flow's DIP", i)
	}
	// Errors create no connection-table entries of their own.
	require.Equal(t, 50, h.conns.Len())
}

// TestICMPErrorKeepsNoFlowAlive: an ICMP error about a flow goes where
// the flow goes but does not refresh its entry, so a third party who
// knows a flow's addresses and ports cannot keep its entry alive by
// sending errors that quote it: the flow expires on its own timeout.
func TestICMPErrorKeepsNoFlowAlive(t *testing.T) {
	h := newHarness(t, true, flow.Rule{Name: "web", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(8, 1)})
	ih := newICMPHarness(t, h, 100)
	client := netip.MustParseAddr("198.18.0.7")
	router := netip.MustParseAddr("198.18.0.254")
	p := pkt{src: client, dst: vip4, sport: 40000, dport: 80, tcp: true, syn: true}
	ih.run(p.build())
	h.now += h.conns.ProveAfter()
	p.syn, p.ack = false, true
	ih.run(p.build()) // proven: the established class's timeout
	key := flow.KeyFrom(0, flow.ProtoTCP, netip.AddrPortFrom(client, 40000), netip.AddrPortFrom(vip4, 80))
	_, class, ok := h.conns.Lookup(&key, h.now)
	require.True(t, ok)
	require.Equal(t, flow.ClassEstablished, class)

	qip := &layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolTCP, SrcIP: vip4.AsSlice(), DstIP: client.AsSlice()}
	qtcp := &layers.TCP{SrcPort: 80, DstPort: 40000, ACK: true, Window: 100}
	_ = qtcp.SetNetworkLayerForChecksum(qip)
	quoted := gpkt.Serialize(t, qip, qtcp)
	unreachable := gpkt.Serialize(t,
		&layers.Ethernet{SrcMAC: clientMAC, DstMAC: muxMAC, EthernetType: layers.EthernetTypeIPv4},
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: router.AsSlice(), DstIP: vip4.AsSlice()},
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeHost)},
		gopacket.Payload(quoted[:28]))
	timeout := flow.Ticks(h.conns.Config().Timeouts.Established)
	step := timeout / 8
	for elapsed := flow.Tick(0); elapsed <= timeout; elapsed += step {
		h.now += step
		ih.seen = nil
		ih.run(unreachable)
		require.Len(t, ih.seen, 1, "the error is forwarded")
		var q flow.ConnQuery
		h.conns.Prepare(&q, &key)
		if _, _, ok := h.conns.PeekPrepared(&q, h.now); !ok { // a look that refreshes nothing
			return // expired on its own timeout
		}
	}
	t.Fatalf("errors quoting the flow kept its entry alive past its %v timeout", h.conns.Config().Timeouts.Established)
}

func TestEmitSkipsLaterStages(t *testing.T) {
	port, err := engine.NewMemPort(engine.MemPortConfig{Capture: true})
	require.NoError(t, err)
	later := 0
	emitFirst := engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			if p.Data()[0] == 1 {
				b.Emit(p)
			}
		}
	})
	count := engine.StageFunc(func(b *engine.Batch) { later += b.Len() })
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{port},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(emitFirst, count)}}})
	require.NoError(t, err)
	port.Inject([]byte{1, 1}, []byte{2, 2}, []byte{1, 3})
	w.Poll()
	require.Equal(t, 1, later)
	require.Len(t, port.Transmitted(), 3)
}
