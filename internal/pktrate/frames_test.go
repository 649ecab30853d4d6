package pktrate

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func testSpec(size, flows int) FrameSpec {
	return FrameSpec{
		SrcMAC:  net.HardwareAddr{0x02, 0, 0, 0, 0, 1},
		DstMAC:  net.HardwareAddr{0x02, 0, 0, 0, 0, 2},
		Src:     netip.MustParseAddr("198.18.0.128"),
		Dst:     netip.MustParseAddr("198.18.1.2"),
		DstPort: 9,
		Size:    size,
		Flows:   flows,
	}
}

// oracleFrame builds flow i's frame with gopacket, independently of Frame.
func oracleFrame(t *testing.T, s FrameSpec, i int) []byte {
	t.Helper()
	src, sport := s.Flow(i)
	eth := &layers.Ethernet{SrcMAC: s.SrcMAC, DstMAC: s.DstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{
		Version: 4, IHL: 5, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
		SrcIP: src.AsSlice(), DstIP: s.Dst.AsSlice(),
	}
	udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(s.DstPort)}
	require.NoError(t, udp.SetNetworkLayerForChecksum(ip))
	payload := make([]byte, s.Len()-hdrsLen)
	for j := range payload {
		payload[j] = byte(j + udpLen)
	}
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, udp, gopacket.Payload(payload)))
	return buf.Bytes()
}

func TestFrameMatchesGopacket(t *testing.T) {
	tests := []struct {
		name        string
		size, flows int
		flow        int
	}{
		{"64B first flow", 64, 1, 0},
		{"65B odd payload", 65, 1, 0},
		{"128B", 128, 1000, 999},
		{"1518B max", 1518, 2, 1},
		{"second source address", 64, 1 << 20, FlowPortsPerAddr + 5},
		{"last of a million", 64, 1 << 20, 1<<20 - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSpec(tt.size, tt.flows)
			require.NoError(t, s.Validate())
			got := s.Frame(make([]byte, 2048), tt.flow)
			require.Len(t, got, tt.size-FCSLen)
			assert.Equal(t, oracleFrame(t, s, tt.flow), got)

			// And gopacket reads back the flow we asked for.
			p := gopacket.NewPacket(got, layers.LayerTypeEthernet, gopacket.Default)
			require.Nil(t, p.ErrorLayer())
			ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
			udp := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
			src, sport := s.Flow(tt.flow)
			assert.Equal(t, src.AsSlice(), []byte(ip.SrcIP.To4()))
			assert.Equal(t, sport, uint16(udp.SrcPort))
			assert.Equal(t, uint16(9), uint16(udp.DstPort))
		})
	}
}

func TestSetFlowEqualsFrame(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{64, 65, 200, 1518} {
		s := testSpec(size, MaxFlows)
		buf := make([]byte, 2048)
		want := make([]byte, 2048)
		f := s.Frame(buf, 0)
		for range 2000 {
			i := rng.IntN(MaxFlows)
			s.SetFlow(f, i) // from whatever flow f held
			require.Equal(t, s.Frame(want, i), f, "size %d flow %d", size, i)
		}
	}
}

func TestFlowsAreDistinct(t *testing.T) {
	s := testSpec(64, 3*FlowPortsPerAddr+7)
	seen := make(map[netip.AddrPort]int, s.Flows)
	for i := 0; i < s.Flows; i++ {
		a, p := s.Flow(i)
		k := netip.AddrPortFrom(a, p)
		prev, dup := seen[k]
		require.False(t, dup, "flows %d and %d are both %v", prev, i, k)
		seen[k] = i
	}
	a, p := s.Flow(s.Flows - 1)
	assert.Equal(t, "198.18.0.131", a.String())
	assert.Equal(t, uint16(FlowPortBase+6), p)
}

func TestFrameSpecValidate(t *testing.T) {
	ok := testSpec(64, 1)
	tests := []struct {
		name   string
		modify func(*FrameSpec)
	}{
		{"short MAC", func(s *FrameSpec) { s.SrcMAC = s.SrcMAC[:4] }},
		{"IPv6 source", func(s *FrameSpec) { s.Src = netip.MustParseAddr("2001:db8::1") }},
		{"zero destination", func(s *FrameSpec) { s.Dst = netip.Addr{} }},
		{"frame too small", func(s *FrameSpec) { s.Size = 63 }},
		{"frame too big", func(s *FrameSpec) { s.Size = 1519 }},
		{"no flows", func(s *FrameSpec) { s.Flows = 0 }},
		{"too many flows", func(s *FrameSpec) { s.Flows = MaxFlows + 1 }},
		{"port 0", func(s *FrameSpec) { s.DstPort = 0 }},
		{"sources wrap", func(s *FrameSpec) {
			s.Src = netip.MustParseAddr("255.255.255.255")
			s.Flows = FlowPortsPerAddr + 1
		}},
	}
	require.NoError(t, ok.Validate())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ok
			tt.modify(&s)
			assert.ErrorIs(t, s.Validate(), ErrFrameSpec)
		})
	}
}

func TestSetFlowAllocatesNothing(t *testing.T) {
	s := testSpec(64, MaxFlows)
	f := s.Frame(make([]byte, 2048), 0)
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		i = (i + 40503) % MaxFlows
		s.SetFlow(f, i)
	})
	assert.Zero(t, allocs)
}

// FuzzSetFlow: rewriting any flow's frame into any other flow gives the
// frame Frame builds, for any frame size.
func FuzzSetFlow(f *testing.F) {
	f.Add(64, 0, 1)
	f.Add(65, 12345, 0)
	f.Add(1518, MaxFlows-1, FlowPortsPerAddr)
	f.Add(777, 3, 3)
	f.Fuzz(func(t *testing.T, size, from, to int) {
		s := testSpec(MinFrameSize+abs(size)%(MaxFrameSize-MinFrameSize+1), MaxFlows)
		from, to = abs(from)%MaxFlows, abs(to)%MaxFlows
		got := s.Frame(make([]byte, 2048), from)
		s.SetFlow(got, to)
		want := s.Frame(make([]byte, 2048), to)
		if string(got) != string(want) {
			t.Fatalf("size %d: flow %d rewritten to %d differs from a fresh frame", s.Size, from, to)
		}
	})
}

func abs(v int) int {
	if v < 0 {
		if v == -v { // MinInt
			return 0
		}
		return -v
	}
	return v
}
