package encap_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

func newDecap(t testing.TB, cfg encap.DecapConfig, lt *encap.EndpointTable) *encap.Decap {
	if cfg.Addrs == nil {
		cfg.Addrs = []netip.Addr{host4, host6}
	}
	if lt == nil {
		lt = locals(t)
	}
	d, err := encap.NewDecap(cfg, lt)
	require.NoError(t, err)
	return d
}

// TestDecapRoundTrip: what Encap sends, Decap delivers: the inner frame
// exactly as received by the Mux but for its Ethernet destination (and
// VLAN tags and padding, which stay on the Mux's uplink), parsed with the
// VNI, on the endpoint's port.
func TestDecapRoundTrip(t *testing.T) {
	var inners []pkt
	for _, base := range []pkt{v4pkt(), v6pkt()} {
		udp, tcp, icmp := base, base, base
		tcp.proto, tcp.size = layers.IPProtocolTCP, 1000
		icmp.proto, icmp.icmpType = layers.IPProtocolICMPv4, 8
		if base.src.Is6() {
			icmp.proto, icmp.icmpType = layers.IPProtocolICMPv6, 128
		}
		tagged := udp
		tagged.vlan, tagged.pad = 3, 5
		ecn := tcp
		ecn.tos = 0x2b // DSCP 10, ECT(1)
		inners = append(inners, udp, tcp, icmp, tagged, ecn)
	}
	d := newDecap(t, encap.DecapConfig{VerifyUDPChecksum: true}, nil)
	r := newRig(t)
	for _, host := range []netip.Addr{host4, host6} {
		for _, zero := range []bool{false, true} {
			if zero && host.Is4() {
				continue
			}
			e := newEncap(t, encap.EncapConfig{IPv6ZeroChecksum: zero})
			for _, in := range inners {
				name := fmt.Sprintf("%v proto %d vlan %d in %v zero %v", in.src, in.proto, in.vlan, host, zero)
				t.Run(name, func(t *testing.T) {
					frame := in.build()
					want := r.load(testVNI, frame)[0].Key

					ps := r.load(0, frame)
					balanced(ps, ruleFor(in.dst, host), 77)
					r.run(e)
					require.Equal(t, "", reason(ps[0]))
					tunnelled := data(ps[0])

					ps = r.loadRaw(tunnelled)
					r.run(d)
					p := ps[0]
					require.Equal(t, "", reason(p))
					plain := in
					plain.vlan, plain.pad = 0, 0
					orig := plain.build()
					orig = orig[:len(tunnelled)-map[bool]int{true: encap.OverheadIPv4, false: encap.OverheadIPv6}[host.Is4()]]
					assert.Equal(t, withDst(orig, dipMAC, nil), data(p))
					assert.Equal(t, want, p.Key, "inner flow with the VNI")
					assert.Equal(t, uint16(7), p.OutPort)
					assert.Equal(t, int32(0), p.Backend)
					assert.Nil(t, p.Rule)
					l, ok := locals(t).Load().Of(p)
					require.True(t, ok)
					assert.Equal(t, "vm1", l.Name)
				})
			}
		}
	}
}

// fix4 recomputes the outer IPv4 header checksum of an untagged frame.
func fix4(f []byte) []byte {
	ip := header.IPv4(f[14:])
	ip.SetChecksum(ip.CalculateChecksum())
	return f
}

