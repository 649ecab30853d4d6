package benchmarks

import (
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/xdplb/xdplb/flow/flowtest"
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

// targets addresses the generated traffic (flow/flowtest): TCP flows to
// vip4:80 (or vip6:80), UDP ones to vip4:53.
var targets = flowtest.Targets{
	TCP4:   netip.AddrPortFrom(vip4, vipTCPPort),
	UDP4:   netip.AddrPortFrom(vip4, vipUDPPort),
	TCP6:   netip.AddrPortFrom(vip6, vipTCPPort),
	SrcMAC: net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x00, 0x01},
	DstMAC: net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x00, 0x02},
}

// parseMix is the frame mix of the parse benchmark; pipelineMix that of the
// pipeline benchmark (mostly IPv4 TCP, as a web VIP sees).
var (
	parseMix    = flowtest.Mix{flowtest.TCP4: 40, flowtest.UDP4: 30, flowtest.TCP6: 20, flowtest.TCP4VLAN: 10}
	pipelineMix = flowtest.Mix{flowtest.TCP4: 60, flowtest.UDP4: 20, flowtest.TCP6: 10, flowtest.TCP4VLAN: 10}
)

// genFlows returns n distinct flows of mix m from seed (flowtest.Flows):
// the same arguments give the same flows.
func genFlows(n int, m flowtest.Mix, seed uint64) []flowtest.Flow {
	return flowtest.Flows(n, flowtest.Config{Mix: m, Seed: seed})
}

// trafficSet is a generated set of flows and one frame per flow, in flow
// order. The frames share one backing array.
type trafficSet struct {
	flows  []flowtest.Flow
	frames [][]byte
}

var (
	trafficMu    sync.Mutex
	trafficCache = map[string]*trafficSet{}
)

// traffic returns (and caches for the process) n flows of mix m from seed,
// with one frame each. Building a million frames takes a few seconds and
// about 100 MB, so benchmarks share one copy across -count runs.
func traffic(n int, m flowtest.Mix, seed uint64) *trafficSet {
	id := fmt.Sprint(n, m, seed)
	trafficMu.Lock()
	defer trafficMu.Unlock()
	if t, ok := trafficCache[id]; ok {
		return t
	}
	flows := genFlows(n, m, seed)
	t := &trafficSet{flows: flows, frames: targets.Frames(flows)}
	trafficCache[id] = t
	return t
}
