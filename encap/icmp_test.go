package encap_test

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// wantICMP builds with gopacket the error Encap must turn orig (an
// oversized client frame) into: from the VIP to the client, MACs swapped,
// VLAN tag kept, quoting the IP packet up to the limit.
func wantICMP(orig pkt, mtu uint32) []byte {
	frame := orig.build()
	l3 := 14
	if orig.vlan != 0 {
		l3 = 18
	}
	eth := &layers.Ethernet{SrcMAC: hw(muxMAC), DstMAC: hw(routerMAC)}
	ls := []gopacket.SerializableLayer{eth}
	et := layers.EthernetTypeIPv4
	if orig.src.Is6() {
		et = layers.EthernetTypeIPv6
	}
	if orig.vlan != 0 {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: orig.vlan, Type: et})
	} else {
		eth.EthernetType = et
	}
	if orig.src.Is4() {
		q := frame[l3:][:576-28]
		ip := &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolICMPv4, SrcIP: orig.dst.AsSlice(), DstIP: orig.src.AsSlice()}
		ic := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 4), Seq: uint16(mtu)}
		return gpkt.MustSerialize(append(ls, ip, ic, gopacket.Payload(q))...)
	}
	q := frame[l3:][:1280-48]
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: orig.dst.AsSlice(), DstIP: orig.src.AsSlice()}
	ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(2, 0)}
	_ = ic.SetNetworkLayerForChecksum(ip)
	body := binary.BigEndian.AppendUint32(nil, mtu)
	return gpkt.MustSerialize(append(ls, ip, ic, gopacket.Payload(append(body, q...)))...)
}

