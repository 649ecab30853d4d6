package nat_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/nat"
)

// Addresses: clients and VIPs in 198.18.0.0/15 and 2001:db8::/32 (the
// overlay of VNI 100 and 200 reuses them).
var (
	client4 = netip.MustParseAddr("198.18.0.7")
	client6 = netip.MustParseAddr("2001:db8:c::7")
	vipA    = netip.MustParseAddr("198.18.100.1")
	vipB    = netip.MustParseAddr("198.18.100.2")
	vipC    = netip.MustParseAddr("198.18.100.3")
	vip6    = netip.MustParseAddr("2001:db8:100::1")
	dipA    = netip.MustParseAddr("198.19.1.1")
	dipB    = netip.MustParseAddr("198.19.1.2")
	dipR    = netip.MustParseAddr("198.19.9.9") // on another host
	dip6    = netip.MustParseAddr("2001:db8:1::1")
	prober  = netip.MustParseAddr("198.18.200.5")

	macA  = header.MAC{0x02, 0, 0, 0, 0x0a, 0x01}
	macB  = header.MAC{0x02, 0, 0, 0, 0x0b, 0x01}
	macR  = header.MAC{0x02, 0, 0, 0, 0x99, 0x01}
	mac6  = header.MAC{0x02, 0, 0, 0, 0x06, 0x01}
	macGW = header.MAC{0x02, 0, 0, 0, 0xff, 0x01}

	infra = []netip.Prefix{netip.MustParsePrefix("198.18.200.0/24"), netip.MustParsePrefix("2001:db8:200::/48")}
)

const (
	vni    = 100
	uplink = 7
)

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// pkt describes a frame; frame() builds it with gopacket.
type pkt struct {
	dstMAC   header.MAC
	src, dst netip.AddrPort
	proto    uint8 // flow.ProtoTCP (default when 0), ProtoUDP, ProtoICMP, ProtoICMPv6
	syn, ack bool
	fin, rst bool
	payload  string
	// frag: 0 whole, 1 first fragment, 2 the non-first fragment that
	// follows it (the L4 bytes from offset 24 on).
	frag int
}

// protocol returns the IP protocol of p.
func (p pkt) protocol() uint8 {
	if p.proto == 0 {
		return flow.ProtoTCP
	}
	return p.proto
}

func tcp(src, dst netip.AddrPort) pkt {
	return pkt{src: src, dst: dst, proto: flow.ProtoTCP, ack: true}
}
func udp(src, dst netip.AddrPort) pkt { return pkt{src: src, dst: dst, proto: flow.ProtoUDP} }

// to returns p sent to the given MAC.
func (p pkt) to(mac header.MAC) pkt { p.dstMAC = mac; return p }

// reply returns the packet the server sends back: endpoints swapped.
func (p pkt) reply() pkt {
	p.src, p.dst = p.dst, p.src
	p.dstMAC = macGW
	return p
}

// translated returns p with the given destination (inbound) or source
// (return) endpoint.
func (p pkt) withDst(d netip.AddrPort) pkt { p.dst = d; return p }
func (p pkt) withSrc(s netip.AddrPort) pkt { p.src = s; return p }

