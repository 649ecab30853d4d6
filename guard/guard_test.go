package guard_test

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/guard"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

var (
	vip4  = netip.MustParseAddr("198.18.100.1")
	vip6  = netip.MustParseAddr("2001:db8:100::1")
	vipB  = netip.MustParseAddr("198.18.100.2") // a VIP of another VNI
	node4 = netip.MustParseAddr("198.18.0.2")
	node6 = netip.MustParseAddr("2001:db8::2")
	infra = []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("2001:db8:1::/48")}
	cl4   = netip.MustParseAddr("198.18.11.2")
	cl6   = netip.MustParseAddr("2001:db8:11::2")
)

// frame builds an Ethernet frame with gopacket: UDP (or an ICMP message
// of type icmpType when icmp is set) from src to dst with the given TTL /
// hop limit.
func frame(t testing.TB, src, dst netip.Addr, ttl uint8, icmp bool, icmpType uint8) []byte {
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}}
	var ls []gopacket.SerializableLayer
	if src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		proto := layers.IPProtocolUDP
		if icmp {
			proto = layers.IPProtocolICMPv4
		}
		ls = append(ls, eth, &layers.IPv4{Version: 4, TTL: ttl, Protocol: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()})
		if icmp {
			ls = append(ls, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(icmpType, 0)}, gopacket.Payload(make([]byte, 28)))
		}
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		proto := layers.IPProtocolUDP
		if icmp {
			proto = layers.IPProtocolICMPv6
		}
		ls = append(ls, eth, &layers.IPv6{Version: 6, HopLimit: ttl, NextHeader: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()})
		if icmp {
			ls = append(ls, &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(icmpType, 0)}, gopacket.Payload(make([]byte, 52)))
		}
	}
	if !icmp {
		ls = append(ls, &layers.UDP{SrcPort: 7, DstPort: 7}, gopacket.Payload("echo"))
	}
	return gpkt.Serialize(t, ls...)
}

func newRules(t testing.TB) *flow.Rules {
	rules := flow.NewRules()
	be := []flow.Backend{{Name: "a", Addr: netip.MustParseAddr("198.18.31.1"), Weight: 1}}
	be6 := []flow.Backend{{Name: "a", Addr: netip.MustParseAddr("2001:db8:31::1"), Weight: 1}}
	_, err := rules.Update(1, []flow.Rule{
		{Name: "echo", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoUDP, Port: 7, VNI: 100}, Backends: be},
		{Name: "web6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoTCP, Port: 80, VNI: 100}, Backends: be6},
		{Name: "other", VIP: flow.VIP{Addr: vipB, Proto: flow.ProtoTCP, Port: 443, VNI: 200}, Backends: be},
	})
	require.NoError(t, err)
	return rules
}

// run passes one frame through Parse and the stage; it returns the drop
// reason's name ("" when it passed) and the frame after the pipeline.
func run(t testing.TB, st engine.Stage, fr []byte) (string, []byte) {
	return runWith(t, st, fr, nil)
}

// runWith runs fr through st in a batch whose snapshot is snap.
func runWith(t testing.TB, st engine.Stage, fr []byte, snap any) (string, []byte) {
	var b engine.Batch
	b.Snapshot = snap
	var ctr engine.Counters
	b.Counters = &ctr
	var p engine.Packet
	buf := make([]byte, 2048)
	copy(buf[128:], fr)
	p.SetBuffer(nil, 0, buf, 128, len(fr), 0)
	b.Append(&p)
	engine.NewPipeline(engine.Parse{}, st).Process(&b)
	if b.Len() == 0 {
		return p.Reason.String(), nil
	}
	return "", bytes.Clone(p.Data())
}