func TestICMPTooBigGolden(t *testing.T) {
	big4, big6 := v4pkt(), v6pkt()
	big4.size, big6.size = 1450, 1450
	tagged4, tagged6 := big4, big6
	tagged4.vlan, tagged6.vlan = 7, 7
	tcp6 := big6
	tcp6.proto = layers.IPProtocolTCP
	cases := []struct {
		name string
		orig pkt
		host netip.Addr
		mtu  uint32 // announced
	}{
		{"v4 over v4", big4, host4, 1400 - 50},
		{"v4 over v6", big4, host6, 1400 - 70},
		{"v6 over v4", big6, host4, 1400 - 50},
		{"v6 over v6", big6, host6, 1400 - 70},
		{"v6 tcp over v6", tcp6, host6, 1400 - 70},
		{"v4 tagged", tagged4, host4, 1350},
		{"v6 tagged", tagged6, host6, 1330},
	}
	r := newRig(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEncap(t, encap.EncapConfig{MTU: 1400})
			ps := r.load(0, tc.orig.build())
			balanced(ps, ruleFor(tc.orig.dst, tc.host), 0)
			r.run(e)
			p := ps[0]
			require.Equal(t, engine.VerdictEmit, p.Verdict, "reason %v", p.Reason)
			require.Equal(t, []*engine.Packet{p}, r.b.Emitted())
			assert.Zero(t, r.b.Len())
			assert.Equal(t, p.InPort, p.OutPort)
			assert.Nil(t, p.Rule)
			assert.Equal(t, encap.EncapStats{ICMPSent: 1}, e.Stats())

			got := data(p)
			require.Equal(t, wantICMP(tc.orig, tc.mtu), got, "ICMP error differs from gopacket's")

			// Independent checks of what gopacket decodes.
			pk := gopacket.NewPacket(got, layers.LayerTypeEthernet, gopacket.Default)
			l3 := 14
			if tc.orig.vlan != 0 {
				l3 = 18
				assert.Equal(t, tc.orig.vlan, pk.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q).VLANIdentifier)
			}
			var quote []byte
			if tc.orig.src.Is4() {
				ip := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
				assert.Equal(t, vip4.AsSlice(), []byte(ip.SrcIP.To4()))
				assert.Equal(t, client4.AsSlice(), []byte(ip.DstIP.To4()))
				assert.Equal(t, 576, int(ip.Length), "RFC 1812: at most 576 bytes")
				assert.Equal(t, uint16(0xffff), gpkt.Sum(got[l3:l3+20], 0), "IP header checksum")
				ic := pk.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
				assert.Equal(t, layers.CreateICMPv4TypeCode(3, 4), ic.TypeCode)
				assert.Equal(t, uint16(tc.mtu), ic.Seq, "next-hop MTU")
				assert.Equal(t, uint16(0xffff), gpkt.Sum(got[l3+20:], 0), "ICMP checksum")
				quote = ic.Payload
			} else {
				ip := pk.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
				assert.Equal(t, vip6.AsSlice(), []byte(ip.SrcIP))
				assert.Equal(t, client6.AsSlice(), []byte(ip.DstIP))
				assert.Equal(t, 1280, 40+int(ip.Length), "RFC 4443: at most 1280 bytes")
				ic := pk.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
				assert.Equal(t, layers.CreateICMPv6TypeCode(2, 0), ic.TypeCode)
				assert.Equal(t, tc.mtu, binary.BigEndian.Uint32(ic.Payload))
				seg := got[l3+40:]
				assert.Equal(t, uint16(0xffff), gpkt.Sum(seg, pseudo(got[l3+8:l3+24], got[l3+24:l3+40], 58, len(seg))), "ICMPv6 checksum")
				quote = ic.Payload[4:]
			}
			// The quote starts with the original IP header.
			var inner gopacket.Packet
			if tc.orig.src.Is4() {
				inner = gopacket.NewPacket(quote, layers.LayerTypeIPv4, gopacket.Default)
				qip := inner.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
				assert.Equal(t, client4.AsSlice(), []byte(qip.SrcIP.To4()))
				assert.Equal(t, 20+8+1450, int(qip.Length))
			} else {
				inner = gopacket.NewPacket(quote, layers.LayerTypeIPv6, gopacket.Default)
				qip := inner.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
				assert.Equal(t, client6.AsSlice(), []byte(qip.SrcIP))
				assert.Equal(t, vip6.AsSlice(), []byte(qip.DstIP))
			}

			// The metadata describes the new frame: every field the
			// parser sets is what parsing the error sets (TCPFlags 0:
			// the error is not TCP, whatever the packet it quotes was).
			var k = p.Key
			flags, l3Off, l4Off, proto, tcpFlags := p.Flags, p.L3Off, p.L4Off, p.L4Proto, p.TCPFlags
			require.Zero(t, engine.ParsePacket(p, 0))
			assert.Equal(t, k, p.Key)
			assert.Equal(t, p.Flags, flags, "Flags")
			assert.Equal(t, p.L3Off, l3Off, "L3Off")
			assert.Equal(t, p.L4Off, l4Off, "L4Off")
			assert.Equal(t, p.L4Proto, proto, "L4Proto")
			assert.Equal(t, p.TCPFlags, tcpFlags, "TCPFlags")
			assert.Equal(t, tc.orig.dst, p.Key.SrcAddr())
		})
	}
}

