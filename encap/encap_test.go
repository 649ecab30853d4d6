package encap_test

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// wantEncap builds with gopacket the frame Encap must produce around inner
// (which already has its new Ethernet header).
func wantEncap(inner []byte, src, dst netip.Addr, sport uint16, tos uint8, label uint32, v6csum bool) []byte {
	eth := &layers.Ethernet{SrcMAC: make(net.HardwareAddr, 6), DstMAC: make(net.HardwareAddr, 6)}
	u := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: 4789}
	vx := &layers.VXLAN{ValidIDFlag: true, VNI: testVNI}
	var ip gopacket.SerializableLayer
	iphdr := 20
	if dst.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip4 := &layers.IPv4{Version: 4, TOS: tos, Flags: layers.IPv4DontFragment, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		_ = u.SetNetworkLayerForChecksum(ip4)
		ip = ip4
	} else {
		iphdr = 40
		eth.EthernetType = layers.EthernetTypeIPv6
		ip6 := &layers.IPv6{Version: 6, TrafficClass: tos, FlowLabel: label, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		_ = u.SetNetworkLayerForChecksum(ip6)
		ip = ip6
	}
	b := gpkt.MustSerialize(eth, ip, u, vx, gopacket.Payload(inner))
	if dst.Is4() || !v6csum {
		binary.BigEndian.PutUint16(b[14+iphdr+6:], 0)
	}
	return b
}

func newEncap(t testing.TB, cfg encap.EncapConfig) *encap.Encap {
	if !cfg.SourceV4.IsValid() && !cfg.SourceV6.IsValid() {
		cfg.SourceV4, cfg.SourceV6 = mux4, mux6
	}
	e, err := encap.NewEncap(cfg)
	require.NoError(t, err)
	return e
}

func TestEncapGolden(t *testing.T) {
	tcp := func(p pkt) pkt { p.proto = layers.IPProtocolTCP; p.size = 200; p.tos = 0xb9; return p }
	cases := []struct {
		name  string
		inner pkt
		host  netip.Addr
		zero  bool // IPv6ZeroChecksum
		hash  uint64
	}{
		{"v4-in-v4", v4pkt(), host4, false, 0x0123456789abcdef},
		{"v6-in-v4", v6pkt(), host4, false, 0xfedcba9876543210},
		{"v4-in-v6", v4pkt(), host6, false, 1},
		{"v6-in-v6", v6pkt(), host6, false, 0xffffffffffffffff},
		{"v6-in-v6 zero checksum", v6pkt(), host6, true, 42},
		{"tcp v4-in-v4 dscp ecn", tcp(v4pkt()), host4, false, 7 << 50},
		{"tcp v6-in-v6 dscp ecn", tcp(v6pkt()), host6, false, 99},
		{"tcp v4-in-v6 odd length", func() pkt { p := tcp(v4pkt()); p.size = 201; return p }(), host6, false, 3},
		{"v4-in-v4 IPv4-mapped host", v4pkt(), netip.AddrFrom16(host4.As16()), false, 5},
	}
	r := newRig(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEncap(t, encap.EncapConfig{IPv6ZeroChecksum: tc.zero})
			frame := tc.inner.build()
			rule := ruleFor(tc.inner.dst, tc.host)
			ps := r.load(0, frame)
			balanced(ps, rule, tc.hash)
			r.run(e)
			require.Equal(t, "", reason(ps[0]))
			got := data(ps[0])

			host := tc.host.Unmap()
			src := mux4
			if host.Is6() {
				src = mux6
			}
			inner := withDst(frame, dipMAC, nil)
			want := wantEncap(inner, src, host, encap.SourcePort(tc.hash), tc.inner.tos, encap.FlowLabel(tc.hash), !tc.zero)
			require.Equal(t, want, got, "encapsulated frame differs from gopacket's")

			// Decode with gopacket and check the fields one by one.
			pk := gopacket.NewPacket(got, layers.LayerTypeEthernet, gopacket.Default)
			require.Nil(t, pk.ErrorLayer())
			ls := pk.Layers()
			require.GreaterOrEqual(t, len(ls), 6)
			eth := ls[0].(*layers.Ethernet)
			assert.Equal(t, make(net.HardwareAddr, 6), eth.DstMAC, "outer MACs are NextHop's")
			var ipLen, iphdr int
			switch ip := ls[1].(type) {
			case *layers.IPv4:
				require.True(t, host.Is4())
				assert.Equal(t, layers.IPv4DontFragment, ip.Flags)
				assert.Equal(t, uint16(0), ip.Id)
				assert.Equal(t, uint8(64), ip.TTL)
				assert.Equal(t, tc.inner.tos, ip.TOS)
				assert.Equal(t, src.AsSlice(), []byte(ip.SrcIP.To4()))
				assert.Equal(t, host.AsSlice(), []byte(ip.DstIP.To4()))
				assert.Equal(t, uint16(0xffff), gpkt.Sum(got[14:34], 0), "IPv4 header checksum")
				ipLen, iphdr = int(ip.Length), 20
			case *layers.IPv6:
				require.True(t, host.Is6())
				assert.Equal(t, encap.FlowLabel(tc.hash), ip.FlowLabel)
				assert.Equal(t, tc.inner.tos, ip.TrafficClass)
				assert.Equal(t, host.AsSlice(), []byte(ip.DstIP))
				ipLen, iphdr = 40+int(ip.Length), 40
			default:
				t.Fatalf("outer layer %T", ip)
			}
			assert.Equal(t, len(got)-14, ipLen)
			u := ls[2].(*layers.UDP)
			assert.Equal(t, layers.UDPPort(4789), u.DstPort)
			assert.GreaterOrEqual(t, int(u.SrcPort), 49152)
			assert.Equal(t, encap.SourcePort(tc.hash), uint16(u.SrcPort))
			assert.Equal(t, len(got)-14-iphdr, int(u.Length))
			switch {
			case host.Is4(), tc.zero:
				assert.Zero(t, u.Checksum)
			default:
				seg := got[14+iphdr:]
				assert.Equal(t, uint16(0xffff), gpkt.Sum(seg, pseudo(got[22:38], got[38:54], 17, len(seg))), "UDP checksum over IPv6")
			}
			vx := ls[3].(*layers.VXLAN)
			assert.True(t, vx.ValidIDFlag)
			assert.Equal(t, uint32(testVNI), vx.VNI)
			assert.Equal(t, inner, vx.LayerPayload(), "inner frame: the original with the backend's MAC")
			assert.Equal(t, net.HardwareAddr(dipMAC[:]), ls[4].(*layers.Ethernet).DstMAC)
		})
	}
}