func TestSourcesDecisions(t *testing.T) {
	src, err := guard.NewSources(guard.SourcesConfig{Rules: newRules(t), Node: []netip.Addr{node4, node6}, Infra: infra})
	require.NoError(t, err)
	dst, err := guard.NewSources(guard.SourcesConfig{Rules: newRules(t), Destination: true})
	require.NoError(t, err)
	a := netip.MustParseAddr
	cases := []struct {
		name     string
		st       *guard.Sources
		src, dst netip.Addr
		icmp     bool
		icmpType uint8
		want     string
	}{
		{"client4", src, cl4, vip4, false, 0, ""},
		{"client6", src, cl6, vip6, false, 0, ""},
		{"vip to itself", src, vip4, vip4, false, 0, "src_vip"},
		{"vip of another VNI", src, vipB, vip4, false, 0, "src_vip"},
		{"vip6", src, vip6, vip6, false, 0, "src_vip"},
		{"infra4", src, a("198.18.1.77"), vip4, false, 0, "src_infra"},
		{"infra6", src, a("2001:db8:1:2::3"), vip6, false, 0, "src_infra"},
		{"node4", src, node4, vip4, false, 0, "src_node"},
		{"node6", src, node6, vip6, false, 0, "src_node"},
		{"this network", src, a("0.1.2.3"), vip4, false, 0, "src_martian"},
		{"loopback4", src, a("127.0.0.1"), vip4, false, 0, "src_martian"},
		{"multicast4", src, a("239.1.2.3"), vip4, false, 0, "src_martian"},
		{"multicast4 low", src, a("224.0.0.1"), vip4, false, 0, "src_martian"},
		{"limited broadcast", src, a("255.255.255.255"), vip4, false, 0, "src_martian"},
		{"class E is not listed", src, a("240.0.0.1"), vip4, false, 0, ""},
		{"unspecified6", src, a("::"), vip6, false, 0, "src_martian"},
		{"loopback6", src, a("::1"), vip6, false, 0, "src_martian"},
		{"multicast6", src, a("ff02::1"), vip6, false, 0, "src_martian"},
		{"v4-mapped6", src, a("::ffff:198.18.11.2"), vip6, false, 0, "src_martian"},
		{"::2 is not martian", src, a("::2"), vip6, false, 0, ""},
		{"infra router's frag needed", src, a("198.18.1.1"), vip4, true, layers.ICMPv4TypeDestinationUnreachable, ""},
		{"infra router's time exceeded6", src, a("2001:db8:1::1"), vip6, true, layers.ICMPv6TypePacketTooBig, ""},
		{"infra echo request", src, a("198.18.1.1"), vip4, true, layers.ICMPv4TypeEchoRequest, "src_infra"},
		{"infra echo request6", src, a("2001:db8:1::1"), vip6, true, layers.ICMPv6TypeEchoRequest, "src_infra"},
		{"vip's ICMP error", src, vip4, vip4, true, layers.ICMPv4TypeDestinationUnreachable, "src_vip"},
		{"node's ICMP error", src, node4, vip4, true, layers.ICMPv4TypeTimeExceeded, "src_node"},
		{"reply to a client", dst, a("198.18.31.1"), cl4, false, 0, ""},
		{"reply to a VIP", dst, a("198.18.31.1"), vip4, false, 0, "src_vip"},
		{"reply to broadcast", dst, a("198.18.31.1"), a("255.255.255.255"), false, 0, "src_martian"},
		{"reply from a VIP is fine on the destination side", dst, vip4, cl4, false, 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fr := frame(t, tc.src, tc.dst, 64, tc.icmp, tc.icmpType)
			got, out := run(t, tc.st, fr)
			require.Equal(t, tc.want, got)
			if got == "" {
				require.Equal(t, fr, out, "the filter changes no byte")
			}
		})
	}
}