func TestDecapDrops(t *testing.T) {
	inner := withDst(v4pkt().build(), dipMAC, nil)
	base := vxlan{src: mux4, dst: host4, sport: 50000, vni: testVNI, inner: inner}
	with := func(f func(*vxlan)) []byte { v := base; f(&v); return v.build() }
	patch := func(fr []byte, f func([]byte)) []byte { fr = append([]byte(nil), fr...); f(fr); return fr }
	ok := base.build()

	cases := []struct {
		name   string
		frame  []byte
		cfg    encap.DecapConfig
		reason string
		port   uint16
	}{
		{"IPv4 outer", ok, encap.DecapConfig{}, "", 7},
		{"IPv6 outer", with(func(v *vxlan) { v.src, v.dst = mux6, host6 }), encap.DecapConfig{}, "", 7},
		{"tagged outer", with(func(v *vxlan) { v.vlan = 10 }), encap.DecapConfig{}, "", 7},
		{"other VNI, same MAC", with(func(v *vxlan) { v.vni = testVNI + 1 }), encap.DecapConfig{}, "", 8},
		{"reserved VXLAN bits ignored", patch(ok, func(f []byte) { f[42] |= 0x80; f[45] = 0xff; f[49] = 0xff }), encap.DecapConfig{}, "", 7},
		{"outer padding", append(append([]byte(nil), ok...), 0, 0, 0, 0), encap.DecapConfig{}, "", 7},
		{"IPv4-mapped host address", ok, encap.DecapConfig{Addrs: []netip.Addr{netip.AddrFrom16(host4.As16())}}, "", 7},
		{"UDP checksum verified", with(func(v *vxlan) { v.udpCsum = true }), encap.DecapConfig{VerifyUDPChecksum: true}, "", 7},
		{"zero UDP checksum accepted", ok, encap.DecapConfig{VerifyUDPChecksum: true}, "", 7},
		{"source allowed", ok, encap.DecapConfig{Sources: []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}}, "", 7},

		{"not IP", patch(ok, func(f []byte) { f[12], f[13] = 0x08, 0x06 }), encap.DecapConfig{}, "not_ip", 0},
		{"three VLAN tags", patch(with(func(v *vxlan) { v.vlan = 10 }), func(f []byte) { f[16], f[17], f[20], f[21] = 0x81, 0x00, 0x81, 0x00 }), encap.DecapConfig{}, "bad_l2", 0},
		{"bad IPv4 version", fix4(patch(ok, func(f []byte) { f[14] = 0x55 })), encap.DecapConfig{}, "bad_ipv4", 0},
		{"bad IPv6 version", patch(with(func(v *vxlan) { v.src, v.dst = mux6, host6 }), func(f []byte) { f[14] = 0x45 }), encap.DecapConfig{}, "bad_ipv6", 0},
		{"bad IPv4 header checksum", patch(ok, func(f []byte) { f[24] ^= 1 }), encap.DecapConfig{}, "bad_outer_checksum", 0},
		{"bad UDP checksum", patch(with(func(v *vxlan) { v.udpCsum = true }), func(f []byte) { f[40] ^= 1 }), encap.DecapConfig{VerifyUDPChecksum: true}, "bad_outer_checksum", 0},
		{"bad UDP checksum IPv6", patch(with(func(v *vxlan) { v.src, v.dst = mux6, host6 }), func(f []byte) { f[60] ^= 1 }), encap.DecapConfig{VerifyUDPChecksum: true}, "bad_outer_checksum", 0},
		{"not our IPv4 address", with(func(v *vxlan) { v.dst = hostB }), encap.DecapConfig{}, "not_local", 0},
		{"not our IPv6 address", with(func(v *vxlan) { v.src, v.dst = mux6, netip.MustParseAddr("2001:db8:2::3") }), encap.DecapConfig{}, "not_local", 0},
		{"IPv4 fragment", with(func(v *vxlan) { v.frag = true }), encap.DecapConfig{}, "vxlan_fragment", 0},
		{"IPv6 fragment", with(func(v *vxlan) { v.src, v.dst, v.frag = mux6, host6, true }), encap.DecapConfig{}, "vxlan_fragment", 0},
		{"TCP", with(func(v *vxlan) { v.proto = layers.IPProtocolTCP }), encap.DecapConfig{}, "not_vxlan", 0},
		{"wrong UDP port", with(func(v *vxlan) { v.dport = 4790 }), encap.DecapConfig{}, "not_vxlan", 0},
		{"configured port", with(func(v *vxlan) { v.dport = 4790 }), encap.DecapConfig{Port: 4790}, "", 7},
		{"source not allowed", ok, encap.DecapConfig{Sources: []netip.Prefix{netip.MustParsePrefix("198.18.2.0/24"), netip.MustParsePrefix("2001:db8:1::/48")}}, "bad_tunnel_source", 0},
		{"IPv6 source not allowed", with(func(v *vxlan) { v.src, v.dst = mux6, host6 }), encap.DecapConfig{Sources: []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}}, "bad_tunnel_source", 0},
		{"UDP length short of IP payload", patch(ok, func(f []byte) { binary.BigEndian.PutUint16(f[38:], binary.BigEndian.Uint16(f[38:])-1) }), encap.DecapConfig{}, "bad_l4", 0},
		{"UDP length past IP payload", patch(ok, func(f []byte) { binary.BigEndian.PutUint16(f[38:], binary.BigEndian.Uint16(f[38:])+1) }), encap.DecapConfig{}, "truncated", 0},
		{"UDP length below 8", patch(ok, func(f []byte) { binary.BigEndian.PutUint16(f[38:], 7) }), encap.DecapConfig{}, "bad_l4", 0},
		{"no VXLAN header", fix4(patch(ok[:14+20+8+4], func(f []byte) {
			binary.BigEndian.PutUint16(f[16:], 20+8+4)
			binary.BigEndian.PutUint16(f[38:], 8+4)
		})), encap.DecapConfig{}, "bad_vxlan", 0},
		{"I flag clear", with(func(v *vxlan) { v.noIFlag = true }), encap.DecapConfig{}, "bad_vxlan", 0},
		{"inner shorter than Ethernet", with(func(v *vxlan) { v.inner = inner[:13] }), encap.DecapConfig{}, "truncated", 0},
		{"unknown VNI", with(func(v *vxlan) { v.vni = 99 }), encap.DecapConfig{}, "unknown_local", 0},
		{"unknown MAC", with(func(v *vxlan) { v.inner = withDst(inner, hopMAC, nil) }), encap.DecapConfig{}, "unknown_local", 0},
		{"inner not IP", with(func(v *vxlan) { v.inner = patch(inner, func(f []byte) { f[12] = 0x99 }) }), encap.DecapConfig{}, "not_ip", 0},
		{"inner bad IPv4", with(func(v *vxlan) { v.inner = patch(inner, func(f []byte) { f[14] = 0x35 }) }), encap.DecapConfig{}, "bad_ipv4", 0},
		{"inner truncated", with(func(v *vxlan) { v.inner = inner[:30] }), encap.DecapConfig{}, "truncated", 0},
	}
	r := newRig(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDecap(t, tc.cfg, nil)
			ps := r.loadRaw(tc.frame)
			r.run(d)
			require.Equal(t, tc.reason, reason(ps[0]))
			if tc.reason == "" {
				assert.Equal(t, tc.port, ps[0].OutPort)
				assert.Equal(t, dipMAC, header.Ethernet(ps[0].Data()).Dst())
				assert.NotZero(t, ps[0].Flags&engine.FlagIPv4)
			}
		})
	}

	t.Run("no locals published", func(t *testing.T) {
		d := newDecap(t, encap.DecapConfig{}, new(encap.EndpointTable))
		ps := r.loadRaw(ok)
		r.run(d)
		assert.Equal(t, "unknown_local", reason(ps[0]))
	})
}

