package benchmarks

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"unsafe"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/kkdai/maglev"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// gopacketParser is the peer frame parser: gopacket's DecodingLayerParser
// over preallocated layers (Ethernet, 802.1Q, IPv4, IPv6, TCP, UDP and the
// payload; application layers are not decoded), with the sparse-array layer container that gopacket documents
// as its fastest, and a preallocated slice of decoded types. It is the way
// gopacket's documentation recommends for speed: no allocation per frame.
type gopacketParser struct {
	eth     layers.Ethernet
	vlan    layers.Dot1Q
	ip4     layers.IPv4
	ip6     layers.IPv6
	tcp     layers.TCP
	udp     layers.UDP
	payload gopacket.Payload
	parser  *gopacket.DecodingLayerParser
	decoded []gopacket.LayerType
}

func newGopacketParser() *gopacketParser {
	g := &gopacketParser{decoded: make([]gopacket.LayerType, 0, 8)}
	g.parser = gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet)
	dlc := gopacket.DecodingLayerContainer(gopacket.DecodingLayerSparse(nil))
	for _, l := range []gopacket.DecodingLayer{&g.eth, &g.vlan, &g.ip4, &g.ip6, &g.tcp, &g.udp, &g.payload} {
		dlc = dlc.Put(l)
	}
	g.parser.SetDecodingLayerContainer(dlc)
	// Stop quietly at a layer it has no decoder for (UDP port 53 is
	// decoded as DNS next, for instance): the 5-tuple is known by then.
	g.parser.IgnoreUnsupported = true
	return g
}

// parse decodes frame and fills k with its 5-tuple (and vni), as
// engine.ParsePacket does for TCP and UDP. It reports false for a frame
// that is not TCP or UDP over IPv4 or IPv6, or does not decode.
func (g *gopacketParser) parse(frame []byte, vni uint32, k *flow.Key) bool {
	if err := g.parser.DecodeLayers(frame, &g.decoded); err != nil {
		return false
	}
	var v4, v6 bool
	var proto uint8
	var sport, dport uint16
	for _, t := range g.decoded {
		switch t {
		case layers.LayerTypeIPv4:
			v4 = true
		case layers.LayerTypeIPv6:
			v6 = true
		case layers.LayerTypeTCP:
			proto, sport, dport = flow.ProtoTCP, uint16(g.tcp.SrcPort), uint16(g.tcp.DstPort)
		case layers.LayerTypeUDP:
			proto, sport, dport = flow.ProtoUDP, uint16(g.udp.SrcPort), uint16(g.udp.DstPort)
		}
	}
	switch {
	case proto == 0:
		return false
	case v4:
		k.SetIPv4(vni, proto, g.ip4.SrcIP, g.ip4.DstIP, sport, dport)
	case v6:
		k.SetIPv6(vni, proto, g.ip6.SrcIP, g.ip6.DstIP, sport, dport)
	default:
		return false
	}
	return true
}

// peerKey is the string kkdai/maglev hashes for a flow: the 5-tuple's
// bytes (13 for IPv4, 37 for IPv6), written into buf and viewed as a string
// without copying, so that building it neither formats nor allocates. The
// string aliases buf and is valid until buf is next written.
func peerKey(k *flow.Key, buf *[40]byte) string {
	alen := 4
	if k.Family == flow.FamilyIPv6 {
		alen = 16
	}
	n := copy(buf[:], k.Src[:alen])
	n += copy(buf[n:], k.Dst[:alen])
	binary.BigEndian.PutUint16(buf[n:], k.SrcPort)
	binary.BigEndian.PutUint16(buf[n+2:], k.DstPort)
	buf[n+4] = k.Proto
	return unsafe.String(&buf[0], n+5)
}

// pool is one VIP and its backends, from which both our flow.Rule and the
// peer's rule are built.
type pool struct {
	vip      netip.Addr
	proto    uint8
	port     uint16
	backends []string // names
}

// pipelinePools returns the VIPs that the pipeline traffic (pipelineMix)
// is sent to, each with n backends.
func pipelinePools(n int) []pool {
	names := backendNames(n)
	return []pool{
		{vip4, flow.ProtoTCP, vipTCPPort, names},
		{vip4, flow.ProtoUDP, vipUDPPort, names},
		{vip6, flow.ProtoTCP, vipTCPPort, names},
	}
}

