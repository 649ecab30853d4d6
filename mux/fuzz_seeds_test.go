package mux

import (
	"encoding/binary"
	"encoding/hex"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/flow/flowtest"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// muxFuzzSeed is one seed of FuzzMuxPipeline and what a fresh rig does
// with it (TestMuxFuzzSeeds).
type muxFuzzSeed struct {
	name             string
	frame            []byte
	twice, sameBatch bool
	want             []string // muxOutcome.summary
	sameBackendAs    string   // a seed whose flow this one must follow
}

// Addresses of the seeds beyond the bench flows.
var (
	seedClient4 = netip.MustParseAddr("198.18.5.6")
	seedClient6 = netip.MustParseAddr("2001:db8:1::56")
	seedRouter4 = netip.MustParseAddr("198.18.0.254")
	seedRouter6 = netip.MustParseAddr("2001:db8:1::fe")
)

// muxFuzzSeeds returns the seeds: one bench frame of each kind of
// muxAgreeMix (once, twice, twice in one batch), and frames built with
// gopacket for every other path of the pipeline.
func muxFuzzSeeds(tb testing.TB) []muxFuzzSeed {
	var seeds []muxFuzzSeed
	// One bench flow of each kind (with a TOS where the generator gave
	// one).
	flows := benchFlows(256, muxAgreeMix, 11, true)
	seen := map[flowtest.Kind]bool{}
	for _, fl := range flows {
		if seen[fl.Kind] {
			continue
		}
		seen[fl.Kind] = true
		fr := benchTargets.Frame(fl, 0)
		n := fl.Kind.String()
		seeds = append(seeds,
			muxFuzzSeed{name: n, frame: fr, want: []string{"vxlan"}},
			muxFuzzSeed{name: n + "-twice", frame: fr, twice: true, want: []string{"vxlan", "vxlan"}},
			muxFuzzSeed{name: n + "-twice-one-batch", frame: fr, twice: true, sameBatch: true, want: []string{"vxlan", "vxlan"}})
	}
	require.Len(tb, seen, int(flowtest.NumKinds), "benchFlows gave every kind")

	web4, web6 := benchVIPs[0].addr, benchVIPs[2].addr
	tcp := func(sport, dport uint16) *layers.TCP {
		return &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport),
			Seq: 7, Ack: 1, ACK: true, PSH: true, Window: 65535}
	}
	ip4 := func(src, dst netip.Addr, proto layers.IPProtocol) *layers.IPv4 {
		return &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(),
			Flags: layers.IPv4DontFragment}
	}
	ip6 := func(src, dst netip.Addr, next layers.IPProtocol) *layers.IPv6 {
		return &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: next, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	}
	payload := func(n int) gopacket.Payload {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(i)
		}
		return p
	}

	// A TCP flow to web4, then an ICMP fragmentation needed about its
	// replies (VIP:80 → client), from a router on the return path: the
	// error follows the flow to its backend.
	flow4 := seedFrame(tb, ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP), tcp(40000, 80), payload(10))
	seeds = append(seeds, muxFuzzSeed{name: "flow4", frame: flow4, want: []string{"vxlan"}})
	quote4 := gpkt.Serialize(tb, ip4(web4.Addr(), seedClient4, layers.IPProtocolTCP), tcp(80, 40000), payload(1400))[:28]
	seeds = append(seeds, muxFuzzSeed{name: "icmp4-frag-needed-quoting-flow4",
		frame: seedFrame(tb, ip4(seedRouter4, web4.Addr(), layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable,
				layers.ICMPv4CodeFragmentationNeeded), Seq: 1400}, gopacket.Payload(quote4)),
		want: []string{"vxlan"}, sameBackendAs: "flow4"})
	// The same for web6: a flow and a packet too big about it.
	flow6 := seedFrame(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolTCP), tcp(40000, 80), payload(10))
	seeds = append(seeds, muxFuzzSeed{name: "flow6", frame: flow6, want: []string{"vxlan"}})
	quote6 := gpkt.Serialize(tb, ip6(web6.Addr(), seedClient6, layers.IPProtocolTCP), tcp(80, 40000), payload(1400))[:48]
	seeds = append(seeds, muxFuzzSeed{name: "icmp6-packet-too-big-quoting-flow6",
		frame: seedFrame(tb, ip6(seedRouter6, web6.Addr(), layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypePacketTooBig, 0)},
			gopacket.Payload(append([]byte{0, 0, 0x05, 0x78}, quote6...))),
		want: []string{"vxlan"}, sameBackendAs: "flow6"})
	// The same behind a Destination Options and a Fragment header (a
	// first fragment, by hand: gopacket cannot serialise one) in the
	// quote: the error still follows flow6. A quote cut inside that chain
	// names no flow: not forwarded.
	destOpts := &layers.IPv6Destination{Options: []*layers.IPv6DestinationOption{{OptionType: 0x1e, OptionData: []byte{1, 2, 3, 4}}}}
	destOpts.NextHeader = layers.IPProtocolIPv6Fragment
	quote6ext := gpkt.Serialize(tb, ip6(web6.Addr(), seedClient6, layers.IPProtocolIPv6Destination), destOpts,
		gopacket.Payload{byte(layers.IPProtocolTCP), 0, 0, 1, 0, 0, 0x12, 0x34}, tcp(80, 40000), payload(1400))
	tooBig6 := func(quote []byte) []byte {
		return seedFrame(tb, ip6(seedRouter6, web6.Addr(), layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypePacketTooBig, 0)},
			gopacket.Payload(append([]byte{0, 0, 0x05, 0x78}, quote...)))
	}
	seeds = append(seeds,
		muxFuzzSeed{name: "icmp6-packet-too-big-quoting-flow6-behind-extension-headers", frame: tooBig6(quote6ext[:64]),
			want: []string{"vxlan"}, sameBackendAs: "flow6"},
		muxFuzzSeed{name: "icmp6-packet-too-big-quote-cut-in-extension-headers", frame: tooBig6(quote6ext[:52]),
			want: []string{"drop:no_rule"}})

	// Pings of VIP addresses.
	seeds = append(seeds,
		muxFuzzSeed{name: "echo4-web4", frame: seedFrame(tb, ip4(seedClient4, web4.Addr(), layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 0x1234, Seq: 1},
			payload(32)), want: []string{"echo-reply"}},
		muxFuzzSeed{name: "echo6-web6", frame: seedFrame(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)},
			&layers.ICMPv6Echo{Identifier: 0x1234, SeqNumber: 1}, payload(32)), want: []string{"echo-reply"}})

	// IPv4 fragments to web4: the first is balanced by hash, a later one
	// cannot be (the rule hashes ports).
	first4 := ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP)
	first4.Flags = layers.IPv4MoreFragments
	later4 := ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP)
	later4.Flags, later4.FragOffset = 0, 185
	seeds = append(seeds,
		muxFuzzSeed{name: "frag4-first", frame: seedFrame(tb, first4, tcp(40001, 80), payload(64)), twice: true,
			want: []string{"vxlan", "vxlan"}},
		muxFuzzSeed{name: "frag4-later", frame: seedFrame(tb, later4, payload(100)), want: []string{"drop:no_rule"}})
	// IPv6 fragments to web6 (the Fragment header by hand: gopacket
	// cannot serialise one).
	seg := gpkt.Serialize(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolTCP), tcp(40001, 80), payload(64))[40:]
	fragHdr := func(offset uint16, more bool) []byte {
		h := []byte{byte(layers.IPProtocolTCP), 0, 0, 0, 0, 0, 0x12, 0x34}
		fo := offset << 3
		if more {
			fo |= 1
		}
		binary.BigEndian.PutUint16(h[2:], fo)
		return h
	}
	seeds = append(seeds,
		muxFuzzSeed{name: "frag6-first", frame: seedFrame(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolIPv6Fragment),
			gopacket.Payload(append(fragHdr(0, true), seg...))), twice: true, want: []string{"vxlan", "vxlan"}},
		muxFuzzSeed{name: "frag6-later", frame: seedFrame(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolIPv6Fragment),
			gopacket.Payload(append(fragHdr(185, false), payload(100)...))), want: []string{"drop:no_rule"}})

	// Too big for the tunnel (encap.DefaultMTU less the VXLAN over IPv4
	// overhead): an IPv4 packet with DF gets fragmentation needed, an
	// IPv6 packet packet too big.
	big := encap.DefaultMTU - encap.OverheadIPv4 + 1 // IP bytes
	seeds = append(seeds,
		muxFuzzSeed{name: "toobig4-df", frame: seedFrame(tb, ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP),
			tcp(40002, 80), payload(big-40)), want: []string{"frag-needed"}},
		muxFuzzSeed{name: "toobig6", frame: seedFrame(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolTCP),
			tcp(40002, 80), payload(big-60)), want: []string{"packet-too-big"}})
	// The same, and a ping, sent to a link-layer broadcast or multicast
	// address: not forwarded (RFC 1812 5.3.4), and no ICMP about them
	// (RFC 1122 3.2.2, 3.3.6).
	group := func(fr []byte, mac ...byte) []byte { copy(fr, mac); return fr }
	seeds = append(seeds,
		muxFuzzSeed{name: "toobig4-df-broadcast", frame: group(seedFrame(tb, ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP),
			tcp(40002, 80), payload(big-40)), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), want: []string{"drop:link_group"}},
		muxFuzzSeed{name: "toobig6-multicast", frame: group(seedFrame(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolTCP),
			tcp(40002, 80), payload(big-60)), 0x33, 0x33, 0, 0, 0, 1), want: []string{"drop:link_group"}},
		muxFuzzSeed{name: "echo4-web4-broadcast", frame: group(seedFrame(tb, ip4(seedClient4, web4.Addr(), layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 0x1234, Seq: 1},
			payload(32)), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), want: []string{"drop:link_group"}},
		muxFuzzSeed{name: "flow4-broadcast", frame: group(seedFrame(tb, ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP),
			tcp(40004, 80), payload(32)), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), want: []string{"drop:link_group"}})
	// The largest packet that fits is encapsulated.
	seeds = append(seeds, muxFuzzSeed{name: "fits4", frame: seedFrame(tb, ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP),
		tcp(40003, 80), payload(big-41)), want: []string{"vxlan"}})

	// Spoofed sources: a VIP to itself (the loop of issue 10), another VIP,
	// the Mux's own address, an infrastructure prefix (a router's echo
	// request: only its ICMP errors pass, see the seeds above), martians.
	dns4 := benchVIPs[1].addr
	udp := func(sport, dport uint16) *layers.UDP {
		return &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
	}
	udpFrame := func(src, dst netip.Addr, sport, dport uint16) []byte {
		u := udp(sport, dport)
		ip := ip4(src, dst, layers.IPProtocolUDP)
		require.NoError(tb, u.SetNetworkLayerForChecksum(ip))
		return seedFrame(tb, ip, u, payload(8))
	}
	seeds = append(seeds,
		muxFuzzSeed{name: "spoof-vip-to-itself", frame: udpFrame(dns4.Addr(), dns4.Addr(), 53, 53), want: []string{"drop:src_vip"}},
		muxFuzzSeed{name: "spoof-other-vip", frame: seedFrame(tb, ip4(benchVIPs[1].addr.Addr(), web4.Addr(), layers.IPProtocolTCP),
			tcp(53, 80), payload(10)), want: []string{"drop:src_vip"}},
		muxFuzzSeed{name: "spoof-vip6", frame: seedFrame(tb, ip6(web6.Addr(), web6.Addr(), layers.IPProtocolTCP),
			tcp(80, 80), payload(10)), want: []string{"drop:src_vip"}},
		muxFuzzSeed{name: "spoof-mux", frame: udpFrame(benchMuxSrc, dns4.Addr(), 53, 53), want: []string{"drop:src_node"}},
		muxFuzzSeed{name: "spoof-infra", frame: udpFrame(netip.MustParseAddr("198.18.0.77"), dns4.Addr(), 4000, 53),
			want: []string{"drop:src_infra"}},
		muxFuzzSeed{name: "infra-echo", frame: seedFrame(tb, ip4(seedRouter4, web4.Addr(), layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 1},
			payload(8)), want: []string{"drop:src_infra"}},
		muxFuzzSeed{name: "martian-loopback", frame: udpFrame(netip.MustParseAddr("127.0.0.1"), dns4.Addr(), 4000, 53),
			want: []string{"drop:src_martian"}},
		muxFuzzSeed{name: "martian-broadcast", frame: udpFrame(netip.MustParseAddr("255.255.255.255"), dns4.Addr(), 4000, 53),
			want: []string{"drop:src_martian"}},
		muxFuzzSeed{name: "martian-multicast6", frame: seedFrame(tb, ip6(netip.MustParseAddr("ff02::1"), web6.Addr(), layers.IPProtocolTCP),
			tcp(4000, 80), payload(10)), want: []string{"drop:src_martian"}})
	// TTL / hop limit: 2 is forwarded with 1, 1 is not.
	ttl4 := func(ttl uint8) []byte {
		ip := ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP)
		ip.TTL = ttl
		return seedFrame(tb, ip, tcp(40010+uint16(ttl), 80), payload(10))
	}
	hop6 := func(hl uint8) []byte {
		ip := ip6(seedClient6, web6.Addr(), layers.IPProtocolTCP)
		ip.HopLimit = hl
		return seedFrame(tb, ip, tcp(40010+uint16(hl), 80), payload(10))
	}
	seeds = append(seeds,
		muxFuzzSeed{name: "ttl4-2", frame: ttl4(2), want: []string{"vxlan"}},
		muxFuzzSeed{name: "ttl4-1", frame: ttl4(1), want: []string{"drop:ttl_exceeded"}},
		muxFuzzSeed{name: "ttl4-0", frame: ttl4(0), want: []string{"drop:ttl_exceeded"}},
		muxFuzzSeed{name: "hop6-2", frame: hop6(2), want: []string{"vxlan"}},
		muxFuzzSeed{name: "hop6-1", frame: hop6(1), want: []string{"drop:ttl_exceeded"}})

	// No VIP there; garbage; a frame cut short.
	seeds = append(seeds,
		muxFuzzSeed{name: "no-vip", frame: seedFrame(tb, ip4(seedClient4, netip.MustParseAddr("198.19.255.9"), layers.IPProtocolTCP),
			tcp(40000, 80), payload(10)), want: []string{"drop:no_rule"}},
		muxFuzzSeed{name: "garbage", frame: mustHex(tb, "ffffffffffff0123456789ab88b5deadbeefcafef00d0badc0ffee"),
			want: []string{"drop:not_ip"}},
		muxFuzzSeed{name: "truncated", frame: flow4[:30], want: []string{"drop:truncated"}},
		muxFuzzSeed{name: "empty", frame: nil, want: []string{"drop:truncated"}})
	return append(seeds, outboundFuzzSeeds(tb)...)
}

// seedFrame is gpkt.Serialize behind an Ethernet header from the client's MAC
// to the Mux's.
func seedFrame(tb testing.TB, ls ...gopacket.SerializableLayer) []byte {
	et := layers.EthernetTypeIPv4
	if _, ok := ls[0].(*layers.IPv6); ok {
		et = layers.EthernetTypeIPv6
	}
	eth := &layers.Ethernet{SrcMAC: benchClientMAC, DstMAC: net.HardwareAddr(benchHop.SrcMAC[:]), EthernetType: et}
	return gpkt.Serialize(tb, append([]gopacket.SerializableLayer{eth}, ls...)...)
}

func mustHex(tb testing.TB, s string) []byte {
	b, err := hex.DecodeString(s)
	require.NoError(tb, err)
	return b
}
