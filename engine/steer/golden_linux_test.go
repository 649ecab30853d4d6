//go:build linux

package steer

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
)

type golden struct {
	name  string
	frame []byte
	want  outcome
}

// edit returns a copy of frame changed by f.
func edit(frame []byte, f func(b []byte)) []byte {
	b := append([]byte(nil), frame...)
	f(b)
	return b
}

func put16(off int, v uint16) func([]byte) {
	return func(b []byte) { binary.BigEndian.PutUint16(b[off:], v) }
}

// goldenFrames are the fixtures against goldenCfg: description, frame built
// with gopacket, expected outcome.
func goldenFrames(tb testing.TB) []golden {
	const l3 = 14 // IP header offset without a VLAN tag
	web4 := tcp(client4, vipPort4, 40000, 80).frame(tb)
	web6 := tcp(client6, vipPort6, 40000, 443).frame(tb)
	dns4 := udp(client4, vipUDP4, 40000, 53).frame(tb)
	lldp := edit(web4, put16(12, 0x88cc))
	qinq := edit(tcp(client4, vipPort4, 40000, 80).withVLAN().frame(tb), put16(12, 0x88a8))
	double := append(append(append([]byte(nil), qinq[:12]...), 0x81, 0x00, 0x00, 0x64), qinq[12:]...)
	double[16], double[17] = 0x81, 0x00 // 8100 8100 0800

	return []golden{
		// Mux uplink: destination rules.
		{"v4 tcp to vip:port", web4, outDst},
		{"v4 tcp to vip wrong port", tcp(client4, vipPort4, 40000, 81).frame(tb), outNoMatch},
		{"v4 udp to tcp-only vip", udp(client4, vipPort4, 40000, 80).frame(tb), outNoMatch},
		{"v4 tcp to other address", tcp(client4, client4, 40000, 80).frame(tb), outNoMatch},
		{"v4 wildcard vip tcp any port", tcp(client4, vipAny4, 40000, 12345).frame(tb), outDst},
		{"v4 wildcard vip udp", udp(client4, vipAny4, 40000, 53).frame(tb), outDst},
		{"v4 wildcard vip icmp", icmp(client4, vipAny4).frame(tb), outDst},
		{"v4 udp-any-port vip udp", dns4, outDst},
		{"v4 udp-any-port vip tcp", tcp(client4, vipUDP4, 40000, 53).frame(tb), outNoMatch},
		{"v4 udp-any-port vip icmp", icmp(client4, vipUDP4).frame(tb), outNoMatch},
		{"v4 options tcp to vip:port", pkt{src: client4, dst: vipPort4, proto: 6, sport: 1, dport: 80, ipOpts: 2}.frame(tb), outDst},
		{"v4 max options tcp wrong port", pkt{src: client4, dst: vipPort4, proto: 6, sport: 1, dport: 81, ipOpts: 10}.withVLAN().frame(tb), outNoMatch},
		{"v4 vlan tcp to vip:port", tcp(client4, vipPort4, 40000, 80).withVLAN().frame(tb), outDst},
		{"v4 vlan tcp wrong port", tcp(client4, vipPort4, 40000, 81).withVLAN().frame(tb), outNoMatch},
		{"v4 ethernet padding", append(append([]byte(nil), dns4...), make([]byte, 60-min(60, len(dns4)))...), outDst},
		{"v6 tcp to vip:port", web6, outDst},
		{"v6 tcp to vip wrong port", tcp(client6, vipPort6, 40000, 444).frame(tb), outNoMatch},
		{"v6 wildcard vip udp", udp(client6, vipAny6, 40000, 53).frame(tb), outDst},
		{"v6 wildcard vip icmpv6 echo", icmp(client6, vipAny6).frame(tb), outDst},
		{"v6 vlan tcp to vip:port", tcp(client6, vipPort6, 40000, 443).withVLAN().frame(tb), outDst},
		{"v6 hop-by-hop to vip:port", tcp(client6, vipPort6, 40000, 443).withExt(0).frame(tb), outDst},
		{"v6 hop-by-hop to vip wrong port", tcp(client6, vipPort6, 40000, 444).withExt(0).frame(tb), outNoMatch},
		{"v6 hop-by-hop to wildcard vip", tcp(client6, vipAny6, 40000, 443).withExt(0).frame(tb), outDst},
		{"v6 atomic fragment to vip:port", tcp(client6, vipPort6, 40000, 443).withExt(44).frame(tb), outDst},
		{"v6 fragment to wildcard vip", tcp(client6, vipAny6, 40000, 443).withExt(44).frame(tb), outDst},
		{"v6 long destination options to vip:port", pkt{src: client6, dst: vipPort6, proto: 6, sport: 1, dport: 443, extLen: 3}.withExt(60).frame(tb), outDst},
		{"v6 routing header to vip:port", tcp(client6, vipPort6, 40000, 443).withExt(43).frame(tb), outDst},
		{"v6 all walked headers udp to udp-any-port vip", udp(client6, vipUDP6, 40000, 53).withExt(0, 60, 43, 44, 60).frame(tb), outDst},
		{"v6 eight extension headers", udp(client6, vipUDP6, 40000, 53).withExt(0, 60, 60, 60, 60, 60, 60, 60).frame(tb), outDst},
		{"v6 udp to udp-any-port vip", udp(client6, vipUDP6, 40000, 53).frame(tb), outDst},
		{"v6 tcp to udp-any-port vip", tcp(client6, vipUDP6, 40000, 53).withExt(0).frame(tb), outNoMatch},
		{"v6 hop-by-hop icmpv6 echo to udp-any-port vip", icmp(client6, vipUDP6).withExt(0).frame(tb), outNoMatch},
		{"v6 hop-by-hop icmpv6 echo to wildcard vip", icmp(client6, vipAny6).withExt(0).frame(tb), outDst},
		{"v6 ah to vip:port", tcp(client6, vipPort6, 40000, 443).withExt(51).frame(tb), outNoMatch},
		{"v6 ah to udp-any-port vip", udp(client6, vipUDP6, 40000, 53).withExt(51).frame(tb), outNoMatch},
		{"v6 ah to wildcard vip", tcp(client6, vipAny6, 40000, 443).withExt(0, 51).frame(tb), outDst},

		// IPv6 fragments.
		{"v6 first fragment to vip:port", pkt{src: client6, dst: vipPort6, proto: 6, sport: 1, dport: 443, moreFrags: true}.withExt(44).frame(tb), outDst},
		{"v6 first fragment behind options to vip:port", pkt{src: client6, dst: vipPort6, proto: 6, sport: 1, dport: 443, moreFrags: true}.withExt(0, 44, 60).frame(tb), outDst},
		{"v6 later fragment to vip:port", pkt{src: client6, dst: vipPort6, proto: 6, fragOff: 100}.withExt(44).frame(tb), outNoMatch},
		{"v6 later fragment to wildcard vip", pkt{src: client6, dst: vipAny6, proto: 6, fragOff: 100, moreFrags: true}.withExt(44).frame(tb), outDst},
		{"v6 later fragment to udp-any-port vip", pkt{src: client6, dst: vipUDP6, proto: 17, fragOff: 100}.withExt(0, 44).frame(tb), outDst},
		{"v6 later tcp fragment to udp-any-port vip", pkt{src: client6, dst: vipUDP6, proto: 6, fragOff: 100}.withExt(44).frame(tb), outNoMatch},
		{"v6 later fragment of a destination-options packet to udp-any-port vip", pkt{src: client6, dst: vipUDP6, proto: 17, fragOff: 100}.withExt(44, 60).frame(tb), outNoMatch},
		{"v6 later fragment from dip:port", pkt{src: dipPort6, dst: client6, proto: 6, fragOff: 100}.withExt(44).frame(tb), outNoMatch},
		{"v6 later fragment from dip", pkt{src: dipAny6, dst: client6, proto: 6, fragOff: 100}.withExt(44).frame(tb), outSrc},
		{"v6 later icmpv6 fragment to wildcard vip", pkt{src: client6, dst: vipAny6, proto: 58, fragOff: 100}.withExt(44).frame(tb), outDst},
		// IPv4 fragments.
		{"v4 first fragment to vip:port", pkt{src: client4, dst: vipPort4, proto: 6, sport: 1, dport: 80, moreFrags: true}.frame(tb), outDst},
		{"v4 later fragment to vip:port", pkt{src: client4, dst: vipPort4, proto: 6, fragOff: 100}.frame(tb), outNoMatch},
		{"v4 later fragment to wildcard vip", pkt{src: client4, dst: vipAny4, proto: 6, fragOff: 100, moreFrags: true}.frame(tb), outDst},
		{"v4 later fragment to udp-any-port vip", pkt{src: client4, dst: vipUDP4, proto: 17, fragOff: 100}.frame(tb), outDst},
		{"v4 later fragment from dip:port", pkt{src: dipPort4, dst: client4, proto: 6, fragOff: 100}.frame(tb), outNoMatch},
		{"v4 later fragment from dip", pkt{src: dipAny4, dst: client4, proto: 6, fragOff: 100}.frame(tb), outSrc},

		// Host Agent uplink: VXLAN.
		{"v4 vxlan to local:4789", vxlanFrame(tb, client4, hostVX4, 4789), outVXLAN},
		{"v4 vxlan to local:4790", vxlanFrame(tb, client4, hostVX4, 4790), outNoMatch},
		{"v4 vxlan to other address", vxlanFrame(tb, client4, client4, 4789), outNoMatch},
		{"v4 tcp to local:4789", tcp(client4, hostVX4, 40000, 4789).frame(tb), outNoMatch},
		{"v4 other udp to local", udp(client4, hostVX4, 40000, 53).frame(tb), outNoMatch},
		{"v4 vlan vxlan", udp(client4, hostVX4, 1, 4789).withVLAN().frame(tb), outVXLAN},
		{"v6 vxlan to local:4789", vxlanFrame(tb, client6, hostVX6, 4789), outVXLAN},
		{"v6 other udp to local", udp(client6, hostVX6, 40000, 4790).frame(tb), outNoMatch},

		// VM port: source rules and the infrastructure veto.
		{"v4 from dip:port", tcp(dipPort4, client4, 8080, 40000).frame(tb), outSrc},
		{"v4 udp from dip:port", udp(dipPort4, client4, 8080, 40000).frame(tb), outSrc},
		{"v4 from dip other port", tcp(dipPort4, client4, 8081, 40000).frame(tb), outNoMatch},
		{"v4 icmp from port-only dip", icmp(dipPort4, client4).frame(tb), outNoMatch},
		{"v4 from wildcard dip", tcp(dipAny4, client4, 1234, 40000).frame(tb), outSrc},
		{"v4 icmp from wildcard dip", icmp(dipAny4, client4).frame(tb), outSrc},
		{"v4 from dip:port to infra", tcp(dipPort4, prober4, 8080, 40000).frame(tb), outInfra},
		{"v4 from wildcard dip to infra", icmp(dipAny4, prober4).frame(tb), outInfra},
		{"v4 to dip:port (not a source)", tcp(client4, dipPort4, 40000, 8080).frame(tb), outNoMatch},
		{"v4 vlan from dip:port", tcp(dipPort4, client4, 8080, 40000).withVLAN().frame(tb), outSrc},
		{"v6 from dip:port", tcp(dipPort6, client6, 8080, 40000).frame(tb), outSrc},
		{"v6 from dip other port", tcp(dipPort6, client6, 8081, 40000).frame(tb), outNoMatch},
		{"v6 from wildcard dip", udp(dipAny6, client6, 1234, 40000).frame(tb), outSrc},
		{"v6 from dip:port to infra", tcp(dipPort6, prober6, 8080, 40000).frame(tb), outInfra},
		{"v6 from wildcard dip to infra", icmp(dipAny6, prober6).frame(tb), outInfra},

		// Always the kernel's.
		{"arp", arpFrame(tb, false), outNotIP},
		{"vlan arp", arpFrame(tb, true), outNotIP},
		{"lldp", lldp, outNotIP},
		{"qinq outer tag", qinq, outNotIP},
		{"two 802.1q tags", double, outNotIP},
		{"v6 neighbour solicitation to wildcard vip", pkt{src: client6, dst: vipAny6, proto: 58, icmp6: 135 << 8}.frame(tb), outND},
		{"v6 neighbour advertisement from wildcard dip", pkt{src: dipAny6, dst: client6, proto: 58, icmp6: 136 << 8}.frame(tb), outND},
		{"v6 router solicitation from wildcard dip", pkt{src: dipAny6, dst: client6, proto: 58, icmp6: 133 << 8}.frame(tb), outND},
		{"v6 mldv2 report from wildcard dip", pkt{src: dipAny6, dst: client6, proto: 58, icmp6: 143 << 8}.frame(tb), outND},
		{"v6 mldv2 report with router alert from wildcard dip", pkt{src: dipAny6, dst: client6, proto: 58, icmp6: 143 << 8}.withExt(0).frame(tb), outND},
		{"v6 neighbour solicitation behind options to wildcard vip", pkt{src: client6, dst: vipAny6, proto: 58, icmp6: 135 << 8}.withExt(60).frame(tb), outND},

		// Malformed: never steered.
		{"ethernet header only", edit(web4[:l3], func([]byte) {}), outMalformed},
		{"vlan tag cut", append(edit(web4[:l3], put16(12, 0x8100)), 0, 100), outMalformed},
		{"v4 header cut", web4[:l3+10], outMalformed},
		{"v4 ihl 4", edit(web4, func(b []byte) { b[l3] = 0x44 }), outMalformed},
		{"v4 version 6", edit(web4, func(b []byte) { b[l3] = 0x65 }), outMalformed},
		{"v4 ihl past tot_len", edit(web4, func(b []byte) { b[l3] = 0x4f; binary.BigEndian.PutUint16(b[l3+2:], 40) }), outMalformed},
		{"v4 tot_len past frame", edit(web4, put16(l3+2, uint16(len(web4)-l3+1))), outMalformed},
		{"v4 tot_len below ihl", edit(web4, put16(l3+2, 19)), outMalformed},
		{"v4 tcp header cut by tot_len", edit(web4, put16(l3+2, 20+19)), outMalformed},
		{"v4 udp header cut by tot_len", edit(dns4, put16(l3+2, 20+7)), outMalformed},
		{"v6 header cut", web6[:l3+39], outMalformed},
		{"v6 version 4", edit(web6, func(b []byte) { b[l3] = 0x40 }), outMalformed},
		{"v6 payload past frame", edit(web6, put16(l3+4, uint16(len(web6)-l3-40+1))), outMalformed},
		{"v6 tcp header cut by payload length", edit(web6, put16(l3+4, 19)), outMalformed},
		{"v6 icmpv6 empty", edit(icmp(client6, vipAny6).frame(tb), put16(l3+4, 0)), outMalformed},
		{"v6 nine extension headers", udp(client6, vipAny6, 40000, 53).withExt(0, 60, 60, 60, 60, 60, 60, 60, 60).frame(tb), outMalformed},
		{"v6 hop-by-hop cut by payload length", edit(tcp(client6, vipAny6, 40000, 443).withExt(0).frame(tb), put16(l3+4, 7)), outMalformed},
		{"v6 extension length past payload", edit(tcp(client6, vipAny6, 40000, 443).withExt(60).frame(tb), func(b []byte) { b[l3+40+1] = 9 }), outMalformed},
		{"v6 tcp header cut after hop-by-hop", edit(tcp(client6, vipAny6, 40000, 443).withExt(0).frame(tb), put16(l3+4, 8+19)), outMalformed},
		{"v6 udp header cut after fragment", edit(udp(client6, vipAny6, 40000, 53).withExt(44).frame(tb), put16(l3+4, 8+7)), outMalformed},
		{"v6 icmpv6 cut after destination options", edit(icmp(client6, vipAny6).withExt(60).frame(tb), put16(l3+4, 8+3)), outMalformed},
	}
}

