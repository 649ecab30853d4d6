package mux

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

const docVNIs = `
version: 1
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    backends:
      - {name: a, address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}
  - name: web-udp
    address: 198.18.100.1
    protocol: udp
    port: 443
    vni: 100
    backends:
      - {name: a, address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}
  - name: dns
    address: 2001:db8:100::53
    protocol: udp
    port: 53
    vni: 200
    backends:
      - {name: c, address: 2001:db8:200::1, mac: "02:00:00:00:02:01", host: 198.19.0.2}
`

const docOneVNI = `
version: 1
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 7
    backends:
      - {name: a, address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}
`

// TestUplinkVNI checks that packets from the uplink (keyed with VNI 0 by
// Parse) get their VIP's VNI, so the balancing stage finds the rule, and
// that packets to other addresses keep VNI 0.
func TestUplinkVNI(t *testing.T) {
	client4 := netip.MustParseAddrPort("198.18.5.2:40000")
	client6 := netip.MustParseAddrPort("[2001:db8:5::2]:40000")
	tests := []struct {
		name    string
		doc     string
		key     flow.Key
		wantVNI uint32
	}{
		{"tcp VIP", docVNIs, flow.KeyFrom(0, flow.ProtoTCP, client4, netip.MustParseAddrPort("198.18.100.1:80")), 100},
		{"other protocol, same address", docVNIs, flow.KeyFrom(0, flow.ProtoUDP, client4, netip.MustParseAddrPort("198.18.100.1:443")), 100},
		{"IPv6 VIP", docVNIs, flow.KeyFrom(0, flow.ProtoUDP, client6, netip.MustParseAddrPort("[2001:db8:100::53]:53")), 200},
		{"ICMP to a VIP address", docVNIs, flow.KeyFrom(0, flow.ProtoICMPv6, client6, netip.MustParseAddrPort("[2001:db8:100::53]:0")), 200},
		{"not a VIP", docVNIs, flow.KeyFrom(0, flow.ProtoTCP, client4, netip.MustParseAddrPort("198.18.100.9:80")), 0},
		{"every VIP in one VNI", docOneVNI, flow.KeyFrom(0, flow.ProtoTCP, client4, netip.MustParseAddrPort("198.18.100.1:80")), 7},
		{"VNI 0 everywhere", doc1, flow.KeyFrom(0, flow.ProtoTCP, client4, netip.MustParseAddrPort("198.18.100.1:80")), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := control.Parse([]byte(tc.doc))
			require.NoError(t, err)
			c, err := NewController(ControllerConfig{Rules: flow.NewRules(), Checker: &fakeChecker{}})
			require.NoError(t, err)
			require.NoError(t, c.Apply(doc))

			var b engine.Batch
			p := &engine.Packet{Key: tc.key}
			require.True(t, b.Append(p))
			uplinkVNI{c.rules}.Process(&b)
			require.Equal(t, tc.wantVNI, p.Key.VNI)
			if tc.wantVNI != 0 {
				// The ICMP stage asks IsVIPAddr, the balancing stage Lookup.
				snap := c.rules.Load()
				require.True(t, snap.IsVIPAddr(&p.Key), "a VIP address with the VNI set")
				if p.Key.Proto == flow.ProtoTCP || p.Key.Proto == flow.ProtoUDP {
					require.NotNil(t, snap.Lookup(&p.Key), "the rule is found with the VNI set")
				}
			}
		})
	}
}

// TestUplinkVNIRefusesAmbiguousAddress: a VIP address in two VNIs cannot
// be told apart on the uplink; the document is refused whole.
func TestUplinkVNIRefusesAmbiguousAddress(t *testing.T) {
	doc, err := control.Parse([]byte(`
version: 1
vips:
  - {name: a, address: 198.18.100.1, protocol: tcp, port: 80, vni: 100}
  - {name: b, address: 198.18.100.1, protocol: tcp, port: 80, vni: 200}
`))
	require.NoError(t, err, "valid as a document: the VIPs differ by VNI")
	rules := flow.NewRules()
	c, err := NewController(ControllerConfig{Rules: rules, Checker: &fakeChecker{}})
	require.NoError(t, err)
	err = c.Apply(doc)
	require.ErrorContains(t, err, "a VIP address must belong to one VNI")
	require.Zero(t, c.Version())
	require.Zero(t, rules.Load().Version)
}

func TestUplinkVNINoAllocs(t *testing.T) {
	for _, d := range []string{docVNIs, docOneVNI, doc1} {
		doc, err := control.Parse([]byte(d))
		require.NoError(t, err)
		c, err := NewController(ControllerConfig{Rules: flow.NewRules(), Checker: &fakeChecker{}})
		require.NoError(t, err)
		require.NoError(t, c.Apply(doc))
		var b engine.Batch
		pkts := make([]engine.Packet, engine.MaxBatch)
		for i := range pkts {
			pkts[i].Key = flow.KeyFrom(0, flow.ProtoTCP, netip.MustParseAddrPort("198.18.5.2:40000"), netip.MustParseAddrPort("198.18.100.1:80"))
			b.Append(&pkts[i])
		}
		s := uplinkVNI{c.rules}
		require.Zero(t, testing.AllocsPerRun(100, func() { s.Process(&b) }))
	}
}

// TestUplinkVNIMany: with many VIPs of both families in many VNIs (long
// probe chains included) every VIP address gets its VNI, and addresses
// that are no VIP's keep VNI 0.
func TestUplinkVNIMany(t *testing.T) {
	doc := &control.Document{Version: 1}
	var addrs []netip.Addr
	for i := 0; i < 700; i++ {
		a := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		if i%3 == 0 {
			a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)})
		}
		addrs = append(addrs, a)
		doc.VIPs = append(doc.VIPs, control.VIP{Name: a.String(), Address: a, Protocol: flow.ProtoTCP, Port: 80,
			VNI: uint32(1 + i%50), Distribution: flow.Tuple5})
	}
	c, err := NewController(ControllerConfig{Rules: flow.NewRules(), Checker: &fakeChecker{}})
	require.NoError(t, err)
	require.NoError(t, c.Apply(doc))
	run := func(a netip.Addr) uint32 {
		var b engine.Batch
		p := &engine.Packet{Key: flow.KeyFrom(0, flow.ProtoTCP, netip.AddrPortFrom(a, 1), netip.AddrPortFrom(a, 80))}
		require.True(t, b.Append(p))
		uplinkVNI{c.rules}.Process(&b)
		return p.Key.VNI
	}
	for i, a := range addrs {
		require.Equal(t, uint32(1+i%50), run(a), a)
	}
	for _, s := range []string{"198.18.9.9", "2001:db8::9:9", "2001:db8::1:0", "0.0.0.0"} {
		require.Zero(t, run(netip.MustParseAddr(s)), s)
	}
}
