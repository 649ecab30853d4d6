package nat_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// fuzzSeeds are frames of every kind the stages handle, and a few they
// refuse.
func fuzzSeeds(reply bool) [][]byte {
	var ps []pkt
	add := func(p pkt, dip netip.AddrPort) {
		if reply {
			p = p.withDst(dip).reply()
		}
		ps = append(ps, p, p.withFrag(2))
		if p.protocol() == flow.ProtoTCP {
			ps = append(ps, p.withFrag(1))
		}
	}
	add(tcp(ap(client4, 1000), ap(vipA, 80)).to(macA), ap(dipA, 8080))
	add(pkt{src: ap(client4, 1001), dst: ap(vipA, 80), syn: true}.to(macB), ap(dipB, 8080))
	add(udp(ap(client4, 1002), ap(vipA, 53)).to(macA), ap(dipA, 53))
	add(udp(ap(client4, 1003), ap(vipC, 1234)).to(macA), ap(dipA, 9000))
	add(tcp(ap(client4, 1004), ap(vipB, 22)).to(macB), ap(dipB, 22))
	add(tcp(ap(client6, 1005), ap(vip6, 443)).to(mac6), ap(dip6, 8443))
	add(udp(ap(client6, 1006), ap(vip6, 53)).to(mac6), ap(dip6, 53))
	add(tcp(ap(prober, 1007), ap(vipA, 80)).to(macA), ap(dipA, 8080))
	add(pkt{src: ap(client4, 0), dst: ap(vipA, 0), proto: flow.ProtoICMP}.to(macA), ap(dipA, 0))
	var out [][]byte
	for _, p := range ps {
		out = append(out, p.frame())
	}
	router := netip.MustParseAddr("198.18.50.1")
	if reply {
		out = append(out,
			icmpErr(dipA, client4, macGW, udp(ap(client4, 5000), ap(dipA, 53)), 0, true),
			icmpErr(dip6, client6, macGW, tcp(ap(client6, 5001), ap(dip6, 8443)), 0, true),
			icmpErr(dipA, client4, macGW, udp(ap(client4, 5000), ap(dipA, 9000)), 30, true),
			// ICMPv6 errors quoting packets with extension headers: a
			// first fragment behind destination options, a chain longer
			// than the quote's edit window, a chain cut by the quote.
			icmpErrFrame(dip6, client6, macGW, frameExt6(udp(ap(client6, 5002), ap(dip6, 53)), gpkt.DestOpts6, firstFrag6), 0, true),
			icmpErrFrame(dip6, client6, macGW, frameExt6(tcp(ap(client6, 5001), ap(dip6, 8443)), gpkt.DestOpts6, gpkt.DestOpts6, firstFrag6), 0, true),
			icmpErrFrame(dip6, client6, macGW, frameExt6(udp(ap(client6, 5002), ap(dip6, 53)), gpkt.DestOpts6, firstFrag6), 40+12, true))
	} else {
		out = append(out,
			icmpErr(router, vipA, macA, tcp(ap(vipA, 80), ap(client4, 1000)), 0, false),
			icmpErr(router, vipA, macA, tcp(ap(vipA, 80), ap(client4, 1000)), 28, false),
			icmpErr(netip.MustParseAddr("2001:db8:50::1"), vip6, mac6, udp(ap(vip6, 53), ap(client6, 1006)), 0, false),
			icmpErrFrame(netip.MustParseAddr("2001:db8:50::1"), vip6, mac6, frameExt6(tcp(ap(vip6, 443), ap(client6, 1005)), gpkt.DestOpts6, firstFrag6), 0, false),
			icmpErrFrame(netip.MustParseAddr("2001:db8:50::1"), vip6, mac6, frameExt6(udp(ap(vip6, 53), ap(client6, 1006)), gpkt.DestOpts6, gpkt.DestOpts6, firstFrag6), 0, false),
			icmpErrFrame(netip.MustParseAddr("2001:db8:50::1"), vip6, mac6, frameExt6(tcp(ap(vip6, 443), ap(client6, 1005)), gpkt.DestOpts6, firstFrag6), 40+12, false))
	}
	f := out[0]
	out = append(out, f[:len(f)-1], f[:34], []byte{}, make([]byte, 60))
	return out
}

