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

	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
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
	return gpkt.Serialize(t, eth, ip, udp, gopacket.Payload(payload))
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

func testVXLANSpec(size, flows int) FrameSpec {
	s := testSpec(size, flows)
	s.Dst = netip.MustParseAddr("198.18.2.1")
	s.VXLAN = &VXLANSpec{
		SrcMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11},
		DstMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x12},
		Src:    netip.MustParseAddr("198.18.0.1"),
		Dst:    netip.MustParseAddr("198.18.0.2"),
		VNI:    100,
	}
	return s
}

// oracleVXLANFrame builds flow i's VXLAN frame with gopacket: the outer
// headers around oracleFrame's inner frame.
func oracleVXLANFrame(t *testing.T, s FrameSpec, i int) []byte {
	t.Helper()
	v := s.VXLAN
	inner := s
	inner.VXLAN = nil
	eth := &layers.Ethernet{SrcMAC: v.SrcMAC, DstMAC: v.DstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{
		Version: 4, IHL: 5, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
		SrcIP: v.Src.AsSlice(), DstIP: v.Dst.AsSlice(),
	}
	udp := &layers.UDP{SrcPort: layers.UDPPort(VXLANSourcePort(i)), DstPort: layers.UDPPort(VXLANPort)}
	vx := &layers.VXLAN{ValidIDFlag: true, VNI: v.VNI}
	buf := gopacket.NewSerializeBuffer()
	// ComputeChecksums off: the outer UDP checksum stays zero, as the Mux
	// sends it; the IPv4 checksum is checked below.
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true},
		eth, ip, udp, vx, gopacket.Payload(oracleFrame(t, inner, i))))
	b := buf.Bytes()
	ipSum := ^header.Checksum(b[ethLen:ethLen+ipv4Len], 0)
	b[ethLen+10], b[ethLen+11] = byte(ipSum>>8), byte(ipSum)
	return b
}

func TestVXLANFrameMatchesGopacket(t *testing.T) {
	tests := []struct {
		name        string
		size, flows int
		flow        int
	}{
		{"64B first flow", 64, 1, 0},
		{"65B odd payload", 65, 1, 0},
		{"1468B largest", MaxFrameSize - VXLANOverhead, 1000, 999},
		{"last of a million", 64, 1 << 20, 1<<20 - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testVXLANSpec(tt.size, tt.flows)
			require.NoError(t, s.Validate())
			got := s.Frame(make([]byte, 2048), tt.flow)
			require.Len(t, got, tt.size-FCSLen+VXLANOverhead)
			assert.Equal(t, oracleVXLANFrame(t, s, tt.flow), got)

			// gopacket decodes both layers; the checksums verify.
			p := gopacket.NewPacket(got, layers.LayerTypeEthernet, gopacket.Default)
			require.Nil(t, p.ErrorLayer())
			ls := p.Layers()
			require.Len(t, ls, 8, "eth ip udp vxlan eth ip udp payload")
			outer := ls[1].(*layers.IPv4)
			assert.Equal(t, "198.18.0.2", outer.DstIP.String())
			assert.Equal(t, uint16(0xffff), header.Checksum(outer.Contents, 0), "outer IPv4 checksum")
			ou := ls[2].(*layers.UDP)
			assert.Equal(t, layers.UDPPort(VXLANPort), ou.DstPort)
			assert.Equal(t, VXLANSourcePort(tt.flow), uint16(ou.SrcPort))
			assert.GreaterOrEqual(t, uint16(ou.SrcPort), uint16(49152))
			assert.Zero(t, ou.Checksum)
			assert.Equal(t, uint32(100), ls[3].(*layers.VXLAN).VNI)
			ie := ls[4].(*layers.Ethernet)
			assert.Equal(t, s.DstMAC, ie.DstMAC)
			ip := ls[5].(*layers.IPv4)
			udp := ls[6].(*layers.UDP)
			src, sport := s.Flow(tt.flow)
			assert.Equal(t, src.AsSlice(), []byte(ip.SrcIP.To4()))
			assert.Equal(t, "198.18.2.1", ip.DstIP.String())
			assert.Equal(t, uint16(0xffff), header.Checksum(ip.Contents, 0), "inner IPv4 checksum")
			assert.Equal(t, sport, uint16(udp.SrcPort))
			var s4, d4 [4]byte
			copy(s4[:], ip.SrcIP.To4())
			copy(d4[:], ip.DstIP.To4())
			seg := append(append([]byte{}, udp.Contents...), udp.Payload...)
			assert.Equal(t, uint16(0xffff), header.Checksum(seg, header.PseudoHeaderChecksum(17, s4[:], d4[:], uint16(len(seg)))),
				"inner UDP checksum")
		})
	}
}