func TestGolden(t *testing.T) {
	p := loadOrSkip(t, Options{})
	require.NoError(t, p.Sync(goldenCfg))
	cases := goldenFrames(t)
	fd := xskFD(t)
	for _, socket := range []bool{false, true} {
		if socket {
			require.NoError(t, p.RegisterSocket(0, fd))
		}
		for _, c := range cases {
			t.Run(fmt.Sprintf("socket=%v/%s", socket, c.name), func(t *testing.T) {
				ret, d := runFrame(t, p, c.frame)
				assert.Equal(t, c.want, outcomeOf(t, d))
				want := uint32(xdpPass)
				if socket && c.want.steered() {
					want = xdpRedirect
					assert.Equal(t, uint64(1), d.Redirected)
				} else if c.want.steered() {
					assert.Equal(t, uint64(1), d.NoSocket)
				}
				assert.Equal(t, want, ret, "verdict")

				// The independent gopacket model agrees.
				m, ok := modelOutcome(goldenCfg, c.frame)
				assert.True(t, ok, "gopacket model undecided")
				assert.Equal(t, c.want, m, "gopacket model")
			})
		}
	}
}

// TestGoldenParse: every frame the program steers parses in the data path
// (engine.ParsePacket, the Mux's and Host Agent's Parse stage) without a
// drop, and the flow key it yields — protocol and ports found behind the
// same IPv6 extension headers, no ports for a later fragment — makes the
// same steering decision: what reaches a socket is what the data path
// expects, and is counted there.
func TestGoldenParse(t *testing.T) {
	for _, c := range goldenFrames(t) {
		if !c.want.steered() || c.want == outVXLAN {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			var p engine.Packet
			buf := append([]byte(nil), c.frame...)
			p.SetBuffer(nil, 0, buf, 0, len(buf), 0)
			require.Zero(t, engine.ParsePacket(&p, 0), "parse drop")
			k := p.Key
			ports := (k.Proto == ProtoTCP || k.Proto == ProtoUDP) && p.Flags&engine.FlagNonFirstFrag == 0
			assert.Equal(t, c.want, goldenCfg.decide(k.SrcAddr(), k.DstAddr(), k.Proto, ports, k.SrcPort, k.DstPort))
		})
	}
}

