package encap_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// Test addresses: 198.18.0.0/15 and 2001:db8::/32 only.
var (
	client4 = netip.MustParseAddr("198.18.0.10")
	client6 = netip.MustParseAddr("2001:db8::10")
	vip4    = netip.MustParseAddr("198.18.100.1")
	vip6    = netip.MustParseAddr("2001:db8:100::1")
	mux4    = netip.MustParseAddr("198.18.1.1")
	mux6    = netip.MustParseAddr("2001:db8:1::1")
	host4   = netip.MustParseAddr("198.19.2.2")
	host6   = netip.MustParseAddr("2001:db8:2::2")
	hostB   = netip.MustParseAddr("198.19.2.3") // another host
	dip4    = netip.MustParseAddr("198.19.10.5")
	dip6    = netip.MustParseAddr("2001:db8:10::5")

	routerMAC = header.MAC{0x02, 0, 0, 0, 0, 0x01}
	muxMAC    = header.MAC{0x02, 0, 0, 0, 0, 0x02}
	dipMAC    = header.MAC{0x02, 0, 0, 0, 0xaa, 0x01}
	hopMAC    = header.MAC{0x02, 0, 0, 0, 0xbb, 0x01}
)

const testVNI = 0x12345

func hw(m header.MAC) net.HardwareAddr { return net.HardwareAddr(m[:]) }

// pkt describes an inner (client) frame; build makes it with gopacket.
type pkt struct {
	src, dst netip.Addr
	proto    layers.IPProtocol // default UDP
	size     int               // payload bytes
	df       bool
	tos      uint8 // IPv4 TOS / IPv6 traffic class
	vlan     uint16
	icmpType uint8 // for ICMP / ICMPv6
	pad      int   // Ethernet padding bytes after the IP packet
}

func v4pkt() pkt { return pkt{src: client4, dst: vip4, size: 32, df: true} }
func v6pkt() pkt { return pkt{src: client6, dst: vip6, size: 32} }

func (p pkt) build() []byte {
	eth := &layers.Ethernet{SrcMAC: hw(routerMAC), DstMAC: hw(muxMAC)}
	ls := []gopacket.SerializableLayer{eth}
	if p.vlan != 0 {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: p.vlan})
	}
	proto := p.proto
	if proto == 0 {
		proto = layers.IPProtocolUDP
	}
	var nl gopacket.NetworkLayer
	if p.src.Is4() {
		if p.vlan != 0 {
			ls[1].(*layers.Dot1Q).Type = layers.EthernetTypeIPv4
		} else {
			eth.EthernetType = layers.EthernetTypeIPv4
		}
		ip := &layers.IPv4{Version: 4, TTL: 64, TOS: p.tos, Protocol: proto, SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice(), Id: 0x4242}
		if p.df {
			ip.Flags = layers.IPv4DontFragment
		}
		nl = ip
		ls = append(ls, ip)
	} else {
		if p.vlan != 0 {
			ls[1].(*layers.Dot1Q).Type = layers.EthernetTypeIPv6
		} else {
			eth.EthernetType = layers.EthernetTypeIPv6
		}
		ip := &layers.IPv6{Version: 6, HopLimit: 64, TrafficClass: p.tos, FlowLabel: 0x12345, NextHeader: proto, SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice()}
		nl = ip
		ls = append(ls, ip)
	}
	payload := make([]byte, p.size)
	for i := range payload {
		payload[i] = byte(i*7 + 3)
	}
	switch proto {
	case layers.IPProtocolUDP:
		u := &layers.UDP{SrcPort: 40000, DstPort: 80}
		_ = u.SetNetworkLayerForChecksum(nl)
		ls = append(ls, u)
	case layers.IPProtocolTCP:
		tc := &layers.TCP{SrcPort: 40000, DstPort: 80, ACK: true, Seq: 1, Ack: 1, Window: 1000}
		_ = tc.SetNetworkLayerForChecksum(nl)
		ls = append(ls, tc)
	case layers.IPProtocolICMPv4:
		ls = append(ls, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(p.icmpType, 0)})
	case layers.IPProtocolICMPv6:
		ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(p.icmpType, 0)}
		_ = ic.SetNetworkLayerForChecksum(nl)
		ls = append(ls, ic)
	}
	ls = append(ls, gopacket.Payload(payload))
	b := gpkt.MustSerialize(ls...)
	return append(b, make([]byte, p.pad)...)
}