func (p pkt) frame() []byte {
	if p.payload == "" {
		p.payload = "0123456789abcdef0123456789abcdef" // long enough to fragment
	}
	proto := p.proto
	if proto == 0 {
		proto = flow.ProtoTCP
	}
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, DstMAC: net.HardwareAddr(p.dstMAC[:])}
	var nl gopacket.NetworkLayer
	var ip4 *layers.IPv4
	var ip6 *layers.IPv6
	if p.src.Addr().Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip4 = &layers.IPv4{Version: 4, TTL: 64, Id: 0x1234, Protocol: layers.IPProtocol(proto),
			SrcIP: p.src.Addr().AsSlice(), DstIP: p.dst.Addr().AsSlice()}
		nl = ip4
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip6 = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocol(proto),
			SrcIP: p.src.Addr().AsSlice(), DstIP: p.dst.Addr().AsSlice()}
		nl = ip6
	}
	var l4 gopacket.SerializableLayer
	switch proto {
	case flow.ProtoTCP:
		t := &layers.TCP{SrcPort: layers.TCPPort(p.src.Port()), DstPort: layers.TCPPort(p.dst.Port()),
			Seq: 1000, Ack: 2000, SYN: p.syn, ACK: p.ack, FIN: p.fin, RST: p.rst, Window: 65000}
		_ = t.SetNetworkLayerForChecksum(nl)
		l4 = t
	case flow.ProtoUDP:
		u := &layers.UDP{SrcPort: layers.UDPPort(p.src.Port()), DstPort: layers.UDPPort(p.dst.Port())}
		_ = u.SetNetworkLayerForChecksum(nl)
		l4 = u
	case flow.ProtoICMP:
		l4 = &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 9, Seq: 1}
	case flow.ProtoICMPv6:
		i := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)}
		_ = i.SetNetworkLayerForChecksum(nl)
		l4 = i
	}
	if p.frag == 0 {
		return gpkt.MustSerialize(eth, nl.(gopacket.SerializableLayer), l4, gopacket.Payload(p.payload))
	}
	// Fragments: the transport segment of the whole datagram (checksum
	// over all of it), split at byte 24.
	all := gpkt.MustSerialize(l4, gopacket.Payload(p.payload))
	part, off, more := all[:24], 0, true
	if p.frag == 2 {
		part, off, more = all[24:], 24, false
	}
	if ip4 != nil {
		ip4.FragOffset = uint16(off / 8)
		if more {
			ip4.Flags = layers.IPv4MoreFragments
		}
		return gpkt.MustSerialize(eth, ip4, gopacket.Payload(part))
	}
	fh := make([]byte, 8, 8+len(part))
	fh[0] = proto
	fo := uint16(off)
	if more {
		fo |= 1
	}
	binary.BigEndian.PutUint16(fh[2:], fo)
	binary.BigEndian.PutUint32(fh[4:], 0xabcd)
	ip6.NextHeader = layers.IPProtocolIPv6Fragment
	return gpkt.MustSerialize(eth, ip6, gopacket.Payload(append(fh, part...)))
}

// gopacketChecksumsOK decodes frame with gopacket, serialises the decoded
// layers again with ComputeChecksums, and requires every checksum gopacket
// computes to equal the stored one: gopacket is the independent oracle. It
// is for whole (unfragmented) TCP and UDP frames.
func gopacketChecksumsOK(t testing.TB, frame []byte) gopacket.Packet {
	t.Helper()
	pk := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	require.NotNil(t, pk.TransportLayer(), "gopacket decode: %v", pk.ErrorLayer())
	var nl gopacket.NetworkLayer
	var ls []gopacket.SerializableLayer
	var want []uint16
	for _, l := range pk.Layers() {
		switch v := l.(type) {
		case *layers.IPv4:
			nl = v
			want = append(want, v.Checksum)
		case *layers.IPv6:
			nl = v
		case *layers.TCP:
			require.NoError(t, v.SetNetworkLayerForChecksum(nl))
			want = append(want, v.Checksum)
		case *layers.UDP:
			require.NoError(t, v.SetNetworkLayerForChecksum(nl))
			want = append(want, v.Checksum)
		}
		ls = append(ls, l.(gopacket.SerializableLayer))
		if l == pk.TransportLayer() {
			// What follows is payload to gopacket's checksum, whatever
			// an application decoder made of it.
			ls = append(ls, gopacket.Payload(l.LayerPayload()))
			break
		}
	}
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, ls...))
	again := gopacket.NewPacket(buf.Bytes(), layers.LayerTypeEthernet, gopacket.Default)
	var got []uint16
	for _, l := range again.Layers() {
		switch v := l.(type) {
		case *layers.IPv4:
			got = append(got, v.Checksum)
		case *layers.TCP:
			got = append(got, v.Checksum)
		case *layers.UDP:
			got = append(got, v.Checksum)
		}
	}
	require.NotEmpty(t, want)
	require.Equal(t, want, got, "stored checksums vs gopacket's")
	return pk
}

