//go:build linux

package steer

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// Test addresses: 198.18.0.0/15 and 2001:db8::/32 only.
var (
	vipPort4  = netip.MustParseAddr("198.18.0.10") // tcp/80 only
	vipAny4   = netip.MustParseAddr("198.18.0.11") // any protocol
	vipUDP4   = netip.MustParseAddr("198.18.0.12") // udp, any port
	hostVX4   = netip.MustParseAddr("198.18.1.1")  // VXLAN endpoint (4789)
	dipPort4  = netip.MustParseAddr("198.18.2.10") // source port 8080 only
	dipAny4   = netip.MustParseAddr("198.18.2.11") // any source port
	client4   = netip.MustParseAddr("198.19.0.1")
	prober4   = netip.MustParseAddr("198.18.3.1")   // in infra 198.18.3.0/24
	vipPort6  = netip.MustParseAddr("2001:db8::10") // tcp/443 only
	vipAny6   = netip.MustParseAddr("2001:db8::11")
	vipUDP6   = netip.MustParseAddr("2001:db8::12")  // udp, any port
	hostVX6   = netip.MustParseAddr("2001:db8:1::1") // VXLAN endpoint (4789)
	dipPort6  = netip.MustParseAddr("2001:db8:2::10")
	dipAny6   = netip.MustParseAddr("2001:db8:2::11")
	client6   = netip.MustParseAddr("2001:db8:ffff::1")
	prober6   = netip.MustParseAddr("2001:db8:3::1") // in infra 2001:db8:3::/48
	macA      = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0a}
	macB      = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0b}
	goldenCfg = Config{
		Dst: []DstRule{
			{Addr: vipPort4, Proto: ProtoTCP, Port: 80},
			{Addr: vipAny4},
			{Addr: vipUDP4, Proto: ProtoUDP},
			{Addr: vipPort6, Proto: ProtoTCP, Port: 443},
			{Addr: vipAny6},
			{Addr: vipUDP6, Proto: ProtoUDP},
		},
		VXLAN: []VXLANRule{{Local: hostVX4}, {Local: hostVX6, Port: 4789}},
		Src: []SrcRule{
			{Addr: dipPort4, Port: 8080},
			{Addr: dipAny4},
			{Addr: dipPort6, Port: 8080},
			{Addr: dipAny6},
		},
		Infra: []netip.Prefix{
			netip.MustParsePrefix("198.18.3.0/24"),
			netip.MustParsePrefix("2001:db8:3::/48"),
		},
	}
)

// loadOrSkip loads a Program, skipping the test when the process lacks the
// privilege; any other failure fails the test.
func loadOrSkip(tb testing.TB, opts Options) *Program {
	tb.Helper()
	p, err := Load(opts)
	if err != nil && (errors.Is(err, unix.EPERM) || errors.Is(err, ebpf.ErrNotSupported)) {
		tb.Skipf("loading BPF needs root or CAP_BPF (euid %d): %v", os.Geteuid(), err)
	}
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, p.Close()) })
	return p
}

