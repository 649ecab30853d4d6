package balance_test

import (
	"net/netip"
	"slices"
	"testing"

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
	extClient6 = netip.MustParseAddr("2001:db8:1::56")
	extRouter6 = netip.MustParseAddr("2001:db8:1::fe")
)

// quotedReply6 is a reply a DIP sent through the VIP (DSR): vip6:443 →
// client:40000 over TCP, or vip6:53 → client:40001 over UDP, with exts
// between the fixed header and the transport header (or, for a non-first
// fragment, the fragment's data), and 1400 bytes of payload: more than
// an ICMPv6 error quotes.
func quotedReply6(t *testing.T, tcp, nonFirst bool, exts ...gpkt.Ext6) []byte {
	transport := layers.IPProtocolUDP
	if tcp {
		transport = layers.IPProtocolTCP
	}
	first, chain := gpkt.Chain6(transport, exts...)
	ip := &layers.IPv6{Version: 6, HopLimit: 60, NextHeader: first, SrcIP: vip6.AsSlice(), DstIP: extClient6.AsSlice()}
	ls := append([]gopacket.SerializableLayer{ip}, chain...)
	switch {
	case nonFirst:
	case tcp:
		ls = append(ls, &layers.TCP{SrcPort: 443, DstPort: 40000, ACK: true, Seq: 7, Window: 1000})
	default:
		ls = append(ls, &layers.UDP{SrcPort: 53, DstPort: 40001})
	}
	return gpkt.Serialize(t, append(ls, gopacket.Payload(make([]byte, 1400)))...)
}

// packetTooBig6 is the Packet Too Big a router sends the VIP about
// quoted, quoting as much of it as fits in 1280 bytes (RFC 4443 2.4(c)).
func packetTooBig6(t *testing.T, quoted []byte) []byte {
	quoted = quoted[:min(len(quoted), 1280-header.IPv6Size-header.ICMPv6MinSize)]
	return gpkt.Serialize(t,
		&layers.Ethernet{SrcMAC: clientMAC, DstMAC: muxMAC, EthernetType: layers.EthernetTypeIPv6},
		&layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: extRouter6.AsSlice(), DstIP: vip6.AsSlice()},
		&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypePacketTooBig, 0)},
		gopacket.Payload(append([]byte{0, 0, 0x05, 0x00}, quoted...))) // MTU 1280
}