// env is a Host Agent NAT with a synthetic clock.
type env struct {
	t     testing.TB
	rules *flow.Rules
	table *nat.Table
	tr    *nat.Translator
	in    *nat.Inbound
	ret   *nat.Return
	now   flow.Tick
	ctr   engine.Counters
	drop  map[string]uint64 // drops by reason name
}

type envOpt func(*nat.Config)

func newEnv(t testing.TB, rules []flow.Rule, locals []nat.DIP, opts ...envOpt) *env {
	return newEnvTable(t, nat.TableConfig{Capacity: 4096}, rules, locals, opts...)
}

// newEnvTable is newEnv with a table of the given configuration.
func newEnvTable(t testing.TB, tc nat.TableConfig, rules []flow.Rule, locals []nat.DIP, opts ...envOpt) *env {
	e := &env{t: t, rules: flow.NewRules(), now: 1000}
	_, err := e.rules.Update(1, rules)
	require.NoError(t, err)
	e.table, err = nat.NewTable(tc)
	require.NoError(t, err)
	cfg := nat.Config{Rules: e.rules, Table: e.table, DIPs: locals, Uplink: uplink, Infra: infra,
		Clock: func() flow.Tick { return e.now }}
	for _, o := range opts {
		o(&cfg)
	}
	e.tr, err = nat.New(cfg)
	require.NoError(t, err)
	e.in, e.ret = e.tr.Inbound(), e.tr.Return()
	return e
}

// result is what a stage did with one frame.
type result struct {
	frame  []byte // the frame after the stage (nil when dropped)
	reason string // drop reason, "" when forwarded
	p      *engine.Packet
}

// run parses frame with the given VNI (as decapsulation or a VM port's
// Parse does), puts it through stage alone and reports the outcome. The
// packet arrives on port 3, which is also its OutPort (as Decap sets it).
func (e *env) run(stage engine.Stage, frame []byte, vni uint32) result {
	e.t.Helper()
	buf := make([]byte, engine.DefaultHeadroom+len(frame)+64)
	copy(buf[engine.DefaultHeadroom:], frame)
	p := new(engine.Packet)
	p.SetBuffer(nil, 0, buf, engine.DefaultHeadroom, len(frame), 3)
	r := engine.ParsePacket(p, vni)
	require.Zero(e.t, r, "test frame does not parse: %v", r)
	var b engine.Batch
	b.Counters = &e.ctr
	b.Append(p)
	stage.Process(&b)
	b.Compact()
	if b.Len() == 0 && p.Verdict != engine.VerdictEmit {
		if e.drop == nil {
			e.drop = map[string]uint64{}
		}
		e.drop[p.Reason.String()]++
		return result{reason: p.Reason.String(), p: p}
	}
	return result{frame: append([]byte(nil), p.Data()...), p: p}
}

func (e *env) inbound(p pkt) result { e.t.Helper(); return e.run(e.in, p.frame(), vni) }
func (e *env) reply(p pkt) result   { e.t.Helper(); return e.run(e.ret, p.frame(), vni) }

// state returns the table entry of the connection whose reply key is
// (DIP:dport → client).
func (e *env) state(proto uint8, vni uint32, dip, client netip.AddrPort) (nat.Entry, bool) {
	k := flow.KeyFrom(vni, proto, dip, client)
	return e.table.Lookup(&k, e.now)
}

// backendID returns the ID of the named backend of the named rule.
func (e *env) backendID(rule, backend string) uint32 {
	for _, r := range e.rules.Load().Rules() {
		if r.Name != rule {
			continue
		}
		for _, b := range r.Backends {
			if b.Name == backend {
				return b.ID
			}
		}
	}
	e.t.Fatalf("no backend %s/%s", rule, backend)
	return 0
}