// xskFD returns an (unbound) AF_XDP socket: enough for bpf_redirect_map to
// find a socket in the XSKMAP and return XDP_REDIRECT under BPF_PROG_RUN,
// which does not deliver the frame.
func xskFD(tb testing.TB) int {
	tb.Helper()
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW, 0)
	if err != nil {
		tb.Skipf("AF_XDP socket: %v", err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	return fd
}

// outcome names what the program did with one packet.
type outcome string

const (
	outDst       outcome = "dst"
	outVXLAN     outcome = "vxlan"
	outSrc       outcome = "src"
	outNoMatch   outcome = "no_match"
	outNotIP     outcome = "not_ip"
	outMalformed outcome = "malformed"
	outInfra     outcome = "infra"
	outND        outcome = "nd"
)

func (o outcome) steered() bool { return o == outDst || o == outVXLAN || o == outSrc }

// outcomeOf turns the counters of exactly one packet into its outcome.
func outcomeOf(tb testing.TB, d Stats) outcome {
	tb.Helper()
	require.Equal(tb, uint64(1), d.Packets(), "counters of one packet: %+v", d)
	switch {
	case d.Redirected+d.NoSocket == 1:
		require.Equal(tb, uint64(1), d.MatchedDst+d.MatchedVXLAN+d.MatchedSrc, "%+v", d)
		switch {
		case d.MatchedDst == 1:
			return outDst
		case d.MatchedVXLAN == 1:
			return outVXLAN
		}
		return outSrc
	case d.NoMatch == 1:
		return outNoMatch
	case d.NotIP == 1:
		return outNotIP
	case d.Malformed == 1:
		return outMalformed
	case d.Infra == 1:
		return outInfra
	}
	return outND
}

// runFrame runs the program once on frame (BPF_PROG_RUN, RX queue 0) and
// returns the XDP verdict and the counters that moved.
func runFrame(tb testing.TB, p *Program, frame []byte) (uint32, Stats) {
	tb.Helper()
	before, err := p.Stats()
	require.NoError(tb, err)
	ret, err := p.objs.XdpSteer.Run(&ebpf.RunOptions{Data: frame})
	require.NoError(tb, err)
	after, err := p.Stats()
	require.NoError(tb, err)
	return ret, after.Sub(before)
}

const (
	xdpDrop     = 1
	xdpPass     = 2
	xdpRedirect = 4
)

// pkt describes a test frame; frame() builds it with gopacket.
type pkt struct {
	vlan         bool
	src, dst     netip.Addr
	proto        layers.IPProtocol
	sport, dport uint16
	fragOff      uint16 // IPv4 or IPv6 (ext 44) fragment offset, in 8-byte units
	moreFrags    bool
	ipOpts       int // IPv4: this many 4-byte words of NOP options
	icmp6        layers.ICMPv6TypeCode
	ext6         []byte // IPv6 extension headers in front of the L4 header, in order: 0 (hop-by-hop), 43 (routing), 44 (fragment), 51 (AH), 60 (destination options)
	extLen       int    // hop-by-hop, routing and destination options: this many 8-byte units beyond the first
	payload      []byte
}

func tcp(src, dst netip.Addr, sport, dport uint16) pkt {
	return pkt{src: src, dst: dst, proto: layers.IPProtocolTCP, sport: sport, dport: dport}
}

func udp(src, dst netip.Addr, sport, dport uint16) pkt {
	return pkt{src: src, dst: dst, proto: layers.IPProtocolUDP, sport: sport, dport: dport}
}

func icmp(src, dst netip.Addr) pkt {
	if src.Is4() {
		return pkt{src: src, dst: dst, proto: layers.IPProtocolICMPv4}
	}
	return pkt{src: src, dst: dst, proto: layers.IPProtocolICMPv6,
		icmp6: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)}
}

func (s pkt) withVLAN() pkt { s.vlan = true; return s }

func (s pkt) withExt(nh ...byte) pkt {
	s.ext6 = append(append([]byte(nil), s.ext6...), nh...)
	return s
}

func ethLayers(s pkt, typ layers.EthernetType) []gopacket.SerializableLayer {
	eth := &layers.Ethernet{SrcMAC: macA, DstMAC: macB, EthernetType: typ}
	if !s.vlan {
		return []gopacket.SerializableLayer{eth}
	}
	eth.EthernetType = layers.EthernetTypeDot1Q
	return []gopacket.SerializableLayer{eth, &layers.Dot1Q{VLANIdentifier: 100, Type: typ}}
}

// l4 serializes the transport header and payload, checksummed against nl.
func (s pkt) l4(tb testing.TB, nl gopacket.NetworkLayer) []byte {
	payload := gopacket.Payload(s.payload)
	if payload == nil {
		payload = gopacket.Payload("xdplb")
	}
	switch s.proto {
	case layers.IPProtocolTCP:
		t := &layers.TCP{SrcPort: layers.TCPPort(s.sport), DstPort: layers.TCPPort(s.dport), SYN: true, Window: 1024}
		require.NoError(tb, t.SetNetworkLayerForChecksum(nl))
		return gpkt.Serialize(tb, t, payload)
	case layers.IPProtocolUDP:
		u := &layers.UDP{SrcPort: layers.UDPPort(s.sport), DstPort: layers.UDPPort(s.dport)}
		require.NoError(tb, u.SetNetworkLayerForChecksum(nl))
		return gpkt.Serialize(tb, u, payload)
	case layers.IPProtocolICMPv4:
		return gpkt.Serialize(tb, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0)}, payload)
	case layers.IPProtocolICMPv6:
		i := &layers.ICMPv6{TypeCode: s.icmp6}
		require.NoError(tb, i.SetNetworkLayerForChecksum(nl))
		return gpkt.Serialize(tb, i, gopacket.Payload(make([]byte, 20)))
	}
	return gpkt.Serialize(tb, payload)
}

