package encap_test

import (
	"net/netip"
	"testing"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
)

// runBench runs stage over fx's batch b.N times and reports ns per packet.
// Restoring the batch (packet metadata only; the stages measured here leave
// the frame bytes reusable) is included; it is a struct copy per packet.
func runBench(b *testing.B, fx *fixture, stage engine.Stage) {
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		stage.Process(fx.reset())
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(fx.frames)), "ns/pkt")
}

func BenchmarkEncap(b *testing.B) {
	small4, small6 := v4pkt(), v6pkt()
	small4.proto, small6.proto = 6, 6 // a TCP ACK with a little data
	big4, big6 := small4, small6
	big4.size, big6.size = 1350, 1350 // fits a 1500-byte MTU over IPv6
	cases := []struct {
		name  string
		frame []byte
		host  netip.Addr
		cfg   encap.EncapConfig
	}{
		{"v4-in-v4/small", small4.build(), host4, encap.EncapConfig{}},
		{"v4-in-v4/1350B", big4.build(), host4, encap.EncapConfig{}},
		{"v6-in-v6/small", small6.build(), host6, encap.EncapConfig{}},
		{"v6-in-v6/1350B", big6.build(), host6, encap.EncapConfig{}},
		{"v6-in-v6/1350B-zero-csum", big6.build(), host6, encap.EncapConfig{IPv6ZeroChecksum: true}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			e := newEncap(b, tc.cfg)
			fx := newFixture(b, repeat(tc.frame, engine.MaxBatch), true, func(ps []*engine.Packet) {
				r := ruleFor(ps[0].Key.DstAddr(), tc.host)
				for i, p := range ps {
					p.Rule, p.Backend, p.Hash = r, 1, uint64(i)*0x9e3779b97f4a7c15
				}
			})
			runBench(b, fx, e)
		})
	}
}

func BenchmarkDecap(b *testing.B) {
	small, big := v4pkt(), v4pkt()
	small.proto = 6
	big.size = 1400
	cases := []struct {
		name string
		v    vxlan
		cfg  encap.DecapConfig
	}{
		{"v4-outer/small", vxlan{src: mux4, dst: host4, vni: testVNI, inner: withDst(small.build(), dipMAC, nil)}, encap.DecapConfig{}},
		{"v6-outer/small", vxlan{src: mux6, dst: host6, vni: testVNI, inner: withDst(small.build(), dipMAC, nil)}, encap.DecapConfig{}},
		{"v6-outer/1400B", vxlan{src: mux6, dst: host6, vni: testVNI, inner: withDst(big.build(), dipMAC, nil)}, encap.DecapConfig{}},
		{"v6-outer/1400B-verify-csum", vxlan{src: mux6, dst: host6, vni: testVNI, inner: withDst(big.build(), dipMAC, nil)}, encap.DecapConfig{VerifyUDPChecksum: true}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			d := newDecap(b, tc.cfg, nil)
			fx := newFixture(b, repeat(tc.v.build(), engine.MaxBatch), false, nil)
			runBench(b, fx, d)
		})
	}
}
