package hostagent

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/internal/node"
	"github.com/xdplb/xdplb/nat"
)

// The Agent is what a port allocator drives.
var _ node.OutboundAgent = (*Agent)(nil)

// outPipeDoc is pipeDoc with vm_a (198.18.4.1) going out through the web
// VIP's address, with a static range and its VNI's network local.
const outPipeDoc = pipeDoc + `outbound:
  - address: 198.18.100.1
    vni: 100
    dips: [198.18.4.1]
    unit: 64
    static:
      - {dip: 198.18.4.1, ports: 1024-1087}
    local: [198.18.4.0/24]
`

var (
	vmA      = netip.MustParseAddr("198.18.4.1")
	vmAMAC   = net.HardwareAddr{2, 0, 0, 0, 4, 1}
	internet = netip.MustParseAddrPort("198.18.60.1:443")
)

func TestPlanOutbound(t *testing.T) {
	doc, err := control.Parse([]byte(outPipeDoc))
	require.NoError(t, err)
	p, err := NewPlan(doc, "host-1", nil)
	require.NoError(t, err)
	vip := netip.MustParseAddr("198.18.100.1")
	assert.Equal(t, []nat.Outbound{{VIP: vip, VNI: 100, DIPs: []netip.Addr{vmA},
		Local: []netip.Prefix{netip.MustParsePrefix("198.18.4.0/24")}}}, p.Outbound)
	assert.Equal(t, []flow.PortAllocation{{VIP: vip, First: 1024, Last: 1087,
		Owner: flow.PortOwner{DIP: vmA, Host: pipeHost, VNI: 100, MAC: [6]byte(vmAMAC)}}}, p.OutboundStatic)
	a, _ := p.Port("vm_a")
	b, _ := p.Port("vm_b")
	// vm_a: its service port and every port; vm_b: its service port.
	assert.Contains(t, a.Steer.Src, steer.SrcRule{Addr: vmA, Port: 0})
	assert.Contains(t, a.Steer.Src, steer.SrcRule{Addr: vmA, Port: 8080})
	assert.Equal(t, []steer.SrcRule{{Addr: netip.MustParseAddr("198.18.4.2"), Port: 8080}}, b.Steer.Src)
	// Multicast, broadcast and link-local never steered from vm_a; vm_b
	// vetoes the infrastructure only.
	for _, pf := range outboundVeto {
		assert.Contains(t, a.Steer.Infra, pf)
		assert.NotContains(t, b.Steer.Infra, pf)
	}
	for _, pf := range p.Infra {
		assert.Contains(t, a.Steer.Infra, pf)
	}
	// A host without outbound DIPs has no outbound configuration.
	p2, err := NewPlan(doc, "host-1", nil)
	require.NoError(t, err)
	doc.Outbound = nil
	p3, err := NewPlan(doc, "host-1", nil)
	require.NoError(t, err)
	assert.Empty(t, p3.Outbound)
	assert.Empty(t, p3.OutboundStatic)
	assert.NotEqual(t, p2.Ports[0].Steer, p3.Ports[0].Steer)
}

// TestPipelinesOutbound: a VM's connection to the outside leaves on the
// uplink with the VIP as its source, routed like a DSR reply; the Mux's
// VXLAN with the answer reaches the VM translated back; east-west
// traffic goes to the slow path untranslated; the ranges given to the
// agent add to the static ones.
func TestPipelinesOutbound(t *testing.T) {
	r := newPipeRigDoc(t, outPipeDoc, true)
	vm := netip.AddrPortFrom(vmA, 40000)
	r.ports[1].Inject(gpkt.Serialize(t, tcpLayers(uplinkMAC, vmAMAC, vm, internet, true, false, "")...))
	r.w.Poll()
	out := r.ports[UplinkPort].Transmitted()
	require.Len(t, out, 1)
	eth, src, dst, _ := decodeTCP(t, out[0])
	assert.Equal(t, routerMAC.String(), eth.DstMAC.String())
	assert.Equal(t, netip.MustParseAddr("198.18.100.1"), src.Addr())
	assert.True(t, src.Port() >= 1024 && src.Port() <= 1087, "port %d from the static range", src.Port())
	assert.Equal(t, internet, dst)
	assert.Equal(t, uint8(63), out[0][14+8], "routed: TTL one less")

	// The answer, through a Mux: VXLAN in the DIP's VNI, the DIP's MAC.
	inner := gpkt.Serialize(t, tcpLayers(vmAMAC, net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, internet, src, true, true, "")...)
	r.ports[UplinkPort].Inject(wrapVXLAN(t, inner, nil))
	r.w.Poll()
	in := r.ports[1].Transmitted()
	require.Len(t, in, 1)
	_, src2, dst2, _ := decodeTCP(t, in[0])
	assert.Equal(t, internet, src2)
	assert.Equal(t, vm, dst2)

	// East-west: untranslated, to the slow path (the host routes it).
	east := gpkt.Serialize(t, tcpLayers(uplinkMAC, vmAMAC, vm, netip.MustParseAddrPort("198.18.4.2:22"), true, false, "")...)
	r.ports[1].Inject(east)
	r.w.Poll()
	slow := r.ports[len(r.ports)-1].Transmitted()
	require.Len(t, slow, 1)
	_, src3, dst3, _ := decodeTCP(t, slow[0])
	assert.Equal(t, vm, src3, "untranslated")
	assert.Equal(t, netip.MustParseAddrPort("198.18.4.2:22"), dst3)
	assert.Equal(t, uint8(63), slow[0][14+8], "routed by the host: TTL one less, as a direct connection's")

	st := r.a.SNAT().Stats()
	assert.EqualValues(t, 1, st.Out)
	assert.EqualValues(t, 1, st.In)
	assert.EqualValues(t, 1, st.Local)

	// Given ranges add to the static ones; usage covers both.
	vip := netip.MustParseAddr("198.18.100.1")
	given := flow.PortAllocation{VIP: vip, First: 2048, Last: 2111, Owner: flow.PortOwner{DIP: vmA, Host: pipeHost, VNI: 100}}
	r.a.SetOutboundAllocations([]flow.PortAllocation{given})
	use := r.a.OutboundUsage(nil)
	require.Len(t, use, 2)
	assert.Equal(t, 1, use[0].Conns, "the connection, in the static range")
	assert.Equal(t, given, use[1].PortAllocation)
	assert.Len(t, r.a.SNAT().Allocations(), 2)
	// A new document keeps the given ranges.
	doc, err := control.Parse([]byte(outPipeDoc))
	require.NoError(t, err)
	doc.Version = 2
	require.NoError(t, r.a.apply(doc))
	assert.Len(t, r.a.SNAT().Allocations(), 2)
}