func TestICMPNoReply(t *testing.T) {
	big := func(p pkt) pkt { p.size = 1450; return p }
	noDF := big(v4pkt())
	noDF.df = false
	icmpErr := big(v4pkt())
	icmpErr.proto, icmpErr.icmpType = layers.IPProtocolICMPv4, 3
	echo := icmpErr
	echo.icmpType = 8
	zeroSrc := big(v4pkt())
	zeroSrc.src = netip.MustParseAddr("0.0.0.0")
	mcastSrc := big(v4pkt())
	mcastSrc.src = netip.MustParseAddr("224.0.0.1")
	icmp6Err := big(v6pkt())
	icmp6Err.proto, icmp6Err.icmpType = layers.IPProtocolICMPv6, 1
	echo6 := icmp6Err
	echo6.icmpType = 128
	mcast6 := big(v6pkt())
	mcast6.src = netip.MustParseAddr("ff02::1")

	cases := []struct {
		name  string
		p     pkt
		rate  int
		reply bool
	}{
		{"IPv4 without DF", noDF, 0, false},
		{"ICMP error", icmpErr, 0, false},
		{"ICMP echo", echo, 0, true},
		{"source 0.0.0.0", zeroSrc, 0, false},
		{"multicast source", mcastSrc, 0, false},
		{"ICMPv6 error", icmp6Err, 0, false},
		{"ICMPv6 echo", echo6, 0, true},
		{"IPv6 multicast source", mcast6, 0, false},
		{"ICMP disabled", big(v4pkt()), -1, false},
		{"ICMP disabled v6", big(v6pkt()), -1, false},
	}
	r := newRig(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEncap(t, encap.EncapConfig{MTU: 1400, ICMPRate: tc.rate})
			ps := r.load(0, tc.p.build())
			balanced(ps, ruleFor(tc.p.dst, host4), 0)
			r.run(e)
			if tc.reply {
				assert.Equal(t, engine.VerdictEmit, ps[0].Verdict)
				assert.Equal(t, encap.EncapStats{ICMPSent: 1}, e.Stats())
				return
			}
			assert.Equal(t, "mtu_exceeded", reason(ps[0]))
			assert.Equal(t, encap.EncapStats{NoReply: 1}, e.Stats())
		})
	}

	// RFC 1122 3.2.2: no ICMP error about a datagram sent as a link-layer
	// broadcast (or multicast); the reply would also leave with that group
	// address as its Ethernet source. IPv6 likewise: the Packet Too Big
	// would carry a group source MAC, which no receiver accepts.
	for _, g := range []struct {
		name string
		p    pkt
		mac  header.MAC
	}{
		{"IPv4 link-layer broadcast", big(v4pkt()), header.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{"IPv4 link-layer multicast", big(v4pkt()), header.MAC{0x01, 0x00, 0x5e, 0, 0, 1}},
		{"IPv6 link-layer multicast", big(v6pkt()), header.MAC{0x33, 0x33, 0, 0, 0, 1}},
	} {
		t.Run(g.name, func(t *testing.T) {
			e := newEncap(t, encap.EncapConfig{MTU: 1400})
			ps := r.load(0, withDst(g.p.build(), g.mac, nil))
			balanced(ps, ruleFor(g.p.dst, host4), 0)
			r.run(e)
			assert.Equal(t, "mtu_exceeded", reason(ps[0]))
			assert.Equal(t, encap.EncapStats{NoReply: 1}, e.Stats())
		})
	}

	t.Run("no headroom for the reply", func(t *testing.T) {
		e := newEncap(t, encap.EncapConfig{MTU: 1400})
		ps := r.loadAt(20, 0, big(v4pkt()).build())
		balanced(ps, ruleFor(vip4, host4), 0)
		r.run(e)
		assert.Equal(t, "mtu_exceeded", reason(ps[0]))
		assert.Equal(t, encap.EncapStats{NoReply: 1}, e.Stats())
	})
}