// ruleFor returns a rule with one backend on host (directly, without a
// snapshot: the stages read only VIP.VNI and Backends).
func ruleFor(vip netip.Addr, host netip.Addr) *flow.Rule {
	dip := dip4
	if vip.Is6() {
		dip = dip6
	}
	return &flow.Rule{
		Name: "r",
		VIP:  flow.VIP{Addr: vip, Proto: flow.ProtoUDP, Port: 80, VNI: testVNI},
		Backends: []flow.Backend{
			{Name: "other", Addr: dip, Host: host, MAC: [6]byte{2, 0, 0, 0, 0xaa, 0xff}, Weight: 1},
			{Name: "dip", Addr: dip, Host: host, MAC: dipMAC, Weight: 1},
		},
	}
}

// rig holds a batch of packets over private buffers.
type rig struct {
	t    testing.TB
	b    engine.Batch
	pool [engine.MaxBatch]engine.Packet
	bufs [engine.MaxBatch][]byte
}

const headroom = engine.DefaultHeadroom

func newRig(t testing.TB) *rig {
	r := &rig{t: t}
	for i := range r.bufs {
		r.bufs[i] = make([]byte, 4096)
	}
	return r
}

// load empties the batch and fills it with frames, parsed with vni.
func (r *rig) load(vni uint32, frames ...[]byte) []*engine.Packet {
	return r.loadAt(headroom, vni, frames...)
}

func (r *rig) loadAt(room int, vni uint32, frames ...[]byte) []*engine.Packet {
	r.b.Reset()
	for i, f := range frames {
		p := &r.pool[i]
		copy(r.bufs[i][room:], f)
		p.SetBuffer(nil, 0, r.bufs[i], room, len(f), 3)
		require.Zero(r.t, engine.ParsePacket(p, vni), "test frame %d does not parse", i)
		r.b.Append(p)
	}
	// A copy: Compact reorders the batch's own slice.
	return append([]*engine.Packet(nil), r.b.Packets()...)
}

// loadRaw fills the batch with frames without parsing them.
func (r *rig) loadRaw(frames ...[]byte) []*engine.Packet {
	r.b.Reset()
	for i, f := range frames {
		p := &r.pool[i]
		copy(r.bufs[i][headroom:], f)
		p.SetBuffer(nil, 0, r.bufs[i][:headroom+len(f)], headroom, len(f), 3)
		r.b.Append(p)
	}
	// A copy: Compact reorders the batch's own slice.
	return append([]*engine.Packet(nil), r.b.Packets()...)
}

// balanced sets the balancing decision the Encap stage reads.
func balanced(ps []*engine.Packet, r *flow.Rule, hash uint64) {
	for i, p := range ps {
		p.Rule = r
		p.Backend = 1
		p.Hash = hash + uint64(i)
	}
}

func (r *rig) run(s engine.Stage) {
	s.Process(&r.b)
	r.b.Compact()
}

// reason returns the drop reason name of p, or "" when it is live or
// emitted.
func reason(p *engine.Packet) string {
	if p.Verdict != engine.VerdictDrop {
		return ""
	}
	return p.Reason.String()
}

func data(p *engine.Packet) []byte { return append([]byte(nil), p.Data()...) }

// withDst returns a copy of frame with the Ethernet destination (and
// source, when src is not nil) replaced.
func withDst(frame []byte, dst header.MAC, src *header.MAC) []byte {
	f := append([]byte(nil), frame...)
	copy(f[0:6], dst[:])
	if src != nil {
		copy(f[6:12], src[:])
	}
	return f
}