// TestDecapTruncated cuts valid tunnel frames at every length: each cut is
// dropped as truncated, never parsed, never a panic.
func TestDecapTruncated(t *testing.T) {
	inner := withDst(v6pkt().build(), dipMAC, nil)
	d := newDecap(t, encap.DecapConfig{VerifyUDPChecksum: true}, nil)
	r := newRig(t)
	for _, v := range []vxlan{
		{src: mux4, dst: host4, vni: testVNI, inner: inner},
		{src: mux6, dst: host6, vni: testVNI, inner: inner},
		{src: mux4, dst: host4, vni: testVNI, inner: inner, vlan: 5},
	} {
		f := v.build()
		for n := 0; n < len(f); n++ {
			ps := r.loadRaw(f[:n])
			r.run(d)
			require.Equal(t, "truncated", reason(ps[0]), "cut at %d of %d", n, len(f))
		}
		ps := r.loadRaw(f)
		r.run(d)
		require.Equal(t, "", reason(ps[0]))
	}
}

// TestDecapECN checks RFC 6040's decapsulation table for both inner
// families.
func TestDecapECN(t *testing.T) {
	const notECT, ect1, ect0, ce = 0, 1, 2, 3
	cases := []struct {
		inner, outer uint8
		want         int // -1: dropped
	}{
		{notECT, notECT, notECT}, {notECT, ect0, notECT}, {notECT, ect1, notECT}, {notECT, ce, -1},
		{ect0, notECT, ect0}, {ect0, ect0, ect0}, {ect0, ect1, ect1}, {ect0, ce, ce},
		{ect1, notECT, ect1}, {ect1, ect0, ect1}, {ect1, ect1, ect1}, {ect1, ce, ce},
		{ce, notECT, ce}, {ce, ect0, ce}, {ce, ect1, ce}, {ce, ce, ce},
	}
	d := newDecap(t, encap.DecapConfig{}, nil)
	r := newRig(t)
	for _, base := range []pkt{v4pkt(), v6pkt()} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%v inner %d outer %d", base.src, tc.inner, tc.outer), func(t *testing.T) {
				in := base
				in.tos = 0xa0 | tc.inner // DSCP 40 kept
				v := vxlan{src: mux6, dst: host6, vni: testVNI, tos: 0x48 | tc.outer, inner: withDst(in.build(), dipMAC, nil)}
				ps := r.loadRaw(v.build())
				r.run(d)
				if tc.want < 0 {
					require.Equal(t, "ecn_ce_not_ect", reason(ps[0]))
					return
				}
				require.Equal(t, "", reason(ps[0]))
				got := ps[0].Data()
				if base.src.Is4() {
					ip := header.IPv4(got[14:])
					assert.Equal(t, uint8(0xa0|tc.want), ip.TOS())
					assert.Equal(t, uint16(0xffff), gpkt.Sum(got[14:34], 0), "inner IPv4 checksum")
				} else {
					assert.Equal(t, uint8(0xa0|tc.want), header.IPv6(got[14:]).TrafficClass())
					assert.Equal(t, uint32(0x12345), header.IPv6(got[14:]).FlowLabel())
				}
			})
		}
	}
}

func TestDecapConfig(t *testing.T) {
	lt := locals(t)
	for _, c := range []encap.DecapConfig{
		{},
		{Addrs: []netip.Addr{{}}},
		{Addrs: []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}},
		{Addrs: []netip.Addr{host4}, Sources: []netip.Prefix{{}}},
	} {
		assert.Error(t, c.Validate(), "%+v", c)
		_, err := encap.NewDecap(c, lt)
		assert.Error(t, err)
	}
	_, err := encap.NewDecap(encap.DecapConfig{Addrs: []netip.Addr{host4}}, nil)
	assert.Error(t, err)
	d, err := encap.NewDecap(encap.DecapConfig{Addrs: []netip.Addr{host4}}, lt)
	require.NoError(t, err)
	assert.Equal(t, uint16(4789), d.Config().Port)
}
