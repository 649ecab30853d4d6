package flowtest_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/flow/flowtest"
)

var targets = flowtest.Targets{
	TCP4:   netip.MustParseAddrPort("198.19.255.1:80"),
	UDP4:   netip.MustParseAddrPort("198.19.255.2:7777"), // not 53: gopacket would decode the payload as DNS
	TCP6:   netip.MustParseAddrPort("[2001:db8:100::1]:80"),
	SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1},
	DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
	VNI:    7,
}

// TestFlows: distinct flows in about the mix's proportions, the same for
// the same seed, none rejected by Skip, a TOS only when asked.
func TestFlows(t *testing.T) {
	mix := flowtest.Mix{flowtest.TCP4: 40, flowtest.UDP4: 30, flowtest.TCP6: 20, flowtest.TCP4VLAN: 10}
	skip := func(a netip.Addr) bool { return a.Is4() && a.As4()[1] == 19 && a.As4()[2] < 16 } // no client in 198.19.0.0/20
	cases := []struct {
		name string
		cfg  flowtest.Config
	}{
		{"plain", flowtest.Config{Mix: mix, Seed: 1}},
		{"tos", flowtest.Config{Mix: mix, Seed: 2, TOS: true}},
		{"skip", flowtest.Config{Mix: mix, Seed: 3, Skip: skip}},
	}
	const n = 20000
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			flows := flowtest.Flows(n, tc.cfg)
			require.Equal(t, flows, flowtest.Flows(n, tc.cfg), "same seed, same flows")
			require.NotEqual(t, flows, flowtest.Flows(n, flowtest.Config{Mix: mix, Seed: tc.cfg.Seed + 10}))
			keys := map[flow.Key]bool{}
			var kinds [flowtest.NumKinds]int
			tos := 0
			for _, f := range flows {
				k := targets.Key(f)
				require.False(t, keys[k], "duplicate flow %v", f)
				keys[k] = true
				kinds[f.Kind]++
				if f.TOS != 0 {
					tos++
					require.Zero(t, f.TOS&3, "ECN bits clear")
				}
				if tc.cfg.Skip != nil {
					require.False(t, tc.cfg.Skip(f.Src), "skipped source %v drawn", f.Src)
				}
				require.Equal(t, f.Kind == flowtest.TCP6, f.Src.Is6())
			}
			for k, c := range kinds {
				// 5σ of a binomial around the mix's share.
				want := float64(n*mix[k]) / 100
				require.InDelta(t, want, float64(c), 5*40+want*0.05, "kind %v", flowtest.Kind(k))
			}
			if tc.cfg.TOS {
				require.InDelta(t, n/4, tos, n/20, "about a quarter with a TOS")
			} else {
				require.Zero(t, tos)
			}
		})
	}
}

// TestFrames: gopacket decodes every frame back to its flow's key, kind
// and TOS.
func TestFrames(t *testing.T) {
	flows := flowtest.Flows(2000, flowtest.Config{Mix: flowtest.Mix{25, 25, 25, 25}, Seed: 5, TOS: true})
	frames := targets.Frames(flows)
	for i, fr := range frames {
		f := flows[i]
		pkt := gopacket.NewPacket(fr, layers.LayerTypeEthernet, gopacket.Default)
		require.Nil(t, pkt.ErrorLayer(), "frame %d", i)
		_, tagged := pkt.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q)
		require.Equal(t, f.Kind == flowtest.TCP4VLAN, tagged, "frame %d", i)
		src, dst := pkt.NetworkLayer().NetworkFlow().Endpoints()
		sp, dp := pkt.TransportLayer().TransportFlow().Endpoints()
		s, _ := netip.AddrFromSlice(src.Raw())
		d, _ := netip.AddrFromSlice(dst.Raw())
		proto := uint8(flow.ProtoTCP)
		if pkt.Layer(layers.LayerTypeUDP) != nil {
			proto = flow.ProtoUDP
		}
		got := flow.KeyFrom(targets.VNI, proto, netip.AddrPortFrom(s, uint16(sp.Raw()[0])<<8|uint16(sp.Raw()[1])),
			netip.AddrPortFrom(d, uint16(dp.Raw()[0])<<8|uint16(dp.Raw()[1])))
		require.Equal(t, targets.Key(f), got, "frame %d", i)
		require.Len(t, pkt.ApplicationLayer().Payload(), flowtest.PayloadLen)
		if ip, ok := pkt.NetworkLayer().(*layers.IPv4); ok {
			require.Equal(t, f.TOS, ip.TOS)
		} else {
			require.Equal(t, f.TOS, pkt.NetworkLayer().(*layers.IPv6).TrafficClass)
		}
	}
}