// ipEnd is where the IP packet in frame ends (gopacket pads frames to 60
// bytes; cutting the padding is no truncation).
func ipEnd(frame []byte) int {
	l3 := 14
	if binary.BigEndian.Uint16(frame[12:]) == 0x8100 {
		l3 = 18
	}
	if frame[l3]>>4 == 4 {
		return l3 + int(binary.BigEndian.Uint16(frame[l3+2:]))
	}
	return l3 + 40 + int(binary.BigEndian.Uint16(frame[l3+4:]))
}

// TestTruncatedNeverSteered cuts every steered golden frame at every length
// the kernel accepts (at least the Ethernet header) short of its IP end:
// each cut passes to the kernel as malformed.
func TestTruncatedNeverSteered(t *testing.T) {
	p := loadOrSkip(t, Options{})
	require.NoError(t, p.Sync(goldenCfg))
	require.NoError(t, p.RegisterSocket(0, xskFD(t)))
	for _, c := range goldenFrames(t) {
		if !c.want.steered() || c.name == "v4 ethernet padding" {
			continue
		}
		for n := 14; n < ipEnd(c.frame); n++ {
			ret, d := runFrame(t, p, c.frame[:n])
			require.Equal(t, uint32(xdpPass), ret, "%s cut to %d", c.name, n)
			require.Equal(t, outMalformed, outcomeOf(t, d), "%s cut to %d", c.name, n)
		}
	}
}