// TestSourcesLinkGroup: a packet to a unicast address received as a
// link-layer broadcast or multicast is dropped (link_group), as a router
// must (RFC 1812 5.3.4; Linux's ip_forward drops what is not
// PACKET_HOST): every node on the segment receives such a frame, so each
// would forward its own copy. A spoofed source keeps its own reason.
func TestSourcesLinkGroup(t *testing.T) {
	src, err := guard.NewSources(guard.SourcesConfig{Rules: newRules(t), Node: []netip.Addr{node4, node6}, Infra: infra})
	require.NoError(t, err)
	dst, err := guard.NewSources(guard.SourcesConfig{Rules: newRules(t), Destination: true})
	require.NoError(t, err)
	bcast := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	mcast4 := []byte{0x01, 0x00, 0x5e, 0x00, 0x00, 0x01}
	mcast6 := []byte{0x33, 0x33, 0x00, 0x00, 0x00, 0x01}
	to := func(fr, mac []byte) []byte { fr = bytes.Clone(fr); copy(fr, mac); return fr }
	for _, tc := range []struct {
		name string
		st   *guard.Sources
		fr   []byte
		want string
	}{
		{"client4 broadcast", src, to(frame(t, cl4, vip4, 64, false, 0), bcast), "link_group"},
		{"client4 multicast MAC", src, to(frame(t, cl4, vip4, 64, false, 0), mcast4), "link_group"},
		{"client6 multicast MAC", src, to(frame(t, cl6, vip6, 64, false, 0), mcast6), "link_group"},
		{"infra ICMP error broadcast", src, to(frame(t, netip.MustParseAddr("198.18.1.1"), vip4, 64, true, layers.ICMPv4TypeDestinationUnreachable), bcast), "link_group"},
		{"reply broadcast", dst, to(frame(t, netip.MustParseAddr("198.18.31.1"), cl4, 64, false, 0), bcast), "link_group"},
		{"martian broadcast keeps its reason", src, to(frame(t, netip.MustParseAddr("127.0.0.1"), vip4, 64, false, 0), bcast), "src_martian"},
		{"vip broadcast keeps its reason", src, to(frame(t, vip4, vip4, 64, false, 0), bcast), "src_vip"},
		{"client4 unicast", src, frame(t, cl4, vip4, 64, false, 0), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := run(t, tc.st, tc.fr)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestSourcesReload: the VIP set is the rules' snapshot, so a new version
// changes the filter at once; SetPrefixes swaps the prefixes.
func TestSourcesReload(t *testing.T) {
	rules := newRules(t)
	s, err := guard.NewSources(guard.SourcesConfig{Rules: rules})
	require.NoError(t, err)
	newVIP := netip.MustParseAddr("198.18.100.9")
	fr := frame(t, newVIP, vip4, 64, false, 0)
	got, _ := run(t, s, fr)
	require.Empty(t, got)
	_, err = rules.Update(2, []flow.Rule{{Name: "n", VIP: flow.VIP{Addr: newVIP, Proto: flow.ProtoUDP, Port: 7},
		Backends: []flow.Backend{{Name: "a", Addr: cl4, Weight: 1}}}})
	require.NoError(t, err)
	got, _ = run(t, s, fr)
	require.Equal(t, "src_vip", got)
	// vip4 left the rules: its packets pass again.
	got, _ = run(t, s, frame(t, vip4, newVIP, 64, false, 0))
	require.Empty(t, got)

	require.NoError(t, s.SetPrefixes(nil, []netip.Prefix{netip.MustParsePrefix("198.18.11.0/24")}))
	got, _ = run(t, s, frame(t, cl4, newVIP, 64, false, 0))
	require.Equal(t, "src_infra", got)
	require.Error(t, s.SetPrefixes(nil, []netip.Prefix{{}}))
	got, _ = run(t, s, frame(t, cl4, newVIP, 64, false, 0))
	require.Equal(t, "src_infra", got, "a refused set leaves the one in use")
	_, err = guard.NewSources(guard.SourcesConfig{Node: []netip.Addr{{}}})
	require.Error(t, err)
}

// prefixSnap is a node's snapshot carrying the source filter's set.
type prefixSnap struct{ set *guard.Prefixes }

func (s prefixSnap) SourcePrefixes() *guard.Prefixes { return s.set }

// TestSourcesSnapshotPrefixes: a batch whose snapshot carries a prefix
// set (guard.PrefixSource) is filtered by that set, whatever the stage's
// own; without one, by the stage's own.
func TestSourcesSnapshotPrefixes(t *testing.T) {
	s, err := guard.NewSources(guard.SourcesConfig{Rules: newRules(t),
		Infra: []netip.Prefix{netip.MustParsePrefix("198.18.77.0/24")}})
	require.NoError(t, err)
	infra, err := guard.NewPrefixes(nil, []netip.Prefix{netip.MustParsePrefix("198.18.11.0/24")})
	require.NoError(t, err)
	fr := frame(t, cl4, vip4, 64, false, 0) // cl4 is in 198.18.11.0/24
	got, _ := runWith(t, s, fr, prefixSnap{infra})
	require.Equal(t, "src_infra", got, "the batch's set")
	got, _ = runWith(t, s, fr, nil)
	require.Empty(t, got, "the stage's own set")
	got, _ = runWith(t, s, fr, prefixSnap{nil})
	require.Empty(t, got, "a snapshot without a set: the stage's own")
}

func TestTTL(t *testing.T) {
	for _, tc := range []struct {
		name    string
		src     netip.Addr
		dst     netip.Addr
		ttl     uint8
		want    string
		wantTTL uint8
	}{
		{"v4 64", cl4, vip4, 64, "", 63},
		{"v4 2", cl4, vip4, 2, "", 1},
		{"v4 1", cl4, vip4, 1, "ttl_exceeded", 0},
		{"v4 0", cl4, vip4, 0, "ttl_exceeded", 0},
		{"v4 255", cl4, vip4, 255, "", 254},
		{"v6 64", cl6, vip6, 64, "", 63},
		{"v6 2", cl6, vip6, 2, "", 1},
		{"v6 1", cl6, vip6, 1, "ttl_exceeded", 0},
		{"v6 0", cl6, vip6, 0, "ttl_exceeded", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := frame(t, tc.src, tc.dst, tc.ttl, false, 0)
			got, out := run(t, guard.TTL{}, in)
			require.Equal(t, tc.want, got)
			if got != "" {
				return
			}
			// The oracle: gopacket decodes the output; every byte but the
			// TTL / hop limit (and the IPv4 header checksum) is the input's,
			// and the IPv4 header checksum verifies (RFC 1071 loop).
			pkt := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
			want := bytes.Clone(in)
			if tc.src.Is4() {
				ip := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
				require.Equal(t, tc.wantTTL, ip.TTL)
				require.Zero(t, gpkt.Checksum(out[14:34]), "IPv4 header checksum")
				want[14+8] = tc.wantTTL
				copy(want[24:26], out[24:26])
			} else {
				ip := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
				require.Equal(t, tc.wantTTL, ip.HopLimit)
				want[14+7] = tc.wantTTL
			}
			require.Equal(t, want, out)
		})
	}
}

// TestTTLKeepsAWrongChecksumWrong: the incremental update keeps a wrong
// IPv4 header checksum exactly as wrong.
func TestTTLKeepsAWrongChecksumWrong(t *testing.T) {
	in := frame(t, cl4, vip4, 64, false, 0)
	in[24] ^= 0x5a
	before := gpkt.Checksum(in[14:34])
	require.NotZero(t, before)
	_, out := run(t, guard.TTL{}, in)
	require.NotNil(t, out)
	require.Equal(t, before, gpkt.Checksum(out[14:34]))
}

func TestIsMartian(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"0.0.0.0", true}, {"0.255.255.255", true}, {"1.0.0.0", false}, {"126.255.255.255", false},
		{"127.0.0.1", true}, {"128.0.0.0", false}, {"223.255.255.255", false}, {"224.0.0.0", true},
		{"239.255.255.255", true}, {"240.0.0.0", false}, {"255.255.255.254", false}, {"255.255.255.255", true},
		{"::", true}, {"::1", true}, {"::2", false}, {"ff00::", true}, {"fe80::1", false},
		{"::ffff:1.2.3.4", true}, {"::fffe:1.2.3.4", false}, {"2001:db8::1", false},
	} {
		a := netip.MustParseAddr(tc.addr)
		var k flow.Key
		if a.Is4() {
			k = flow.KeyFrom(0, flow.ProtoUDP, netip.AddrPortFrom(a, 1), netip.AddrPortFrom(a, 1))
		} else {
			b := a.As16()
			k.SetIPv6(0, flow.ProtoUDP, b[:], b[:], 1, 1)
		}
		require.Equal(t, tc.want, guard.IsMartian(&k.Src, k.Family), tc.addr)
	}
	var zero [16]byte
	require.True(t, guard.IsMartian(&zero, 0), "no family")
}