func TestVXLANSetFlowEqualsFrame(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, size := range []int{64, 65, 1468} {
		s := testVXLANSpec(size, MaxFlows)
		want := make([]byte, 2048)
		f := s.Frame(make([]byte, 2048), 0)
		for range 2000 {
			i := rng.IntN(MaxFlows)
			s.SetFlow(f, i)
			require.Equal(t, s.Frame(want, i), f, "size %d flow %d", size, i)
		}
	}
}

func TestVXLANSpecValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*FrameSpec)
	}{
		{"short outer MAC", func(s *FrameSpec) { s.VXLAN.DstMAC = s.VXLAN.DstMAC[:5] }},
		{"IPv6 outer", func(s *FrameSpec) { s.VXLAN.Dst = netip.MustParseAddr("2001:db8::2") }},
		{"VNI too big", func(s *FrameSpec) { s.VXLAN.VNI = MaxVXLANVNI + 1 }},
		{"outer frame above 1518", func(s *FrameSpec) { s.Size = MaxFrameSize - VXLANOverhead + 1 }},
	}
	ok := testVXLANSpec(64, 1)
	require.NoError(t, ok.Validate())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testVXLANSpec(64, 1)
			tt.modify(&s)
			assert.ErrorIs(t, s.Validate(), ErrFrameSpec)
		})
	}
}

func TestVXLANSourcePortsSpread(t *testing.T) {
	seen := map[uint16]bool{}
	for i := range 1000 {
		p := VXLANSourcePort(i)
		require.GreaterOrEqual(t, p, uint16(49152))
		seen[p] = true
	}
	assert.Greater(t, len(seen), 900, "1000 flows should use nearly 1000 outer source ports")
}

// FuzzSetFlowVXLAN: FuzzSetFlow for VXLAN frames.
func FuzzSetFlowVXLAN(f *testing.F) {
	f.Add(64, 0, 1)
	f.Add(1468, MaxFlows-1, FlowPortsPerAddr)
	f.Add(99, 7, 7)
	f.Fuzz(func(t *testing.T, size, from, to int) {
		s := testVXLANSpec(MinFrameSize+abs(size)%(MaxFrameSize-VXLANOverhead-MinFrameSize+1), MaxFlows)
		from, to = abs(from)%MaxFlows, abs(to)%MaxFlows
		got := s.Frame(make([]byte, 2048), from)
		s.SetFlow(got, to)
		want := s.Frame(make([]byte, 2048), to)
		if string(got) != string(want) {
			t.Fatalf("size %d: flow %d rewritten to %d differs from a fresh frame", s.Size, from, to)
		}
	})
}

func TestPathAndOutputNames(t *testing.T) {
	assert.Equal(t, "routed", PathRouted.String())
	assert.Equal(t, "one-arm", PathOneArm.String())
	assert.Equal(t, "tunnel", PathTunnel.String())
	assert.Equal(t, "Path(9)", Path(9).String())
	assert.Equal(t, "plain", OutputPlain.String())
	assert.Equal(t, "vxlan", OutputVXLAN.String())
}