// TestICMPv6ErrorQuoteExtensionHeaders: an ICMPv6 error quoting a VIP
// reply with extension headers is keyed with the quoted flow, found
// behind them as the parser finds a packet's own transport header: the
// same key as for the quote without them, so the error goes to the flow's
// DIP. The ICMP stage used the first extension header's number as the
// protocol, without ports: such errors matched no flow and were dropped.
// A quote whose chain is cut short, too long or malformed names no flow,
// like a quote too short for its IP header (dropped as no_rule); so does
// a quoted non-first fragment, or a quote that ends before the ports, as
// for IPv4.
func TestICMPv6ErrorQuoteExtensionHeaders(t *testing.T) {
	h := newHarness(t, true,
		flow.Rule{Name: "web6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoTCP, Port: 443}, Backends: backends(8, 1)},
		flow.Rule{Name: "dns6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoUDP, Port: 53}, Backends: backends(8, 1)})
	icmp, err := balance.NewICMP(balance.ICMPConfig{Rules: h.rules})
	require.NoError(t, err)
	var key flow.Key // what the ICMP stage made of the last packet
	var flagged bool
	var dipName string // where the balancing stage sent it
	keyRec := engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			key, flagged = p.Key, p.Flags&engine.FlagICMPError != 0
		}
	})
	dipRec := engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			dipName = p.Rule.Backends[p.Backend].Name
		}
	})
	port, err := engine.NewMemPort(engine.MemPortConfig{})
	require.NoError(t, err)
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{port},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{}, icmp, keyRec, h.stage, dipRec)}}})
	require.NoError(t, err)
	// run returns the DIP the frame went to, or its drop reason.
	run := func(frame []byte) string {
		var before, after engine.Stats
		w.Counters().Snapshot(&before)
		dipName = ""
		port.Inject(frame)
		for w.Poll() > 0 {
		}
		w.Counters().Snapshot(&after)
		for r := range after.Drops {
			if after.Drops[r] != before.Drops[r] {
				return "drop:" + engine.DropReason(r).String()
			}
		}
		return dipName
	}

	// The flows the replies belong to, and the DIPs they went to.
	tcpFlow := flow.KeyFrom(0, flow.ProtoTCP, netip.AddrPortFrom(extClient6, 40000), netip.AddrPortFrom(vip6, 443))
	udpFlow := flow.KeyFrom(0, flow.ProtoUDP, netip.AddrPortFrom(extClient6, 40001), netip.AddrPortFrom(vip6, 53))
	dip := map[flow.Key]string{
		tcpFlow: run(pkt{src: extClient6, dst: vip6, sport: 40000, dport: 443, tcp: true, syn: true}.build()),
		udpFlow: run(pkt{src: extClient6, dst: vip6, sport: 40001, dport: 53}.build()),
	}
	require.NotContains(t, dip[tcpFlow], "drop:")
	require.NotContains(t, dip[udpFlow], "drop:")

	// The golden keys: what the errors quoting these replies without
	// extension headers are keyed with.
	plain := map[bool]flow.Key{}
	for _, tcp := range []bool{true, false} {
		require.Equal(t, dip[map[bool]flow.Key{true: tcpFlow, false: udpFlow}[tcp]],
			run(packetTooBig6(t, quotedReply6(t, tcp, false))))
		require.True(t, flagged)
		plain[tcp] = key
	}
	require.Equal(t, tcpFlow, plain[true])
	require.Equal(t, udpFlow, plain[false])

	nine := slices.Repeat([]gpkt.Ext6{gpkt.DestOpts6}, header.IPv6MaxExtensionHeaders+1)
	for _, tc := range []struct {
		name     string
		tcp      bool
		nonFirst bool
		exts     []gpkt.Ext6
		cut      bool // the quote ends past bytes after the chain (before it if negative), not where 1280 bytes end
		past     int
		follows  bool // keyed as the quote without extension headers, to the flow's DIP; else dropped as no_rule
	}{
		{"destination options, first fragment", true, false, []gpkt.Ext6{gpkt.DestOpts6, gpkt.Fragment6(0, true)}, false, 0, true},
		{"hop-by-hop, routing, destination options", true, false, []gpkt.Ext6{gpkt.HopByHop6, gpkt.Routing6(0), gpkt.DestOpts6}, false, 0, true},
		{"atomic fragment", true, false, []gpkt.Ext6{gpkt.Fragment6(0, false)}, false, 0, true},
		{"UDP behind destination options, first fragment", false, false, []gpkt.Ext6{gpkt.DestOpts6, gpkt.Fragment6(0, true)}, false, 0, true},
		{"eight headers", true, false, slices.Repeat([]gpkt.Ext6{gpkt.DestOpts6}, header.IPv6MaxExtensionHeaders), false, 0, true},
		{"quote ends after the ports", true, false, []gpkt.Ext6{gpkt.DestOpts6, gpkt.Fragment6(0, true)}, true, 4, true},
		{"quote ends inside the ports", true, false, []gpkt.Ext6{gpkt.DestOpts6, gpkt.Fragment6(0, true)}, true, 3, false},
		{"quote ends with the chain", true, false, []gpkt.Ext6{gpkt.DestOpts6, gpkt.Fragment6(0, true)}, true, 0, false},
		{"quote ends inside the chain", true, false, []gpkt.Ext6{gpkt.DestOpts6, gpkt.Fragment6(0, true)}, true, -4, false},
		{"nine headers", true, false, nine, false, 0, false},
		{"hop-by-hop not first", true, false, []gpkt.Ext6{gpkt.DestOpts6, gpkt.HopByHop6}, false, 0, false},
		{"two fragment headers", true, false, []gpkt.Ext6{gpkt.Fragment6(0, true), gpkt.Fragment6(0, true)}, false, 0, false},
		{"non-first fragment", true, true, []gpkt.Ext6{gpkt.DestOpts6, gpkt.Fragment6(185, true)}, false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := quotedReply6(t, tc.tcp, tc.nonFirst, tc.exts...)
			if tc.cut {
				q = q[:header.IPv6Size+gpkt.ChainLen6(tc.exts...)+tc.past]
			}
			got := run(packetTooBig6(t, q))
			if tc.follows {
				require.True(t, flagged, "keyed as an error about a flow")
				require.Equal(t, plain[tc.tcp], key, "the key of the quote without extension headers")
				require.Equal(t, dip[plain[tc.tcp]], got, "to the flow's DIP")
				return
			}
			require.False(t, flagged, "names no flow: key %v", key)
			require.Equal(t, "drop:"+engine.DropNoRule.String(), got, "dropped, counted as no_rule")
		})
	}
}

// Keying an error behind a quote's extension headers allocates nothing.
func TestICMPv6ErrorQuoteExtensionHeadersNoAllocs(t *testing.T) {
	h := newHarness(t, true, flow.Rule{Name: "web6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoTCP, Port: 443}, Backends: backends(8, 1)})
	icmp, err := balance.NewICMP(balance.ICMPConfig{Rules: h.rules})
	require.NoError(t, err)
	forwarded := 0
	count := engine.StageFunc(func(b *engine.Batch) { forwarded += b.Len() })
	port, err := engine.NewMemPort(engine.MemPortConfig{})
	require.NoError(t, err)
	frame := packetTooBig6(t, quotedReply6(t, true, false, gpkt.HopByHop6, gpkt.Routing6(0), gpkt.DestOpts6, gpkt.Fragment6(0, true)))
	port.Replay(slices.Repeat([][]byte{frame}, engine.MaxBatch))
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{port},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{}, icmp, h.stage, count)}}})
	require.NoError(t, err)
	w.Poll()
	require.Zero(t, testing.AllocsPerRun(100, func() { w.Poll() }))
	require.Equal(t, 102*engine.MaxBatch, forwarded, "every error keyed and placed")
}