// backendNames returns n backend names, "198.18.200.1:8080" and on.
func backendNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("198.18.%d.%d:8080", 200+i/250, 1+i%250)
	}
	return names
}

// ourRules builds the flow.Rules for pools, version 1, 5-tuple hashing.
func ourRules(pools []pool) (*flow.Rules, error) {
	rules := make([]flow.Rule, len(pools))
	for i, p := range pools {
		r := flow.Rule{
			Name: fmt.Sprintf("vip%d", i),
			VIP:  flow.VIP{Addr: p.vip, Proto: p.proto, Port: p.port},
			Mode: flow.Tuple5,
			// The peer's table size, so both look up the same amount of
			// memory.
			TableSize: flow.MaglevDefaultSize,
		}
		for j, name := range p.backends {
			r.Backends = append(r.Backends, flow.Backend{
				Name:   name,
				Addr:   netip.AddrFrom4([4]byte{198, 18, byte(200 + j/250), byte(1 + j%250)}),
				Host:   netip.AddrFrom4([4]byte{198, 18, 254, byte(1 + j%250)}),
				Weight: 1,
			})
		}
		rules[i] = r
	}
	rs := flow.NewRules()
	if _, err := rs.Update(1, rules); err != nil {
		return nil, err
	}
	return rs, nil
}

// peerVIP is the peer's rule index key.
type peerVIP struct {
	addr  [16]byte
	port  uint16
	proto uint8
}

// peerRule is the peer's rule: a kkdai/maglev table over the backend names
// and the name → backend index map to turn its answer into an index.
type peerRule struct {
	mg    *maglev.Maglev
	index map[string]int32
}

// peerBalancer is the Mux's parse and balance job written the way one would
// with the usual Go libraries: gopacket's DecodingLayerParser, a Go map from
// VIP to rule, a Go map as connection table, and kkdai/maglev for new
// flows. It runs as an engine stage so that the harness around it (MemPort,
// Worker) is the same as ours. It is deliberately not a straw man: the
// parser allocates nothing, the flow key is the same packed flow.Key as
// ours, and the Maglev key is a byte string built without allocating. It
// also does less than ours: no connection states, no timeouts, no
// concurrency (the maps belong to one worker), no flow hash for the encap
// stage.
type peerBalancer struct {
	parser *gopacketParser
	rules  map[peerVIP]*peerRule
	conns  map[flow.Key]int32 // nil: stateless, Maglev for every packet
	buf    [40]byte
}

// newPeerBalancer builds the peer over pools; stateful adds the Go map
// connection table, presized for flows.
func newPeerBalancer(pools []pool, stateful bool, flows int) (*peerBalancer, error) {
	pb := &peerBalancer{parser: newGopacketParser(), rules: map[peerVIP]*peerRule{}}
	for _, p := range pools {
		mg, err := maglev.NewMaglev(p.backends, flow.MaglevDefaultSize)
		if err != nil {
			return nil, err
		}
		r := &peerRule{mg: mg, index: map[string]int32{}}
		for i, n := range p.backends {
			r.index[n] = int32(i)
		}
		pb.rules[peerVIP{addr: keyAddr(p.vip), port: p.port, proto: p.proto}] = r
	}
	if stateful {
		pb.conns = make(map[flow.Key]int32, flows)
	}
	return pb, nil
}

// keyAddr lays out a like flow.Key does: IPv4 in the first four bytes.
func keyAddr(a netip.Addr) [16]byte {
	var out [16]byte
	if a.Is4() {
		a4 := a.As4()
		copy(out[:], a4[:])
		return out
	}
	return a.As16()
}

// Process implements engine.Stage.
func (pb *peerBalancer) Process(b *engine.Batch) {
	for _, p := range b.Packets() {
		k := &p.Key
		if !pb.parser.parse(p.Data(), 0, k) {
			b.Drop(p, engine.DropBadL4)
			continue
		}
		r := pb.rules[peerVIP{addr: k.Dst, port: k.DstPort, proto: k.Proto}]
		if r == nil {
			b.Drop(p, engine.DropNoRule)
			continue
		}
		if pb.conns != nil {
			if be, ok := pb.conns[*k]; ok {
				p.Backend = be
				continue
			}
		}
		name, err := r.mg.Get(peerKey(k, &pb.buf))
		if err != nil {
			b.Drop(p, engine.DropNoBackend)
			continue
		}
		p.Backend = r.index[name]
		if pb.conns != nil {
			pb.conns[*k] = p.Backend
		}
	}
}