// Rules of the main tests, all in VNI 100 unless said otherwise.
func testRules() []flow.Rule {
	return []flow.Rule{
		{Name: "web", VIP: flow.VIP{Addr: vipA, Proto: flow.ProtoTCP, Port: 80, VNI: vni}, Backends: []flow.Backend{
			{Name: "a", Addr: dipA, Port: 8080, MAC: macA, Weight: 1},
			{Name: "b", Addr: dipB, Port: 8080, MAC: macB, Weight: 1},
			{Name: "r", Addr: dipR, Port: 8080, MAC: macR, Weight: 1},
		}},
		{Name: "dns", VIP: flow.VIP{Addr: vipA, Proto: flow.ProtoUDP, Port: 53, VNI: vni}, Backends: []flow.Backend{
			{Name: "a", Addr: dipA, MAC: macA, Weight: 1}, // port preserved
		}},
		{Name: "all-tcp", VIP: flow.VIP{Addr: vipB, Proto: flow.ProtoTCP, VNI: vni}, Mode: flow.Tuple3, Backends: []flow.Backend{
			{Name: "b", Addr: dipB, MAC: macB, Weight: 1}, // every port, preserved
		}},
		{Name: "all-udp-remap", VIP: flow.VIP{Addr: vipC, Proto: flow.ProtoUDP, VNI: vni}, Mode: flow.Tuple3, Backends: []flow.Backend{
			{Name: "a", Addr: dipA, Port: 9000, MAC: macA, Weight: 1}, // every VIP port → 9000
		}},
		{Name: "web6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoTCP, Port: 443, VNI: vni}, Backends: []flow.Backend{
			{Name: "6", Addr: dip6, Port: 8443, MAC: mac6, Weight: 1},
		}},
		{Name: "dns6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoUDP, Port: 53, VNI: vni}, Backends: []flow.Backend{
			{Name: "6", Addr: dip6, MAC: mac6, Weight: 1},
		}},
		{Name: "dns6-remap", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoUDP, Port: 5353, VNI: vni}, Backends: []flow.Backend{
			{Name: "6", Addr: dip6, Port: 5300, MAC: mac6, Weight: 1},
		}},
		{Name: "ping", VIP: flow.VIP{Addr: vipA, Proto: flow.ProtoICMP, VNI: vni}, Backends: []flow.Backend{
			{Name: "a", Addr: dipA, MAC: macA, Weight: 1},
		}},
	}
}

func testLocals() []nat.DIP {
	return []nat.DIP{{VNI: vni, Addr: dipA}, {VNI: vni, Addr: dipB}, {VNI: vni, Addr: dip6}}
}

// icmpErr builds an ICMP error from src to dst (sent to dstMAC) quoting the
// IP packet of quoted, cut to n bytes (0: whole): over IPv4 a fragmentation
// needed (type 3 code 4, MTU 1400) or, with portUnreach, a port
// unreachable; over IPv6 a packet too big (MTU 1280).
func icmpErr(src, dst netip.Addr, dstMAC header.MAC, quoted pkt, n int, portUnreach bool) []byte {
	return icmpErrFrame(src, dst, dstMAC, quoted.frame(), n, portUnreach)
}

// icmpErrFrame is icmpErr quoting the IP packet of a frame.
func icmpErrFrame(src, dst netip.Addr, dstMAC header.MAC, quoted []byte, n int, portUnreach bool) []byte {
	q := quoted[header.EthernetSize:]
	if n > 0 {
		q = q[:n]
	}
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, DstMAC: net.HardwareAddr(dstMAC[:])}
	if src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		m := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeFragmentationNeeded), Seq: 1400}
		if portUnreach {
			m = &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodePort)}
		}
		return gpkt.MustSerialize(eth, ip, m, gopacket.Payload(q))
	}
	eth.EthernetType = layers.EthernetTypeIPv6
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	m := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypePacketTooBig, 0)}
	body := []byte{0, 0, 0x05, 0}
	if portUnreach {
		m = &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeDestinationUnreachable, layers.ICMPv6CodePortUnreachable)}
		body = []byte{0, 0, 0, 0}
	}
	_ = m.SetNetworkLayerForChecksum(ip)
	return gpkt.MustSerialize(eth, ip, m, gopacket.Payload(append(body, q...)))
}
