package encap_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// decapSeeds are valid tunnel frames of every outer/inner family pair and
// a few near misses.
func decapSeeds() [][]byte {
	var out [][]byte
	for _, in := range []pkt{v4pkt(), v6pkt()} {
		inner := withDst(in.build(), dipMAC, nil)
		for _, v := range []vxlan{
			{src: mux4, dst: host4, vni: testVNI, inner: inner},
			{src: mux6, dst: host6, vni: testVNI, inner: inner},
			{src: mux4, dst: host4, vni: testVNI, inner: inner, vlan: 9},
			{src: mux6, dst: host6, vni: testVNI, inner: inner, tos: 3},
			{src: mux6, dst: host6, vni: testVNI, inner: inner, frag: true},
			{src: mux4, dst: host4, vni: testVNI + 1, inner: inner, noIFlag: true},
		} {
			f := v.build()
			out = append(out, f, f[:len(f)/2])
		}
	}
	return append(out, nil, []byte{1, 2, 3})
}

// FuzzDecap: whatever the bytes, Decap never panics or reads past the
// frame (the buffer ends where the frame does), and every frame is either
// dropped with a reason or delivered as a parsed inner frame for a known
// endpoint.
func FuzzDecap(f *testing.F) {
	for _, s := range decapSeeds() {
		f.Add(s, false)
	}
	lt := locals(f)
	plain := newDecap(f, encap.DecapConfig{}, lt)
	strict := newDecap(f, encap.DecapConfig{VerifyUDPChecksum: true}, lt)
	f.Fuzz(func(t *testing.T, frame []byte, verify bool) {
		d := plain
		if verify {
			d = strict
		}
		buf := make([]byte, headroom+len(frame))
		copy(buf[headroom:], frame)
		var p engine.Packet
		p.SetBuffer(nil, 0, buf, headroom, len(frame), 3)
		var b engine.Batch
		b.Append(&p)
		d.Process(&b)
		if p.Verdict == engine.VerdictDrop {
			require.NotZero(t, p.Reason)
			return
		}
		require.Equal(t, engine.VerdictTX, p.Verdict)
		require.NotZero(t, p.Flags&(engine.FlagIPv4|engine.FlagIPv6), "delivered but not parsed")
		require.LessOrEqual(t, p.Len()+encap.OverheadIPv4, len(frame))
		l, ok := lt.Load().Of(&p)
		require.True(t, ok, "delivered to no endpoint")
		require.Equal(t, l.OutPort, p.OutPort)
		require.Equal(t, l.VNI, p.Key.VNI)
		k := p.Key
		require.Zero(t, engine.ParsePacket(&p, l.VNI))
		require.Equal(t, k, p.Key)
	})
}

// FuzzEncapDecapRoundTrip: any frame the parser accepts goes through Encap
// and Decap unchanged but for its Ethernet header (destination the
// backend's MAC, tags and padding removed), with the same flow key.
func FuzzEncapDecapRoundTrip(f *testing.F) {
	for _, in := range []pkt{v4pkt(), v6pkt(), {src: client4, dst: vip4, size: 3, vlan: 4, pad: 9}, {src: client6, dst: vip6, size: 900, tos: 0x3}} {
		f.Add(in.build(), uint64(12345), uint32(testVNI), false, false)
		f.Add(in.build(), uint64(1)<<63, uint32(0), true, true)
	}
	f.Fuzz(func(t *testing.T, frame []byte, hash uint64, vni uint32, overV6, zero bool) {
		if len(frame) > 2000 {
			return
		}
		vni &= 1<<24 - 1
		buf := make([]byte, 4096)
		copy(buf[headroom:], frame)
		var p engine.Packet
		p.SetBuffer(nil, 0, buf, headroom, len(frame), 0)
		if engine.ParsePacket(&p, 0) != 0 {
			return
		}
		key := p.Key
		key.VNI = vni
		l3 := int(p.L3Off)
		var l3len int
		if p.Flags&engine.FlagIPv4 != 0 {
			l3len = int(header.IPv4(frame[l3:]).TotalLength())
		} else {
			l3len = header.IPv6Size + int(header.IPv6(frame[l3:]).PayloadLength())
		}
		want := make([]byte, header.EthernetSize, header.EthernetSize+l3len)
		header.Ethernet(want).Encode(dipMAC, header.Ethernet(frame).Src(), p.EtherType)
		want = append(want, frame[l3:l3+l3len]...)

		host := host4
		if overV6 {
			host = host6
		}
		rule := &flow.Rule{VIP: flow.VIP{VNI: vni}, Backends: []flow.Backend{{}, {Host: host, MAC: dipMAC}}}
		p.Rule, p.Backend, p.Hash = rule, 1, hash
		e := newEncap(t, encap.EncapConfig{MTU: 9000, IPv6ZeroChecksum: zero})
		var b engine.Batch
		b.Append(&p)
		e.Process(&b)
		require.Equal(t, engine.VerdictTX, p.Verdict, "encap dropped: %v", p.Reason)

		ls, err := encap.NewEndpoints([]encap.Endpoint{{VNI: vni, MAC: dipMAC, Addrs: []netip.Addr{dip4}, OutPort: 5}})
		require.NoError(t, err)
		var lt encap.EndpointTable
		lt.Store(ls)
		d := newDecap(t, encap.DecapConfig{VerifyUDPChecksum: true}, &lt)
		b.Reset()
		b.Append(&p)
		d.Process(&b)
		require.Equal(t, engine.VerdictTX, p.Verdict, "decap dropped: %v", p.Reason)
		require.Equal(t, want, p.Data())
		require.Equal(t, key, p.Key)
		require.Equal(t, uint16(5), p.OutPort)
	})
}