// TestSocketOnOtherQueue: a socket on queue 1 does not catch queue 0's
// traffic; the packet passes.
func TestSocketOnOtherQueue(t *testing.T) {
	p := loadOrSkip(t, Options{MaxQueues: 4})
	require.NoError(t, p.SteerDst(vipAny4, 0, 0))
	require.NoError(t, p.RegisterSocket(1, xskFD(t)))
	ret, d := runFrame(t, p, icmp(client4, vipAny4).frame(t))
	assert.Equal(t, uint32(xdpPass), ret)
	assert.Equal(t, Stats{NoSocket: 1, MatchedDst: 1}, d)

	require.NoError(t, p.RegisterSocket(0, xskFD(t)))
	ret, d = runFrame(t, p, icmp(client4, vipAny4).frame(t))
	assert.Equal(t, uint32(xdpRedirect), ret)
	assert.Equal(t, Stats{Redirected: 1, MatchedDst: 1}, d)

	require.NoError(t, p.UnregisterSocket(0))
	require.NoError(t, p.UnregisterSocket(0), "empty slot")
	ret, _ = runFrame(t, p, icmp(client4, vipAny4).frame(t))
	assert.Equal(t, uint32(xdpPass), ret)

	assert.Error(t, p.RegisterSocket(4, 0), "queue outside MaxQueues")
	assert.Error(t, p.RegisterSocket(-1, 0))
}

