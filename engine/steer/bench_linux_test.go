//go:build linux

package steer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkProgram times the program in the kernel (BPF_PROG_RUN with
// repeat, so no syscall per packet) for typical packets on each role. The
// "ns/pkt" metric is the kernel's average per run; compare cases within a
// run, not across machines.
func BenchmarkProgram(b *testing.B) {
	muxOnly := Config{Dst: goldenCfg.Dst[:1]} // one VIP:port, the common Mux case
	cases := []struct {
		name  string
		cfg   Config
		frame []byte
	}{
		{"mux/vip-hit", muxOnly, tcp(client4, vipPort4, 40000, 80).frame(b)},
		{"mux/miss", muxOnly, tcp(client4, client4, 40000, 22).frame(b)},
		{"all-roles/miss", goldenCfg, tcp(client4, client4, 40000, 22).frame(b)},
		{"all-roles/vip6-hit", goldenCfg, tcp(client6, vipPort6, 40000, 443).frame(b)},
		{"all-roles/vxlan-hit", goldenCfg, vxlanFrame(b, client4, hostVX4, 4789)},
		{"all-roles/src-hit", goldenCfg, tcp(dipPort4, client4, 8080, 40000).frame(b)},
		{"all-roles/src-infra", goldenCfg, tcp(dipPort4, prober4, 8080, 40000).frame(b)},
		{"arp", goldenCfg, arpFrame(b, false)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			p := loadOrSkip(b, Options{})
			require.NoError(b, p.Sync(c.cfg))
			require.NoError(b, p.RegisterSocket(0, xskFD(b)))
			b.ResetTimer()
			_, per, err := p.objs.XdpSteer.Benchmark(c.frame, b.N, nil)
			require.NoError(b, err)
			b.ReportMetric(float64(per.Nanoseconds()), "ns/pkt")
		})
	}
}