func TestSourcePort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[uint16]bool{}
	for range 200000 {
		p := encap.SourcePort(rng.Uint64())
		require.GreaterOrEqual(t, p, uint16(encap.SourcePortMin))
		seen[p] = true
	}
	// 16384 ports; 200000 random hashes leave none unused in practice.
	assert.Greater(t, len(seen), 16300, "source ports do not spread over the range")
	assert.Equal(t, uint16(49152), encap.SourcePort(0))
	assert.Equal(t, uint16(65535), encap.SourcePort(^uint64(0)))
	assert.NotEqual(t, encap.SourcePort(1<<50), encap.SourcePort(2<<50))
	assert.NotZero(t, encap.FlowLabel(0))

	// The port follows the hash of each packet.
	r := newRig(t)
	e := newEncap(t, encap.EncapConfig{})
	frames := make([][]byte, 8)
	for i := range frames {
		frames[i] = v4pkt().build()
	}
	ps := r.load(0, frames...)
	balanced(ps, ruleFor(vip4, host4), 0)
	for i, p := range ps {
		p.Hash = uint64(i) << 52
	}
	r.run(e)
	ports := map[uint16]bool{}
	for i, p := range ps {
		sp := header.UDP(p.Data()[34:]).SrcPort()
		assert.Equal(t, encap.SourcePort(uint64(i)<<52), sp)
		ports[sp] = true
	}
	assert.Len(t, ports, 8)
}

func TestEncapVLANAndPadding(t *testing.T) {
	tagged := v4pkt()
	tagged.size, tagged.vlan, tagged.pad = 2, 100, 12
	plain := tagged
	plain.vlan, plain.pad = 0, 0
	r := newRig(t)
	ps := r.load(0, tagged.build())
	balanced(ps, ruleFor(vip4, host4), 9)
	r.run(newEncap(t, encap.EncapConfig{}))
	require.Equal(t, "", reason(ps[0]))
	got := data(ps[0])
	want := plain.build()[:14+20+8+2] // gopacket pads to 60 bytes itself
	assert.Equal(t, withDst(want, dipMAC, nil), got[encap.OverheadIPv4:], "inner frame: untagged, unpadded")
	assert.Equal(t, len(got)-14, int(header.IPv4(got[14:]).TotalLength()))
}