// TestNoRules: a freshly loaded program passes everything.
func TestNoRules(t *testing.T) {
	p := loadOrSkip(t, Options{})
	for _, c := range goldenFrames(t) {
		ret, d := runFrame(t, p, c.frame)
		require.Equal(t, uint32(xdpPass), ret, c.name)
		require.False(t, outcomeOf(t, d).steered(), c.name)
	}
}

// TestDropNoSocket: with SetDropNoSocket a steered frame on a queue
// without a socket is dropped and counted as NoSocketDropped; frames no
// rule steers still pass; a registered socket still gets its frames; off
// again, the frame passes.
func TestDropNoSocket(t *testing.T) {
	p := loadOrSkip(t, Options{MaxQueues: 4})
	require.NoError(t, p.SteerSrc(dipAny4, 0))
	require.NoError(t, p.SetDropNoSocket(true))
	reply := icmp(dipAny4, client4).frame(t)
	ret, d := runFrame(t, p, reply)
	assert.Equal(t, uint32(xdpDrop), ret)
	assert.Equal(t, Stats{NoSocketDropped: 1, MatchedSrc: 1}, d)
	assert.Zero(t, d.Passed())
	assert.EqualValues(t, 1, d.Packets())

	ret, d = runFrame(t, p, icmp(client4, dipAny4).frame(t))
	assert.Equal(t, uint32(xdpPass), ret, "not steered: passes")
	assert.Equal(t, Stats{NoMatch: 1}, d)

	require.NoError(t, p.RegisterSocket(0, xskFD(t)))
	ret, _ = runFrame(t, p, reply)
	assert.Equal(t, uint32(xdpRedirect), ret)
	require.NoError(t, p.UnregisterSocket(0))

	require.NoError(t, p.SetDropNoSocket(false))
	ret, d = runFrame(t, p, reply)
	assert.Equal(t, uint32(xdpPass), ret)
	assert.Equal(t, Stats{NoSocket: 1, MatchedSrc: 1}, d)
}