func (s pkt) frame(tb testing.TB) []byte {
	tb.Helper()
	if s.src.Is4() {
		ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: s.proto,
			SrcIP: s.src.AsSlice(), DstIP: s.dst.AsSlice(), FragOffset: s.fragOff}
		if s.moreFrags {
			ip.Flags = layers.IPv4MoreFragments
		}
		for i := 0; i < 4*s.ipOpts; i++ {
			ip.Options = append(ip.Options, layers.IPv4Option{OptionType: 1})
		}
		body := s.l4(tb, ip)
		if s.fragOff != 0 {
			body = append([]byte("fragment"), s.payload...) // no L4 header
		}
		return gpkt.Serialize(tb, append(ethLayers(s, layers.EthernetTypeIPv4), ip, gopacket.Payload(body))...)
	}
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: s.proto,
		SrcIP: s.src.AsSlice(), DstIP: s.dst.AsSlice()}
	body := s.l4(tb, ip)
	if s.fragOff != 0 {
		body = append([]byte("fragment"), s.payload...) // no L4 header
	}
	next := byte(s.proto)
	for i := len(s.ext6) - 1; i >= 0; i-- {
		nh := s.ext6[i]
		ext := make([]byte, 8)
		switch nh {
		case 0, 60: // one PadN option filling the header
			ext = make([]byte, 8*(1+s.extLen))
			ext[1], ext[2], ext[3] = byte(s.extLen), 1, byte(len(ext)-4)
		case 43: // type 0 (the one gopacket decodes), segments left 0, s.extLen/2 addresses
			ext = make([]byte, 8*(1+s.extLen))
			ext[1] = byte(s.extLen)
		case 44: // fragment: s.fragOff, s.moreFrags
			binary.BigEndian.PutUint16(ext[2:], s.fragOff<<3)
			if s.moreFrags {
				ext[3] |= 1
			}
			binary.BigEndian.PutUint32(ext[4:], 0x2001db8)
		case 51: // AH: 12 bytes of header and 4 of ICV, length in 4-byte units minus 2
			ext = make([]byte, 16)
			ext[1] = 2
			binary.BigEndian.PutUint32(ext[4:], 0x100)
		}
		ext[0] = next
		next = nh
		body = append(ext, body...)
	}
	ip.NextHeader = layers.IPProtocol(next)
	return gpkt.Serialize(tb, append(ethLayers(s, layers.EthernetTypeIPv6), ip, gopacket.Payload(body))...)
}

func arpFrame(tb testing.TB, vlan bool) []byte {
	a := &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
		HwAddressSize: 6, ProtAddressSize: 4, Operation: layers.ARPRequest,
		SourceHwAddress: macA, SourceProtAddress: client4.AsSlice(),
		DstHwAddress: make([]byte, 6), DstProtAddress: vipAny4.AsSlice()}
	return gpkt.Serialize(tb, append(ethLayers(pkt{vlan: vlan}, layers.EthernetTypeARP), a)...)
}

// vxlanFrame is VXLAN to dst:port carrying an inner Ethernet/IPv4/TCP frame.
func vxlanFrame(tb testing.TB, src, dst netip.Addr, port uint16) []byte {
	inner := pkt{src: client4, dst: vipPort4, proto: layers.IPProtocolTCP, sport: 40000, dport: 80}.frame(tb)
	vx := gpkt.Serialize(tb, &layers.VXLAN{ValidIDFlag: true, VNI: 4242}, gopacket.Payload(inner))
	s := udp(src, dst, 51000, port)
	s.payload = vx
	return s.frame(tb)
}