// pseudo is the folded sum of the TCP/UDP/ICMPv6 pseudo-header over
// IPv6 (RFC 8200 8.1), by the plain RFC 1071 sum of internal/lab/gpkt.
func pseudo(src, dst []byte, proto uint8, n int) uint16 {
	return gpkt.Sum(dst, gpkt.Sum(src, gpkt.Sum([]byte{byte(n >> 8), byte(n), 0, proto}, 0)))
}

// vxlan describes an outer packet for the Decap tests; build makes it with
// gopacket.
type vxlan struct {
	src, dst netip.Addr
	sport    uint16
	dport    uint16 // default 4789
	noIFlag  bool
	vni      uint32
	proto    layers.IPProtocol // default UDP
	frag     bool
	tos      uint8
	vlan     uint16
	udpCsum  bool // compute the UDP checksum over IPv4 too
	inner    []byte
}

func (v vxlan) build() []byte {
	eth := &layers.Ethernet{SrcMAC: hw(routerMAC), DstMAC: hw(muxMAC)}
	ls := []gopacket.SerializableLayer{eth}
	et := layers.EthernetTypeIPv4
	if v.src.Is6() {
		et = layers.EthernetTypeIPv6
	}
	if v.vlan != 0 {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: v.vlan, Type: et})
	} else {
		eth.EthernetType = et
	}
	proto := v.proto
	if proto == 0 {
		proto = layers.IPProtocolUDP
	}
	var nl gopacket.NetworkLayer
	if v.src.Is4() {
		ip := &layers.IPv4{Version: 4, TTL: 64, TOS: v.tos, Flags: layers.IPv4DontFragment, Protocol: proto, SrcIP: v.src.AsSlice(), DstIP: v.dst.AsSlice()}
		if v.frag {
			ip.Flags = layers.IPv4MoreFragments
		}
		nl = ip
		ls = append(ls, ip)
	} else {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, TrafficClass: v.tos, NextHeader: proto, SrcIP: v.src.AsSlice(), DstIP: v.dst.AsSlice()}
		nl = ip
		ls = append(ls, ip)
	}
	dport := v.dport
	if dport == 0 {
		dport = 4789
	}
	u := &layers.UDP{SrcPort: layers.UDPPort(v.sport), DstPort: layers.UDPPort(dport)}
	_ = u.SetNetworkLayerForChecksum(nl)
	ls = append(ls, u, &layers.VXLAN{ValidIDFlag: !v.noIFlag, VNI: v.vni}, gopacket.Payload(v.inner))
	b := gpkt.MustSerialize(ls...)
	l3 := 14
	if v.vlan != 0 {
		l3 += 4
	}
	if v.src.Is4() && !v.udpCsum {
		binary.BigEndian.PutUint16(b[l3+20+6:], 0)
	}
	if v.src.Is6() && v.frag {
		// Insert a Fragment header (offset 0, M set) after the fixed header.
		fh := []byte{b[l3+6], 0, 0, 1, 0, 0, 0, 7}
		b[l3+6] = 44
		binary.BigEndian.PutUint16(b[l3+4:], binary.BigEndian.Uint16(b[l3+4:])+8)
		b = append(b[:l3+40], append(fh, b[l3+40:]...)...)
	}
	return b
}

// locals returns a table with the test endpoints: index 0 the DIP in
// testVNI, index 1 another endpoint.
func locals(t testing.TB) *encap.EndpointTable {
	ls, err := encap.NewEndpoints([]encap.Endpoint{
		{VNI: testVNI, MAC: dipMAC, Addrs: []netip.Addr{dip4}, OutPort: 7, Name: "vm1"},
		{VNI: testVNI + 1, MAC: dipMAC, Addrs: []netip.Addr{dip4}, OutPort: 8, Name: "vm2"},
	})
	require.NoError(t, err)
	var lt encap.EndpointTable
	lt.Store(ls)
	return &lt
}