func TestEncapInnerSrcMAC(t *testing.T) {
	src := header.MAC{0x02, 0, 0, 0, 0xcc, 0x01}
	r := newRig(t)
	frame := v6pkt().build()
	ps := r.load(0, frame)
	balanced(ps, ruleFor(vip6, host4), 9)
	r.run(newEncap(t, encap.EncapConfig{InnerSrcMAC: src}))
	require.Equal(t, "", reason(ps[0]))
	assert.Equal(t, withDst(frame, dipMAC, &src), data(ps[0])[encap.OverheadIPv4:])
}

func TestEncapDrops(t *testing.T) {
	rule := ruleFor(vip4, host4)
	cases := []struct {
		name   string
		cfg    encap.EncapConfig
		rule   *flow.Rule
		idx    int32
		room   int
		reason string
	}{
		{"no rule", encap.EncapConfig{}, nil, 1, headroom, "no_backend"},
		{"backend out of range", encap.EncapConfig{}, rule, 2, headroom, "no_backend"},
		{"negative backend", encap.EncapConfig{}, rule, -1, headroom, "no_backend"},
		{"no IPv4 source", encap.EncapConfig{SourceV6: mux6}, rule, 1, headroom, "no_tunnel_source"},
		{"no IPv6 source", encap.EncapConfig{SourceV4: mux4}, ruleFor(vip4, host6), 1, headroom, "no_tunnel_source"},
		{"host not set", encap.EncapConfig{}, ruleFor(vip4, netip.Addr{}), 1, headroom, "no_tunnel_source"},
		{"no headroom", encap.EncapConfig{}, rule, 1, encap.OverheadIPv4 - 1, "no_headroom"},
		{"just enough headroom", encap.EncapConfig{}, rule, 1, encap.OverheadIPv4, ""},
	}
	r := newRig(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ps := r.loadAt(tc.room, 0, v4pkt().build())
			ps[0].Rule, ps[0].Backend = tc.rule, tc.idx
			r.run(newEncap(t, tc.cfg))
			assert.Equal(t, tc.reason, reason(ps[0]))
		})
	}

	t.Run("not parsed", func(t *testing.T) {
		ps := r.load(0, v4pkt().build())
		ps[0].Flags = 0
		balanced(ps, rule, 0)
		r.run(newEncap(t, encap.EncapConfig{}))
		assert.Equal(t, "unsupported", reason(ps[0]))
	})
}

// TestEncapMTUBoundary: an encapsulation of exactly MTU bytes passes, one
// byte more does not.
func TestEncapMTUBoundary(t *testing.T) {
	for _, host := range []netip.Addr{host4, host6} {
		over := encap.OverheadIPv4
		if host.Is6() {
			over = encap.OverheadIPv6
		}
		for _, inner := range []pkt{v4pkt(), v6pkt()} {
			fixed := 28 // IPv4 + UDP
			if inner.src.Is6() {
				fixed = 48
			}
			r := newRig(t)
			fit, big := inner, inner
			fit.size = 1400 - over - fixed
			big.size = fit.size + 1
			ps := r.load(0, fit.build(), big.build())
			balanced(ps, ruleFor(inner.dst, host), 0)
			e := newEncap(t, encap.EncapConfig{MTU: 1400, ICMPRate: -1})
			r.run(e)
			assert.Equal(t, "", reason(ps[0]), "%v in %v: fits", inner.src, host)
			assert.Equal(t, 1400, ps[0].Len()-14)
			assert.Equal(t, "mtu_exceeded", reason(ps[1]), "%v in %v: too big", inner.src, host)
		}
	}
}

func TestEncapConfigValidate(t *testing.T) {
	bad := []encap.EncapConfig{
		{},
		{SourceV4: mux6},
		{SourceV6: mux4},
		{SourceV6: netip.AddrFrom16(mux4.As16())},
		{SourceV6: netip.MustParseAddr("fe80::1%eth0")},
		{SourceV4: mux4, MTU: encap.MinMTU - 1},
		{SourceV4: mux4, MTU: 70000},
		{SourceV4: mux4, ICMPBurst: -1},
		{SourceV4: mux4, InnerSrcMAC: header.MAC{1, 0, 0, 0, 0, 1}},
	}
	for _, c := range bad {
		assert.Error(t, c.Validate(), "%+v", c)
		_, err := encap.NewEncap(c)
		assert.Error(t, err)
	}
	good := []encap.EncapConfig{
		{SourceV4: mux4},
		{SourceV6: mux6, MTU: encap.MinMTU},
		{SourceV4: netip.AddrFrom16(mux4.As16()), MTU: 9000, ICMPRate: -1},
	}
	for _, c := range good {
		assert.NoError(t, c.Validate(), "%+v", c)
	}
	e := newEncap(t, encap.EncapConfig{SourceV4: mux4})
	c := e.Config()
	assert.Equal(t, uint16(4789), c.Port)
	assert.Equal(t, 1500, c.MTU)
	assert.Equal(t, uint8(64), c.TTL)
	assert.Equal(t, 100, c.ICMPRate)
	assert.Equal(t, 10, c.ICMPBurst)
}

