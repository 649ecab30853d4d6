package nexthop_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/nexthop"
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
	hostB   = netip.MustParseAddr("198.19.2.3")
	outside = netip.MustParseAddr("198.19.2.4") // resolves through an interface without a port

	routerMAC = header.MAC{0x02, 0, 0, 0, 0, 0x01}
	muxMAC    = header.MAC{0x02, 0, 0, 0, 0, 0x02}
	hopMAC    = header.MAC{0x02, 0, 0, 0, 0xbb, 0x01}
)

func hw(m header.MAC) net.HardwareAddr { return net.HardwareAddr(m[:]) }

// ipLayers returns an IPv4 or IPv6 header from src to dst (by dst's
// family) carrying proto, and its EtherType.
func ipLayers(src, dst netip.Addr, proto layers.IPProtocol) (gopacket.SerializableLayer, layers.EthernetType) {
	if dst.Is4() {
		return &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}, layers.EthernetTypeIPv4
	}
	return &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}, layers.EthernetTypeIPv6
}

// tunnel returns what a Mux's Encap stage hands to NextHop: a VXLAN packet
// to host behind an untagged Ethernet header with zero addresses.
func tunnel(t testing.TB, host netip.Addr) []byte {
	src := mux4
	if host.Is6() {
		src = mux6
	}
	ip, et := ipLayers(src, host, layers.IPProtocolUDP)
	inner := reply(t, vip4, client4, 0)
	zero := make(net.HardwareAddr, 6) // for the stage to fill
	return gpkt.Serialize(t, &layers.Ethernet{SrcMAC: zero, DstMAC: zero, EthernetType: et}, ip,
		&layers.UDP{SrcPort: 50000, DstPort: 4789}, &layers.VXLAN{ValidIDFlag: true, VNI: 0x12345}, gopacket.Payload(inner))
}

// reply returns a UDP datagram from src to dst as a VM sends it on the
// Host Agent's return path, behind a VLAN tag when vlan is not 0.
func reply(t testing.TB, src, dst netip.Addr, vlan uint16) []byte {
	ip, et := ipLayers(src, dst, layers.IPProtocolUDP)
	eth := &layers.Ethernet{SrcMAC: hw(routerMAC), DstMAC: hw(muxMAC), EthernetType: et}
	ls := []gopacket.SerializableLayer{eth}
	if vlan != 0 {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: vlan, Type: et})
	}
	return gpkt.Serialize(t, append(ls, ip, &layers.UDP{SrcPort: 80, DstPort: 40000}, gopacket.Payload("0123456789"))...)
}

// fakeResolver is a nexthop.Static that counts lookups and, unlike
// Static, is not versioned: the stage looks its answers up again every
// batch.
type fakeResolver struct {
	static nexthop.Static // a field, not embedded: its Version must not be promoted
	calls  int
}

func (f *fakeResolver) Lookup(a netip.Addr) (nexthop.Hop, bool) {
	f.calls++
	return f.static.Lookup(a)
}

func newResolver() *fakeResolver {
	return &fakeResolver{static: nexthop.Static{Hops: map[netip.Addr]nexthop.Hop{
		host4:   {IfIndex: 4, SrcMAC: muxMAC, DstMAC: hopMAC},
		hostB:   {IfIndex: 5, SrcMAC: header.MAC{2, 0, 0, 0, 0, 5}, DstMAC: header.MAC{2, 0, 0, 0, 0xbb, 5}},
		host6:   {IfIndex: 4, SrcMAC: muxMAC, DstMAC: hopMAC},
		client4: {IfIndex: 4, SrcMAC: muxMAC, DstMAC: routerMAC},
		client6: {IfIndex: 4, SrcMAC: muxMAC, DstMAC: routerMAC},
		outside: {IfIndex: 99},
	}}}
}

func newNextHop(t testing.TB, mode nexthop.Mode, r nexthop.Source) *nexthop.Stage {
	s, err := nexthop.NewStage(nexthop.StageConfig{Mode: mode, Ports: map[int]uint16{4: 0, 5: 1}}, r)
	require.NoError(t, err)
	return s
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

// load empties the batch and fills it with frames, parsed.
func (r *rig) load(frames ...[]byte) []*engine.Packet {
	ps := r.loadRaw(frames...)
	for i, p := range ps {
		require.Zero(r.t, engine.ParsePacket(p, 0), "test frame %d does not parse", i)
	}
	return ps
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

// fixture is a full batch that can be put back as it was before a stage
// ran, without allocating: the packets' metadata is restored from
// templates (NextHop writes only the Ethernet addresses, the same ones
// every time).
type fixture struct {
	r      *rig
	frames [][]byte
	tmpl   [engine.MaxBatch]engine.Packet
}

func newFixture(tb testing.TB, frames [][]byte, parse bool) *fixture {
	fx := &fixture{r: newRig(tb), frames: frames}
	if parse {
		fx.r.load(frames...)
	} else {
		fx.r.loadRaw(frames...)
	}
	for i := range frames {
		fx.tmpl[i] = fx.r.pool[i]
	}
	return fx
}

func (fx *fixture) reset() *engine.Batch {
	b := &fx.r.b
	b.Reset()
	for i := range fx.frames {
		fx.r.pool[i] = fx.tmpl[i]
		b.Append(&fx.r.pool[i])
	}
	return b
}

func repeat(f []byte, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = f
	}
	return out
}
