package benchmarks

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/flow"
)

// Addresses come from the benchmarking and documentation ranges
// (198.18.0.0/15, 2001:db8::/32); nothing here is ever sent.
var (
	vip4 = netip.MustParseAddr("198.19.255.1")
	vip6 = netip.MustParseAddr("2001:db8:100::1")
)

// VIP ports of the traffic the generator makes.
const (
	vipTCPPort = 80
	vipUDPPort = 53
)

// payloadLen makes an untagged IPv4 TCP frame exactly 64 bytes.
const payloadLen = 10

// frameKind is the shape of a generated frame.
type frameKind uint8

const (
	kindTCP4     frameKind = iota // Ethernet, IPv4, TCP
	kindUDP4                      // Ethernet, IPv4, UDP
	kindTCP6                      // Ethernet, IPv6, TCP
	kindTCP4VLAN                  // Ethernet, 802.1Q tag, IPv4, TCP
	numKinds
)

func (k frameKind) String() string {
	return [...]string{"tcp4", "udp4", "tcp6", "tcp4-vlan"}[k]
}

// mix is a traffic mix: the percentage of flows of each kind (summing to
// 100).
type mix [numKinds]int

// parseMix is the frame mix of the parse benchmark; pipelineMix that of the
// pipeline benchmark (mostly IPv4 TCP, as a web VIP sees).
var (
	parseMix    = mix{kindTCP4: 40, kindUDP4: 30, kindTCP6: 20, kindTCP4VLAN: 10}
	pipelineMix = mix{kindTCP4: 60, kindUDP4: 20, kindTCP6: 10, kindTCP4VLAN: 10}
)

// flowSpec is one generated flow: a client endpoint talking to the VIP
// that its kind implies.
type flowSpec struct {
	kind  frameKind
	src   netip.Addr
	sport uint16
}

func (f flowSpec) proto() uint8 {
	if f.kind == kindUDP4 {
		return flow.ProtoUDP
	}
	return flow.ProtoTCP
}

func (f flowSpec) dst() netip.Addr {
	if f.kind == kindTCP6 {
		return vip6
	}
	return vip4
}

func (f flowSpec) dport() uint16 {
	if f.kind == kindUDP4 {
		return vipUDPPort
	}
	return vipTCPPort
}

// key is the flow key a parser must find in the flow's frames (VNI 0).
func (f flowSpec) key() flow.Key {
	return flow.KeyFrom(0, f.proto(), netip.AddrPortFrom(f.src, f.sport), netip.AddrPortFrom(f.dst(), f.dport()))
}

// genFlows returns n distinct flows (no two share a 5-tuple) drawn from a
// PCG generator seeded with seed, with kinds in the proportions of m.
// Clients are spread over 198.18.0.0/15 and 2001:db8:1::/64, source ports
// over 1024-65535. The same arguments give the same flows.
func genFlows(n int, m mix, seed uint64) []flowSpec {
	rng := rand.New(rand.NewPCG(seed, 0x786470_6c62)) // "xdplb"
	type tuple struct {
		proto uint8
		src   netip.Addr
		sport uint16
	}
	seen := make(map[tuple]struct{}, n)
	flows := make([]flowSpec, 0, n)
	for len(flows) < n {
		var f flowSpec
		pick := rng.IntN(100)
		for k := range numKinds {
			if pick < m[k] {
				f.kind = k
				break
			}
			pick -= m[k]
		}
		r := rng.Uint64()
		if f.kind == kindTCP6 {
			a := netip.MustParseAddr("2001:db8:1::").As16()
			for i := 8; i < 16; i++ {
				a[i] = byte(r >> (8 * (i - 8)))
			}
			f.src = netip.AddrFrom16(a)
		} else {
			f.src = netip.AddrFrom4([4]byte{198, 18 + byte(r&1), byte(r >> 8), byte(r >> 16)})
		}
		f.sport = uint16(1024 + rng.IntN(65536-1024))
		t := tuple{f.proto(), f.src, f.sport}
		if _, dup := seen[t]; dup {
			continue
		}
		seen[t] = struct{}{}
		flows = append(flows, f)
	}
	return flows
}

var (
	macClient = net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x00, 0x01}
	macMux    = net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x00, 0x02}
)

// buildFrame serialises one frame of flow f with gopacket (lengths and
// checksums computed): a TCP segment with ACK|PSH, or a UDP datagram,
// carrying payloadLen bytes.
func buildFrame(f flowSpec, seq uint32) []byte {
	eth := &layers.Ethernet{SrcMAC: macClient, DstMAC: macMux}
	ls := []gopacket.SerializableLayer{eth}
	var nl gopacket.NetworkLayer
	switch f.kind {
	case kindTCP6:
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP,
			SrcIP: f.src.AsSlice(), DstIP: f.dst().AsSlice()}
		nl = ip
		ls = append(ls, ip)
	default:
		eth.EthernetType = layers.EthernetTypeIPv4
		if f.kind == kindTCP4VLAN {
			eth.EthernetType = layers.EthernetTypeDot1Q
			ls = append(ls, &layers.Dot1Q{VLANIdentifier: 100, Type: layers.EthernetTypeIPv4})
		}
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocol(f.proto()),
			SrcIP: f.src.AsSlice(), DstIP: f.dst().AsSlice(), Flags: layers.IPv4DontFragment}
		nl = ip
		ls = append(ls, ip)
	}
	if f.kind == kindUDP4 {
		u := &layers.UDP{SrcPort: layers.UDPPort(f.sport), DstPort: layers.UDPPort(f.dport())}
		_ = u.SetNetworkLayerForChecksum(nl)
		ls = append(ls, u)
	} else {
		t := &layers.TCP{SrcPort: layers.TCPPort(f.sport), DstPort: layers.TCPPort(f.dport()),
			Seq: seq, Ack: 1, ACK: true, PSH: true, Window: 65535}
		_ = t.SetNetworkLayerForChecksum(nl)
		ls = append(ls, t)
	}
	ls = append(ls, gopacket.Payload(make([]byte, payloadLen)))
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, ls...); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// trafficSet is a generated set of flows and one frame per flow, in flow
// order. The frames share one backing array.
type trafficSet struct {
	flows  []flowSpec
	frames [][]byte
}

var (
	trafficMu    sync.Mutex
	trafficCache = map[string]*trafficSet{}
)

// traffic returns (and caches for the process) n flows of mix m from seed,
// with one frame each. Building a million frames takes a few seconds and
// about 100 MB, so benchmarks share one copy across -count runs.
func traffic(n int, m mix, seed uint64) *trafficSet {
	id := fmt.Sprint(n, m, seed)
	trafficMu.Lock()
	defer trafficMu.Unlock()
	if t, ok := trafficCache[id]; ok {
		return t
	}
	t := &trafficSet{flows: genFlows(n, m, seed), frames: make([][]byte, n)}
	var arena []byte
	for i, f := range t.flows {
		fr := buildFrame(f, uint32(i))
		if len(arena) < len(fr) {
			arena = make([]byte, 1<<20)
		}
		t.frames[i] = arena[:len(fr):len(fr)]
		copy(t.frames[i], fr)
		arena = arena[len(fr):]
	}
	trafficCache[id] = t
	return t
}