// TestGuardNoAllocs: both stages allocate nothing over whole batches.
func TestGuardNoAllocs(t *testing.T) {
	s, err := guard.NewSources(guard.SourcesConfig{Rules: newRules(t), Node: []netip.Addr{node4}, Infra: infra})
	require.NoError(t, err)
	frames := make([][]byte, engine.MaxBatch)
	for i := range frames {
		src := netip.AddrFrom4([4]byte{198, 18, 11, byte(i)})
		switch i % 4 {
		case 1:
			src = vip4 // dropped: src_vip
		case 2:
			src = netip.MustParseAddr("198.18.1.9") // src_infra
		}
		frames[i] = frame(t, src, vip4, 64, false, 0)
	}
	port, err := engine.NewMemPort(engine.MemPortConfig{})
	require.NoError(t, err)
	port.Replay(frames)
	pl := engine.NewPipeline(engine.Parse{}, s, guard.TTL{})
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{port}, Inputs: []engine.Input{{Port: 0, Pipeline: pl}}})
	require.NoError(t, err)
	w.Poll()
	require.Zero(t, testing.AllocsPerRun(100, func() { w.Poll() }))
	var st engine.Stats
	w.Counters().Snapshot(&st)
	require.NotZero(t, st.DropsByName()["src_vip"])
	require.NotZero(t, st.DropsByName()["src_infra"])
}

// BenchmarkGuard is the cost of both stages over whole batches of client
// packets that pass (Parse alone is the baseline sub-benchmark).
func BenchmarkGuard(b *testing.B) {
	s, err := guard.NewSources(guard.SourcesConfig{Rules: newRules(b), Node: []netip.Addr{node4, node6}, Infra: infra})
	require.NoError(b, err)
	frames := make([][]byte, engine.MaxBatch)
	for i := range frames {
		frames[i] = frame(b, netip.AddrFrom4([4]byte{198, 18, 11, byte(i)}), vip4, 64, false, 0)
	}
	for _, bc := range []struct {
		name   string
		stages []engine.Stage
	}{
		{"parse", []engine.Stage{engine.Parse{}}},
		{"parse+sources", []engine.Stage{engine.Parse{}, s}},
		{"parse+ttl", []engine.Stage{engine.Parse{}, guard.TTL{}}},
		{"parse+sources+ttl", []engine.Stage{engine.Parse{}, s, guard.TTL{}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			port, err := engine.NewMemPort(engine.MemPortConfig{})
			require.NoError(b, err)
			port.Replay(frames)
			w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{port},
				Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(bc.stages...)}}})
			require.NoError(b, err)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				w.Poll()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*engine.MaxBatch), "ns/pkt")
		})
	}
}