// checksumsValid reports whether every checksum of the parsed packet p
// verifies: the IPv4 header's, and (for an unfragmented packet without IPv6
// extension headers) the TCP, UDP, ICMP or ICMPv6 checksum over the whole
// segment. A zero UDP checksum is valid over IPv4 only.
func checksumsValid(p *engine.Packet) bool {
	d := p.Data()
	var src, dst []byte
	var end int
	if p.Flags&engine.FlagIPv4 != 0 {
		ip := header.IPv4(p.L3())
		if !ip.IsChecksumValid() {
			return false
		}
		src, dst, end = ip.SrcSlice(), ip.DstSlice(), int(p.L3Off)+int(ip.TotalLength())
	} else {
		ip := header.IPv6(p.L3())
		if int(p.L4Off)-int(p.L3Off) != header.IPv6Size {
			return true
		}
		src, dst, end = ip.SrcSlice(), ip.DstSlice(), int(p.L3Off)+header.IPv6Size+int(ip.PayloadLength())
	}
	if p.Flags&engine.FlagFragment != 0 || p.Flags&engine.FlagL4 == 0 {
		return true
	}
	seg := d[p.L4Off:end]
	switch p.L4Proto {
	case flow.ProtoTCP:
		return header.TCP(seg).IsChecksumValid(header.PseudoHeaderChecksum(flow.ProtoTCP, src, dst, uint16(len(seg))))
	case flow.ProtoUDP:
		u := header.UDP(seg)
		u = u[:u.Length()]
		if u.Checksum() == 0 {
			return p.Flags&engine.FlagIPv4 != 0
		}
		return u.IsChecksumValid(header.PseudoHeaderChecksum(flow.ProtoUDP, src, dst, uint16(len(u))))
	case flow.ProtoICMP:
		return header.ICMPv4(seg).IsChecksumValid()
	case flow.ProtoICMPv6:
		return header.ICMPv6(seg).IsChecksumValid(header.PseudoHeaderChecksum(flow.ProtoICMPv6, src, dst, uint16(len(seg))))
	}
	return true
}

// fuzzStage runs frame through stage and checks what came out: no panic; a
// forwarded frame parses again to the key the stage left in the packet; its
// checksums verify when the input's did; replies leave on the uplink.
func fuzzStage(t *testing.T, stage engine.Stage, frame []byte, isReturn bool) {
	buf := make([]byte, engine.DefaultHeadroom+len(frame)+64)
	copy(buf[engine.DefaultHeadroom:], frame)
	var p engine.Packet
	p.SetBuffer(nil, 0, buf, engine.DefaultHeadroom, len(frame), 3)
	if engine.ParsePacket(&p, vni) != 0 {
		return
	}
	valid := checksumsValid(&p)
	var b engine.Batch
	b.Append(&p)
	stage.Process(&b)
	b.Compact()
	if b.Len() == 0 {
		require.NotEqual(t, engine.DropUnsupported, p.Reason, "a parsed packet the rewrite refused")
		return
	}
	out := append([]byte(nil), p.Data()...)
	var q engine.Packet
	q.SetBuffer(nil, 0, out, 0, len(out), 0)
	require.Zero(t, engine.ParsePacket(&q, vni), "translated frame does not parse")
	require.Equal(t, p.Key, q.Key, "key and bytes disagree")
	if valid {
		require.True(t, checksumsValid(&q), "checksums broken by the translation")
	}
	if isReturn {
		require.EqualValues(t, uplink, p.OutPort)
	}
}

func FuzzInbound(f *testing.F) {
	for _, s := range fuzzSeeds(false) {
		f.Add(s)
	}
	e := newEnv(f, testRules(), testLocals())
	f.Fuzz(func(t *testing.T, frame []byte) {
		fuzzStage(t, e.in, frame, false)
	})
}

func FuzzReturn(f *testing.F) {
	e := newEnv(f, testRules(), testLocals())
	// State for half the seeds' connections, so that both the stateful
	// and the stateless paths are fuzzed.
	for i, s := range fuzzSeeds(false) {
		if i%2 == 0 {
			var p engine.Packet
			buf := append([]byte(nil), s...)
			p.SetBuffer(nil, 0, buf, 0, len(buf), 0)
			if engine.ParsePacket(&p, vni) == 0 {
				var b engine.Batch
				b.Append(&p)
				e.in.Process(&b)
			}
		}
	}
	for _, s := range fuzzSeeds(true) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		fuzzStage(t, e.ret, frame, true)
	})
}