func TestEncapCustomPortTTL(t *testing.T) {
	r := newRig(t)
	ps := r.load(0, v4pkt().build())
	balanced(ps, ruleFor(vip4, host4), 0)
	r.run(newEncap(t, encap.EncapConfig{Port: 8472, TTL: 9}))
	got := ps[0].Data()
	assert.Equal(t, uint16(8472), header.UDP(got[34:]).DstPort())
	assert.Equal(t, uint8(9), header.IPv4(got[14:]).TTL())
	assert.True(t, header.IPv4(got[14:]).IsChecksumValid())
}

// TestEncapDecrementTTL: with DecrementTTL the inner packet leaves with
// its TTL / hop limit one less (the inner IPv4 header checksum still
// verifying, by gopacket's and an RFC 1071 loop's reading), one arriving
// with 1 or 0 is dropped (ttl_exceeded), and a packet too big for the
// tunnel is answered quoting its TTL as it arrived.
func TestEncapDecrementTTL(t *testing.T) {
	ttl := func(p pkt, v uint8) []byte {
		b := p.build()
		if p.src.Is4() {
			b[14+8] = v
			binary.BigEndian.PutUint16(b[14+10:], 0)
			binary.BigEndian.PutUint16(b[14+10:], gpkt.Checksum(b[14:34]))
		} else {
			b[14+7] = v
		}
		return b
	}
	big4 := v4pkt()
	big4.size = 1450
	for _, tc := range []struct {
		name    string
		frame   []byte
		off     bool // DecrementTTL not set
		want    string
		wantTTL uint8
	}{
		{"v4 64", ttl(v4pkt(), 64), false, "", 63},
		{"v4 2", ttl(v4pkt(), 2), false, "", 1},
		{"v4 1", ttl(v4pkt(), 1), false, "ttl_exceeded", 0},
		{"v4 0", ttl(v4pkt(), 0), false, "ttl_exceeded", 0},
		{"v6 64", ttl(v6pkt(), 64), false, "", 63},
		{"v6 1", ttl(v6pkt(), 1), false, "ttl_exceeded", 0},
		{"off: v4 1 passes untouched", ttl(v4pkt(), 1), true, "", 1},
		{"too big", ttl(big4, 9), false, "emit", 9},
		{"too big with TTL 1", ttl(big4, 1), false, "ttl_exceeded", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			ps := r.load(0, tc.frame)
			balanced(ps, ruleFor(ps[0].Key.DstAddr(), host4), 0)
			r.run(newEncap(t, encap.EncapConfig{MTU: 1400, ICMPRate: 1e9, DecrementTTL: !tc.off}))
			p := ps[0]
			if tc.want == "emit" {
				require.Equal(t, engine.VerdictEmit, p.Verdict)
				out := data(p)
				// The quote starts 8 bytes into the ICMP message: TTL as
				// received.
				pk := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
				ic, ok := pk.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
				require.True(t, ok)
				require.Equal(t, tc.frame[14:14+len(ic.Payload)], []byte(ic.Payload), "the quote is the packet as it arrived")
				return
			}
			require.Equal(t, tc.want, reason(p))
			if tc.want != "" {
				return
			}
			out := data(p)
			pk := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
			vx, ok := pk.Layer(layers.LayerTypeVXLAN).(*layers.VXLAN)
			require.True(t, ok)
			inner := gopacket.NewPacket(vx.Payload, layers.LayerTypeEthernet, gopacket.Default)
			want := bytes.Clone(tc.frame[14:])
			got := vx.Payload[14:]
			if ip, ok := inner.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
				require.Equal(t, tc.wantTTL, ip.TTL)
				require.Zero(t, gpkt.Checksum(got[:20]), "inner IPv4 header checksum")
				want[8] = tc.wantTTL
				copy(want[10:12], got[10:12])
			} else {
				ip := inner.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
				require.Equal(t, tc.wantTTL, ip.HopLimit)
				want[7] = tc.wantTTL
			}
			require.Equal(t, want, []byte(got), "nothing else of the inner packet changes")
		})
	}
}