// TestICMPRateLimit drives the token bucket with an injected clock: a
// burst of replies, then drops without reply until time passes.
func TestICMPRateLimit(t *testing.T) {
	now := int64(12345) * int64(time.Hour) // any origin
	e := newEncap(t, encap.EncapConfig{MTU: 1400, ICMPRate: 10, ICMPBurst: 3, Clock: func() int64 { return now }})
	big := v4pkt()
	big.size = 1450
	r := newRig(t)
	send := func(n int) (replies, drops int) {
		frames := make([][]byte, n)
		for i := range frames {
			frames[i] = big.build()
		}
		ps := r.load(0, frames...)
		balanced(ps, ruleFor(vip4, host4), 0)
		r.run(e)
		for _, p := range ps {
			switch {
			case p.Verdict == engine.VerdictEmit:
				replies++
			case reason(p) == "mtu_exceeded":
				drops++
			default:
				t.Fatalf("unexpected verdict %v %v", p.Verdict, p.Reason)
			}
		}
		return replies, drops
	}

	rep, drop := send(4)
	assert.Equal(t, 3, rep, "the burst")
	assert.Equal(t, 1, drop, "the N+1-th in the same window")
	rep, _ = send(1)
	assert.Equal(t, 0, rep, "no time passed")

	now += int64(100*time.Millisecond) - 1
	rep, _ = send(1)
	assert.Equal(t, 0, rep, "just before one interval (1/10 s)")
	now++
	rep, drop = send(2)
	assert.Equal(t, []int{1, 1}, []int{rep, drop}, "one token per interval")

	now += int64(time.Hour)
	rep, drop = send(5)
	assert.Equal(t, []int{3, 2}, []int{rep, drop}, "an idle bucket holds only the burst")

	assert.Equal(t, encap.EncapStats{ICMPSent: 7, ICMPRateLimited: 6}, e.Stats())
}

// TestICMPRateLimitShared: workers sharing one stage share one bucket.
func TestICMPRateLimitShared(t *testing.T) {
	e := newEncap(t, encap.EncapConfig{MTU: 1400, ICMPRate: 1, ICMPBurst: 5, Clock: func() int64 { return 0 }})
	big := v6pkt()
	big.size = 1450
	frame := big.build()
	done := make(chan int)
	for range 4 {
		go func() {
			r := newRig(t)
			n := 0
			for range 10 {
				ps := r.load(0, frame, frame)
				balanced(ps, &flow.Rule{VIP: flow.VIP{VNI: 1}, Backends: []flow.Backend{{}, {Host: host4}}}, 0)
				r.run(e)
				n += len(r.b.Emitted())
			}
			done <- n
		}()
	}
	total := 0
	for range 4 {
		total += <-done
	}
	assert.Equal(t, 5, total)
	s := e.Stats()
	assert.Equal(t, uint64(5), s.ICMPSent)
	assert.Equal(t, uint64(4*10*2-5), s.ICMPRateLimited)
}

// TestICMPThroughWorker: the error leaves on the port the packet came in
// on, counted as TX and not as a drop; later stages do not see it.
func TestICMPThroughWorker(t *testing.T) {
	rules := flow.NewRules()
	_, err := rules.Update(1, []flow.Rule{{Name: "r", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoUDP, Port: 80},
		Backends: []flow.Backend{{Name: "d", Addr: dip4, Host: host4, MAC: dipMAC, Weight: 1}}}})
	require.NoError(t, err)
	bal, err := balance.New(balance.Config{Rules: rules, Hasher: flow.NewHasher(1)})
	require.NoError(t, err)
	e := newEncap(t, encap.EncapConfig{MTU: 1400})
	seen := 0
	after := engine.StageFunc(func(b *engine.Batch) { seen += b.Len() })
	port, err := engine.NewMemPort(engine.MemPortConfig{Capture: true})
	require.NoError(t, err)
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{port},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{}, bal, e, after)}}})
	require.NoError(t, err)
	big := v4pkt()
	big.size = 1450
	noDF := big
	noDF.df = false
	port.Inject(big.build(), noDF.build(), v4pkt().build())
	w.Poll()

	var s engine.Stats
	w.Counters().Snapshot(&s)
	assert.Equal(t, uint64(2), s.TX)
	assert.Equal(t, map[string]uint64{"mtu_exceeded": 1}, s.DropsByName())
	assert.Equal(t, 1, seen, "only the encapsulated packet reaches the next stage")
	sent := port.Transmitted()
	require.Len(t, sent, 2)
	assert.Contains(t, sent, wantICMP(big, 1350))
	assert.Equal(t, encap.EncapStats{ICMPSent: 1, NoReply: 1}, e.Stats())
	assert.Equal(t, port.FreeFrames(), 4*engine.MaxBatch, "no frame leaked")
}
