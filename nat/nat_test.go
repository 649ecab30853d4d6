package nat_test

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/nat"
)

// TestInbound: a client packet for VIP:vport leaves as the exact frame
// gopacket builds for DIP:dport (so every checksum is gopacket's), the key
// follows, and the connection is recorded under its return key.
func TestInbound(t *testing.T) {
	tests := []struct {
		name    string
		in      pkt
		wantDst netip.AddrPort
		backend [2]string // rule, backend
		class   flow.StateClass
		vport   uint16 // stored VIP port, for all-ports rules with a fixed backend port
	}{
		{"tcp4 port remapped", tcp(ap(client4, 40000), ap(vipA, 80)).to(macA), ap(dipA, 8080), [2]string{"web", "a"}, flow.ClassUntrusted, 0},
		{"tcp4 other local backend", tcp(ap(client4, 40001), ap(vipA, 80)).to(macB), ap(dipB, 8080), [2]string{"web", "b"}, flow.ClassUntrusted, 0},
		{"tcp4 syn", pkt{src: ap(client4, 40002), dst: ap(vipA, 80), syn: true}.to(macA), ap(dipA, 8080), [2]string{"web", "a"}, flow.ClassUntrusted, 0},
		{"udp4 port preserved", udp(ap(client4, 5353), ap(vipA, 53)).to(macA), ap(dipA, 53), [2]string{"dns", "a"}, flow.ClassUntrusted, 0},
		{"tcp4 all-ports preserved", tcp(ap(client4, 40003), ap(vipB, 2222)).to(macB), ap(dipB, 2222), [2]string{"all-tcp", "b"}, flow.ClassUntrusted, 0},
		{"udp4 all-ports remapped", udp(ap(client4, 40004), ap(vipC, 7777)).to(macA), ap(dipA, 9000), [2]string{"all-udp-remap", "a"}, flow.ClassUntrusted, 7777},
		{"tcp6 port remapped", tcp(ap(client6, 40005), ap(vip6, 443)).to(mac6), ap(dip6, 8443), [2]string{"web6", "6"}, flow.ClassUntrusted, 0},
		{"udp6 port preserved", udp(ap(client6, 40006), ap(vip6, 53)).to(mac6), ap(dip6, 53), [2]string{"dns6", "6"}, flow.ClassUntrusted, 0},
		{"udp6 port remapped", udp(ap(client6, 40007), ap(vip6, 5353)).to(mac6), ap(dip6, 5300), [2]string{"dns6-remap", "6"}, flow.ClassUntrusted, 0},
		{"icmp4 echo to a VIP with an ICMP rule", pkt{src: ap(client4, 0), dst: ap(vipA, 0), proto: flow.ProtoICMP}.to(macA), ap(dipA, 0), [2]string{"ping", "a"}, flow.ClassUntrusted, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testRules(), testLocals())
			res := e.inbound(tc.in)
			require.Empty(t, res.reason)
			require.Equal(t, tc.in.withDst(tc.wantDst).frame(), res.frame, "translated frame")
			require.Equal(t, flow.KeyFrom(vni, tc.in.protocol(), tc.in.src, tc.wantDst), res.p.Key)
			require.EqualValues(t, 3, res.p.OutPort, "Inbound leaves OutPort to Decap")
			require.Equal(t, tc.backend[0], res.p.Rule.Name)
			require.Equal(t, tc.backend[1], res.p.Rule.Backends[res.p.Backend].Name)

			st, ok := e.state(res.p.Key.Proto, vni, tc.wantDst, tc.in.src)
			require.True(t, ok, "state under the return key")
			require.Equal(t, e.backendID(tc.backend[0], tc.backend[1]), st.BackendID)
			require.Equal(t, tc.class, st.Class)
			require.Equal(t, tc.vport != 0, st.HasVIPPort)
			require.Equal(t, tc.vport, st.VIPPort)
			require.EqualValues(t, 1, e.tr.Stats().Inbound)
			require.EqualValues(t, 1, e.tr.Stats().NewFlows)
		})
	}
}

// TestReturn: after the inbound packet, the server's reply from DIP:dport
// leaves the uplink as exactly the frame gopacket builds from VIP:vport.
func TestReturn(t *testing.T) {
	tests := []struct {
		name string
		in   pkt
		dip  netip.AddrPort
	}{
		{"tcp4 port remapped", tcp(ap(client4, 40000), ap(vipA, 80)).to(macA), ap(dipA, 8080)},
		{"udp4 port preserved", udp(ap(client4, 5353), ap(vipA, 53)).to(macA), ap(dipA, 53)},
		{"tcp4 all-ports preserved", tcp(ap(client4, 40003), ap(vipB, 2222)).to(macB), ap(dipB, 2222)},
		{"udp4 all-ports remapped (stored VIP port)", udp(ap(client4, 40004), ap(vipC, 7777)).to(macA), ap(dipA, 9000)},
		{"tcp6 port remapped", tcp(ap(client6, 40005), ap(vip6, 443)).to(mac6), ap(dip6, 8443)},
		{"udp6 port preserved", udp(ap(client6, 40006), ap(vip6, 53)).to(mac6), ap(dip6, 53)},
		{"udp6 port remapped", udp(ap(client6, 40007), ap(vip6, 5353)).to(mac6), ap(dip6, 5300)},
		{"icmp4 echo reply", pkt{src: ap(client4, 0), dst: ap(vipA, 0), proto: flow.ProtoICMP}.to(macA), ap(dipA, 0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testRules(), testLocals())
			require.Empty(t, e.inbound(tc.in).reason)
			rep := tc.in.withDst(tc.dip).reply()
			res := e.reply(rep)
			require.Empty(t, res.reason)
			require.Equal(t, rep.withSrc(tc.in.dst).frame(), res.frame, "reply from the VIP")
			require.EqualValues(t, uplink, res.p.OutPort)
			require.Equal(t, tc.in.dst, netip.AddrPortFrom(res.p.Key.SrcAddr(), res.p.Key.SrcPort))
			require.NotNil(t, res.p.Rule)
			require.Equal(t, tc.dip.Addr(), res.p.Rule.Backends[res.p.Backend].Addr)
			s := e.tr.Stats()
			require.EqualValues(t, 1, s.Return)
			require.Zero(t, s.Stateless)
		})
	}
}

// TestRoundTrip: the client's packet goes through Inbound; the VM's reply
// is made by gopacket from what the VM received (endpoints swapped) and
// goes through Return; the client gets a reply from VIP:vport to itself,
// whose checksums gopacket recomputes to the same values.
func TestRoundTrip(t *testing.T) {
	for _, in := range []pkt{
		tcp(ap(client4, 33000), ap(vipA, 80)).to(macA),
		udp(ap(client4, 33001), ap(vipC, 4444)).to(macA),
		tcp(ap(client6, 33002), ap(vip6, 443)).to(mac6),
		udp(ap(client6, 33003), ap(vip6, 53)).to(mac6),
	} {
		t.Run(in.dst.String(), func(t *testing.T) {
			e := newEnv(t, testRules(), testLocals())
			got := e.inbound(in)
			require.Empty(t, got.reason)
			gopacketChecksumsOK(t, got.frame)

			// The VM answers: swap the endpoints of what it received.
			reply := swapEndpoints(t, got.frame)
			back := e.run(e.ret, reply, vni)
			require.Empty(t, back.reason)
			pk := gopacketChecksumsOK(t, back.frame)

			src, dst := endpoints(t, pk)
			require.Equal(t, in.dst, src, "the client sees the VIP")
			require.Equal(t, in.src, dst)
		})
	}
}

// swapEndpoints returns frame with source and destination (addresses and
// ports) swapped, built again by gopacket with fresh checksums.
func swapEndpoints(t *testing.T, frame []byte) []byte {
	pk := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	require.NotNil(t, pk.TransportLayer())
	var nl gopacket.NetworkLayer
	var ls []gopacket.SerializableLayer
	for _, l := range pk.Layers() {
		switch v := l.(type) {
		case *layers.Ethernet:
			v.SrcMAC, v.DstMAC = v.DstMAC, v.SrcMAC
		case *layers.IPv4:
			v.SrcIP, v.DstIP = v.DstIP, v.SrcIP
			nl = v
		case *layers.IPv6:
			v.SrcIP, v.DstIP = v.DstIP, v.SrcIP
			nl = v
		case *layers.TCP:
			v.SrcPort, v.DstPort = v.DstPort, v.SrcPort
			require.NoError(t, v.SetNetworkLayerForChecksum(nl))
		case *layers.UDP:
			v.SrcPort, v.DstPort = v.DstPort, v.SrcPort
			require.NoError(t, v.SetNetworkLayerForChecksum(nl))
		}
		ls = append(ls, l.(gopacket.SerializableLayer))
		if l == pk.TransportLayer() {
			ls = append(ls, gopacket.Payload(l.LayerPayload()))
			break
		}
	}
	return gpkt.MustSerialize(ls...)
}

func endpoints(t *testing.T, pk gopacket.Packet) (src, dst netip.AddrPort) {
	var sa, da netip.Addr
	switch v := pk.NetworkLayer().(type) {
	case *layers.IPv4:
		sa, da = netip.AddrFrom4([4]byte(v.SrcIP.To4())), netip.AddrFrom4([4]byte(v.DstIP.To4()))
	case *layers.IPv6:
		sa, da = netip.AddrFrom16([16]byte(v.SrcIP)), netip.AddrFrom16([16]byte(v.DstIP))
	}
	var sp, dp uint16
	switch v := pk.TransportLayer().(type) {
	case *layers.TCP:
		sp, dp = uint16(v.SrcPort), uint16(v.DstPort)
	case *layers.UDP:
		sp, dp = uint16(v.SrcPort), uint16(v.DstPort)
	}
	return netip.AddrPortFrom(sa, sp), netip.AddrPortFrom(da, dp)
}

// TestStateClasses: the connection's class follows the client's TCP flags
// (and the server's FIN/RST), as the ConnTable's timeouts expect.
func TestStateClasses(t *testing.T) {
	e := newEnv(t, testRules(), testLocals())
	c, v, d := ap(client4, 41000), ap(vipA, 80), ap(dipA, 8080)
	client := func(p pkt) { t.Helper(); require.Empty(t, e.inbound(p.to(macA)).reason) }
	server := func(p pkt) { t.Helper(); require.Empty(t, e.reply(p).reason) }
	class := func() flow.StateClass {
		t.Helper()
		st, ok := e.state(flow.ProtoTCP, vni, d, c)
		require.True(t, ok)
		return st.Class
	}
	prove := e.table.Conns().ProveAfter()
	syn := pkt{src: c, dst: v, syn: true}
	client(syn)
	require.Equal(t, flow.ClassUntrusted, class(), "SYN")
	server(pkt{src: d, dst: c, syn: true, ack: true}) // SYN-ACK does not promote
	require.Equal(t, flow.ClassUntrusted, class(), "SYN-ACK")
	e.now += 5
	client(tcp(c, v))
	require.Equal(t, flow.ClassUntrusted, class(), "the handshake's ACK, 5 ms after the SYN")
	e.now += prove
	client(tcp(c, v))
	require.Equal(t, flow.ClassEstablished, class(), "a segment ProveAfter after the SYN")
	client(syn)
	require.Equal(t, flow.ClassEstablished, class(), "a SYN does not demote")
	server(tcp(d, c))
	require.Equal(t, flow.ClassEstablished, class())
	client(pkt{src: c, dst: v, fin: true, ack: true})
	require.Equal(t, flow.ClassClosing, class(), "FIN")
	client(tcp(c, v))
	require.Equal(t, flow.ClassClosing, class(), "closing is final")
	client(syn)
	require.Equal(t, flow.ClassUntrusted, class(), "a new SYN reuses the tuple")

	// The server closes a proven connection; its RST to an unproven one
	// (a flood's spoofed ACK) proves nothing.
	c2 := ap(client4, 41001)
	client(pkt{src: c2, dst: v, syn: true})
	client(tcp(c2, v))
	server(pkt{src: d, dst: c2, rst: true})
	st, _ := e.state(flow.ProtoTCP, vni, d, c2)
	require.Equal(t, flow.ClassUntrusted, st.Class, "server RST to an unproven connection")
	e.now += prove
	client(tcp(c2, v))
	server(pkt{src: d, dst: c2, rst: true})
	st, _ = e.state(flow.ProtoTCP, vni, d, c2)
	require.Equal(t, flow.ClassClosing, st.Class, "server RST")

	// First seen mid-stream: untrusted, and a burst does not prove it.
	c3 := ap(client4, 41002)
	client(tcp(c3, v))
	st, _ = e.state(flow.ProtoTCP, vni, d, c3)
	require.Equal(t, flow.ClassUntrusted, st.Class)
	client(tcp(c3, v))
	st, _ = e.state(flow.ProtoTCP, vni, d, c3)
	require.Equal(t, flow.ClassUntrusted, st.Class)
	e.now += prove
	client(tcp(c3, v))
	st, _ = e.state(flow.ProtoTCP, vni, d, c3)
	require.Equal(t, flow.ClassEstablished, st.Class)

	// Idle timeouts follow the class: untrusted expires after 10s.
	c4 := ap(client4, 41003)
	client(pkt{src: c4, dst: v, syn: true})
	e.now += flow.Ticks(flow.DefaultTimeouts().Untrusted) + 1
	_, ok := e.state(flow.ProtoTCP, vni, d, c4)
	require.False(t, ok, "untrusted entry expired")
}

// TestStateless: with no state (the agent restarted), a reply whose source
// is the local endpoint of exactly one rule is translated by that rule and
// counted; none or several rules: dropped (several counted as ambiguous).
func TestStateless(t *testing.T) {
	rules := append(testRules(),
		// Two VIPs served by the same DIP endpoint: ambiguous.
		flow.Rule{Name: "amb1", VIP: flow.VIP{Addr: netip.MustParseAddr("198.18.100.8"), Proto: flow.ProtoTCP, Port: 80, VNI: vni},
			Backends: []flow.Backend{{Name: "b", Addr: dipB, Port: 7000, MAC: macB, Weight: 1}}},
		flow.Rule{Name: "amb2", VIP: flow.VIP{Addr: netip.MustParseAddr("198.18.100.9"), Proto: flow.ProtoTCP, Port: 80, VNI: vni},
			Backends: []flow.Backend{{Name: "b", Addr: dipB, Port: 7000, MAC: macB, Weight: 1}}},
	)
	tests := []struct {
		name   string
		reply  pkt
		want   netip.AddrPort // translated source; invalid when dropped
		reason string
	}{
		{"unique, fixed VIP port", tcp(ap(dipA, 8080), ap(client4, 1)), ap(vipA, 80), ""},
		{"unique, udp port preserved", udp(ap(dipA, 53), ap(client4, 2)), ap(vipA, 53), ""},
		{"unique, all-ports preserved", tcp(ap(dipB, 2345), ap(client4, 3)), ap(vipB, 2345), ""},
		{"unique, v6", tcp(ap(dip6, 8443), ap(client6, 4)), ap(vip6, 443), ""},
		{"all-ports remapped: VIP port unknown", udp(ap(dipA, 9000), ap(client4, 5)), netip.AddrPort{}, "nat_no_state"},
		{"ambiguous", tcp(ap(dipB, 7000), ap(client4, 6)), netip.AddrPort{}, "nat_no_state"},
		{"no rule for the port", udp(ap(dipA, 54), ap(client4, 7)), netip.AddrPort{}, "nat_no_state"},
		{"not a local DIP", tcp(ap(dipR, 8080), ap(client4, 8)), netip.AddrPort{}, "nat_no_state"},
		{"wrong protocol", udp(ap(dipA, 8080), ap(client4, 9)), netip.AddrPort{}, "nat_no_state"},
		{"a SYN is never a reply", pkt{src: ap(dipA, 8080), dst: ap(client4, 10), syn: true}, netip.AddrPort{}, "nat_no_state"},
		// A SYN-ACK without state answers a SYN that did not come
		// through the VIP: a direct connection (TestDirectConnections),
		// dropped here, where no Config.Direct port is set.
		{"a SYN-ACK is direct", pkt{src: ap(dipA, 8080), dst: ap(client4, 11), syn: true, ack: true}, netip.AddrPort{}, "nat_direct"},
		{"a non-SYN is", pkt{src: ap(dipA, 8080), dst: ap(client4, 11), ack: true}, ap(vipA, 80), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, rules, testLocals())
			res := e.reply(tc.reply)
			require.Equal(t, tc.reason, res.reason)
			s := e.tr.Stats()
			if tc.reason != "" {
				require.Zero(t, s.Stateless)
				require.Equal(t, tc.name == "ambiguous", s.Ambiguous == 1, "ambiguous counted")
				return
			}
			require.Equal(t, tc.reply.withSrc(tc.want).frame(), res.frame)
			require.EqualValues(t, uplink, res.p.OutPort)
			require.EqualValues(t, 1, s.Stateless)
			require.Zero(t, e.table.Len(), "the stateless path enters nothing")
		})
	}
}

// TestInfraNeverTranslated: infrastructure addresses are never translated,
// on either path, by state or statelessly.
func TestInfraNeverTranslated(t *testing.T) {
	rules := append(testRules(), flow.Rule{Name: "web6b", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoTCP, Port: 444, VNI: vni},
		Backends: []flow.Backend{{Name: "6", Addr: dip6, Port: 8444, MAC: mac6, Weight: 1}}})
	e := newEnv(t, rules, testLocals())
	prober6 := netip.MustParseAddr("2001:db8:200::5")

	// Inbound from a prober to the VIP.
	require.Equal(t, "nat_infra", e.inbound(tcp(ap(prober, 1), ap(vipA, 80)).to(macA)).reason)
	require.Equal(t, "nat_infra", e.inbound(tcp(ap(prober6, 1), ap(vip6, 443)).to(mac6)).reason)
	require.Zero(t, e.table.Len())

	// A reply to a prober that the stateless path would translate.
	require.Equal(t, "nat_infra", e.reply(tcp(ap(dipA, 8080), ap(prober, 1))).reason)
	require.Equal(t, "nat_infra", e.reply(tcp(ap(dip6, 8444), ap(prober6, 1))).reason)

	// Even with state (entered behind the stages' back).
	k := flow.KeyFrom(vni, flow.ProtoTCP, ap(dipA, 8080), ap(prober, 2))
	require.True(t, e.table.Conns().Insert(&k, e.backendID("web", "a"), flow.ClassEstablished, e.now).Stored())
	require.Equal(t, "nat_infra", e.reply(tcp(ap(dipA, 8080), ap(prober, 2))).reason)

	// Non-first fragments too.
	require.Equal(t, "nat_infra", e.reply(udp(ap(dipA, 53), ap(prober, 3)).withFrag(2)).reason)

	s := e.tr.Stats()
	require.Zero(t, s.Inbound+s.Return+s.Stateless+s.Fragments)
	require.EqualValues(t, 6, e.drops("nat_infra"))
}

func (p pkt) withFrag(f int) pkt { p.frag = f; return p }

func (e *env) drops(reason string) uint64 { return e.drop[reason] }

// TestTenantIsolation: two tenants use the same VIP and DIP addresses in
// VNI 100 and 200; neither's packets or state are seen by the other.
func TestTenantIsolation(t *testing.T) {
	rule := func(v uint32, port uint16, mac header.MAC) flow.Rule {
		return flow.Rule{Name: "web", VIP: flow.VIP{Addr: vipA, Proto: flow.ProtoTCP, Port: 80, VNI: v},
			Backends: []flow.Backend{{Name: "a", Addr: dipA, Port: port, MAC: mac, Weight: 1}}}
	}
	mac200 := header.MAC{0x02, 0, 0, 0x02, 0, 0x01}
	rules := []flow.Rule{rule(100, 8100, macA), rule(200, 8200, mac200)}
	// VNI 300 has the rule but no local DIP.
	rules = append(rules, rule(300, 8300, macA))
	locals := []nat.DIP{{VNI: 100, Addr: dipA}, {VNI: 200, Addr: dipA}}
	e := newEnv(t, rules, locals)
	c := ap(client4, 50000)

	r100 := e.run(e.in, tcp(c, ap(vipA, 80)).to(macA).frame(), 100)
	require.Empty(t, r100.reason)
	require.Equal(t, tcp(c, ap(dipA, 8100)).to(macA).frame(), r100.frame)
	r200 := e.run(e.in, tcp(c, ap(vipA, 80)).to(mac200).frame(), 200)
	require.Empty(t, r200.reason)
	require.Equal(t, tcp(c, ap(dipA, 8200)).to(mac200).frame(), r200.frame)
	require.Equal(t, "nat_no_local_backend", e.run(e.in, tcp(c, ap(vipA, 80)).to(macA).frame(), 300).reason)
	require.Equal(t, "nat_no_rule", e.run(e.in, tcp(c, ap(vipA, 80)).to(macA).frame(), 400).reason)

	// Two entries with the same addresses, one per VNI.
	s100, ok := e.state(flow.ProtoTCP, 100, ap(dipA, 8100), c)
	require.True(t, ok)
	s200, ok := e.state(flow.ProtoTCP, 200, ap(dipA, 8200), c)
	require.True(t, ok)
	require.NotEqual(t, s100.BackendID, s200.BackendID)
	_, ok = e.state(flow.ProtoTCP, 200, ap(dipA, 8100), c)
	require.False(t, ok)

	// Replies find their own tenant's state only.
	rep := tcp(ap(dipA, 8100), c)
	require.Equal(t, rep.withSrc(ap(vipA, 80)).frame(), e.run(e.ret, rep.frame(), 100).frame)
	// The same bytes from the VNI 200 VM: no state there, and the
	// stateless index of VNI 200 knows only port 8200.
	require.Equal(t, "nat_no_state", e.run(e.ret, rep.frame(), 200).reason)
	require.EqualValues(t, 1, e.tr.Stats().Return)
	require.Zero(t, e.tr.Stats().Stateless)
	// VNI 200's endpoint is translated statelessly only in VNI 200.
	rep200 := tcp(ap(dipA, 8200), ap(client4, 50001))
	require.Equal(t, "nat_no_state", e.run(e.ret, rep200.frame(), 100).reason)
	require.Empty(t, e.run(e.ret, rep200.frame(), 200).reason)
	require.EqualValues(t, 1, e.tr.Stats().Stateless)
}

// TestReloadKeepsState: backend IDs are stable across reloads, so a
// connection's state survives a new rules version that reorders and grows
// the pool; a backend that is removed, or whose port changes, makes its
// state stale and its replies go the stateless way.
func TestReloadKeepsState(t *testing.T) {
	e := newEnv(t, testRules(), testLocals())
	c := ap(client4, 42000)
	require.Empty(t, e.inbound(tcp(c, ap(vipA, 80)).to(macA)).reason)
	rep := tcp(ap(dipA, 8080), c)

	// Version 2: pool reordered, a backend added, and a rule that makes
	// the DIP endpoint ambiguous for the stateless path, so only the
	// state can translate the reply.
	rules := testRules()
	web := &rules[0]
	web.Backends = append([]flow.Backend{{Name: "z", Addr: dipB, Port: 8080, MAC: macB, Weight: 1}}, web.Backends...)
	web.Backends[1], web.Backends[3] = web.Backends[3], web.Backends[1]
	rules = append(rules, flow.Rule{Name: "other", VIP: flow.VIP{Addr: netip.MustParseAddr("198.18.100.10"), Proto: flow.ProtoTCP, Port: 81, VNI: vni},
		Backends: []flow.Backend{{Name: "a", Addr: dipA, Port: 8080, MAC: macA, Weight: 1}}})
	_, err := e.rules.Update(2, rules)
	require.NoError(t, err)

	res := e.reply(rep)
	require.Empty(t, res.reason)
	require.Equal(t, rep.withSrc(ap(vipA, 80)).frame(), res.frame)
	require.EqualValues(t, 1, e.tr.Stats().Return)

	// Version 3: backend a's port changes → stale → ambiguous? No: the
	// other rule still has a:8080, so stateless finds exactly one rule.
	rules[0].Backends[3].Port = 8081 // "a" after the swap
	require.Equal(t, "a", rules[0].Backends[3].Name)
	_, err = e.rules.Update(3, rules)
	require.NoError(t, err)
	res = e.reply(rep)
	require.Empty(t, res.reason)
	require.Equal(t, rep.withSrc(ap(netip.MustParseAddr("198.18.100.10"), 81)).frame(), res.frame)
	s := e.tr.Stats()
	require.EqualValues(t, 1, s.Stale)
	require.EqualValues(t, 1, s.Stateless)

	// Version 4: the backend is gone from every rule.
	rules[0].Backends = rules[0].Backends[:3]
	rules = rules[:len(rules)-1]
	_, err = e.rules.Update(4, rules)
	require.NoError(t, err)
	require.Equal(t, "nat_no_state", e.reply(rep).reason)
	require.EqualValues(t, 2, e.tr.Stats().Stale)
}

// TestLocalsChange: removing a DIP from the host's locals stops its
// translation at once, state or not.
func TestLocalsChange(t *testing.T) {
	e := newEnv(t, testRules(), testLocals())
	c := ap(client4, 43000)
	require.Empty(t, e.inbound(tcp(c, ap(vipA, 80)).to(macA)).reason)
	e.tr.SetDIPs(nat.MustDIPs(nat.DIP{VNI: vni, Addr: dipB}))
	require.Equal(t, "nat_no_state", e.reply(tcp(ap(dipA, 8080), c)).reason)
	require.Equal(t, "nat_no_local_backend", e.inbound(tcp(c, ap(vipA, 80)).to(macA)).reason)
	require.Empty(t, e.inbound(tcp(c, ap(vipA, 80)).to(macB)).reason)
	require.Equal(t, 1, e.tr.DIPs().Len())
}

// TestBackendChoice: the inner destination MAC names the backend the Mux
// chose when several DIPs of one pool live on this host; a backend without
// a MAC matches any frame; a frame for none of them is dropped.
func TestBackendChoice(t *testing.T) {
	e := newEnv(t, testRules(), testLocals())
	c := ap(client4, 44000)
	require.Equal(t, ap(dipA, 8080), dstOf(e.inbound(tcp(c, ap(vipA, 80)).to(macA))))
	require.Equal(t, ap(dipB, 8080), dstOf(e.inbound(tcp(c, ap(vipA, 80)).to(macB))))
	require.Equal(t, "nat_no_local_backend", e.inbound(tcp(c, ap(vipA, 80)).to(macR)).reason, "remote backend's MAC")
	require.Equal(t, "nat_no_local_backend", e.inbound(tcp(c, ap(vipA, 80)).to(mac6)).reason)

	noMAC := []flow.Rule{{Name: "web", VIP: flow.VIP{Addr: vipA, Proto: flow.ProtoTCP, Port: 80, VNI: vni},
		Backends: []flow.Backend{{Name: "a", Addr: dipA, Weight: 1}}}}
	e = newEnv(t, noMAC, testLocals())
	require.Equal(t, ap(dipA, 80), dstOf(e.inbound(tcp(c, ap(vipA, 80)).to(mac6))))
}

func dstOf(r result) netip.AddrPort {
	if r.reason != "" {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(r.p.Key.DstAddr(), r.p.Key.DstPort)
}

// TestDropReasons: the packets the stages refuse, and why.
func TestDropReasons(t *testing.T) {
	mixed := append(testRules(), flow.Rule{Name: "v4-vip-v6-dip", VIP: flow.VIP{Addr: vipA, Proto: flow.ProtoTCP, Port: 90, VNI: vni},
		Backends: []flow.Backend{{Name: "6", Addr: dip6, MAC: mac6, Weight: 1}}})
	e := newEnv(t, mixed, testLocals())
	c := ap(client4, 45000)
	tests := []struct {
		name   string
		run    func() result
		reason string
	}{
		{"no rule: port", func() result { return e.inbound(tcp(c, ap(vipA, 81)).to(macA)) }, "nat_no_rule"},
		{"no rule: address", func() result { return e.inbound(tcp(c, ap(dipA, 80)).to(macA)) }, "nat_no_rule"},
		{"no rule: protocol", func() result { return e.inbound(udp(c, ap(vipA, 80)).to(macA)) }, "nat_no_rule"},
		{"no rule: icmpv6 without a rule", func() result {
			return e.inbound(pkt{src: ap(client6, 0), dst: ap(vip6, 0), proto: flow.ProtoICMPv6}.to(mac6))
		}, "nat_no_rule"},
		{"no local backend: not hosted here", func() result { return e.inbound(tcp(c, ap(vipA, 80)).to(macR)) }, "nat_no_local_backend"},
		{"no local backend: family differs (no NAT64)", func() result { return e.inbound(tcp(c, ap(vipA, 90)).to(mac6)) }, "nat_no_local_backend"},
		{"reply without state or rule", func() result { return e.reply(tcp(ap(dipA, 1), c)) }, "nat_no_state"},
		{"reply from a non-local address", func() result { return e.reply(tcp(ap(client4, 1), c)) }, "nat_no_state"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.reason, tc.run().reason)
		})
	}
	require.Zero(t, e.table.Len())

	// A frame that is not IP (a parser would have dropped it) is refused
	// by both stages rather than read as a flow.
	arp := make([]byte, 60)
	arp[12], arp[13] = 0x08, 0x06
	for _, stage := range []engine.Stage{e.in, e.ret} {
		var p engine.Packet
		p.SetBuffer(nil, 0, arp, 0, len(arp), 0)
		require.Equal(t, engine.DropNotIP, engine.ParsePacket(&p, vni))
		var b engine.Batch
		b.Append(&p)
		stage.Process(&b)
		require.Equal(t, engine.DropUnsupported, p.Reason)
	}
}

// TestFragments: a first fragment is translated like a whole packet (the
// incremental checksum update is right for the reassembled datagram); a
// non-first fragment, which has no ports, is translated by address when the
// address mapping is unique, and dropped otherwise.
//
// First fragments are TCP here. (engine.Parse accepts a first UDP fragment
// too, checking only that the 8-byte UDP header is there: its Length
// covers the whole datagram, longer than the fragment.)
func TestFragments(t *testing.T) {
	rules := []flow.Rule{
		{Name: "web", VIP: flow.VIP{Addr: vipA, Proto: flow.ProtoTCP, Port: 80, VNI: vni}, Backends: []flow.Backend{
			{Name: "a", Addr: dipA, Port: 8080, MAC: macA, Weight: 1},
		}},
		{Name: "dns", VIP: flow.VIP{Addr: vipA, Proto: flow.ProtoUDP, Port: 53, VNI: vni}, Backends: []flow.Backend{
			{Name: "a", Addr: dipA, MAC: macA, Weight: 1},
		}},
		{Name: "web6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoTCP, Port: 443, VNI: vni}, Backends: []flow.Backend{
			{Name: "6", Addr: dip6, Port: 8443, MAC: mac6, Weight: 1},
		}},
		{Name: "dns6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoUDP, Port: 53, VNI: vni}, Backends: []flow.Backend{
			{Name: "6", Addr: dip6, Port: 5353, MAC: mac6, Weight: 1},
		}},
	}
	e := newEnv(t, rules, testLocals())
	for _, f := range []struct {
		in       pkt
		dip, vip netip.AddrPort
	}{
		{tcp(ap(client4, 46000), ap(vipA, 80)).to(macA), ap(dipA, 8080), ap(vipA, 80)},
		{udp(ap(client4, 46001), ap(vipA, 53)).to(macA), ap(dipA, 53), ap(vipA, 53)},
		{tcp(ap(client6, 46002), ap(vip6, 443)).to(mac6), ap(dip6, 8443), ap(vip6, 443)},
		{udp(ap(client6, 46003), ap(vip6, 53)).to(mac6), ap(dip6, 5353), ap(vip6, 53)},
	} {
		t.Run(f.in.dst.String(), func(t *testing.T) {
			rep := f.in.withDst(f.dip).reply()
			if f.in.proto == flow.ProtoTCP {
				first := f.in.withFrag(1)
				r1 := e.inbound(first)
				require.Empty(t, r1.reason)
				// The translated first fragment is the first fragment of
				// the translated datagram, byte for byte.
				require.Equal(t, first.withDst(f.dip).frame(), r1.frame)
				b1 := e.reply(rep.withFrag(1))
				require.Empty(t, b1.reason)
				require.Equal(t, rep.withSrc(f.vip).withFrag(1).frame(), b1.frame)
			}
			rest := f.in.withFrag(2)
			r2 := e.inbound(rest)
			require.Empty(t, r2.reason)
			require.Equal(t, rest.withDst(f.dip).frame(), r2.frame)
			b2 := e.reply(rep.withFrag(2))
			require.Empty(t, b2.reason)
			require.Equal(t, rep.withSrc(f.vip).withFrag(2).frame(), b2.frame)
			require.EqualValues(t, uplink, b2.p.OutPort)
		})
	}
	s := e.tr.Stats()
	require.EqualValues(t, 8, s.Fragments)
	require.EqualValues(t, 2, s.Inbound)
	require.EqualValues(t, 2, s.Return)

	// No rule for the VIP and protocol, or no local backend with the
	// frame's MAC.
	require.Equal(t, "nat_fragment", e.inbound(tcp(ap(client4, 1), ap(vipB, 80)).to(macA).withFrag(2)).reason)
	require.Equal(t, "nat_fragment", e.inbound(udp(ap(client4, 1), ap(vipA, 53)).to(macB).withFrag(2)).reason)
	require.Equal(t, "nat_fragment", e.reply(tcp(ap(dipB, 53), ap(client4, 1)).withFrag(2)).reason)

	// A second VIP served by dipA over UDP: a reply fragment from dipA
	// could belong to either, while inbound (VIP, MAC) stays unique.
	rules = append(rules, flow.Rule{Name: "dns-c", VIP: flow.VIP{Addr: vipC, Proto: flow.ProtoUDP, Port: 53, VNI: vni},
		Backends: []flow.Backend{{Name: "a", Addr: dipA, Port: 5300, MAC: macA, Weight: 1}}})
	e = newEnv(t, rules, testLocals())
	require.Equal(t, "nat_fragment", e.reply(udp(ap(dipA, 53), ap(client4, 1)).withFrag(2)).reason)
	res := e.inbound(udp(ap(client4, 1), ap(vipC, 53)).to(macA).withFrag(2))
	require.Empty(t, res.reason)
	require.Equal(t, udp(ap(client4, 1), ap(dipA, 5300)).to(macA).withFrag(2).frame(), res.frame)

	// Two local DIPs of one VIP share a MAC (backends without MACs):
	// inbound fragments cannot be placed.
	rules = append(rules, flow.Rule{Name: "dns-d", VIP: flow.VIP{Addr: vipB, Proto: flow.ProtoUDP, Port: 53, VNI: vni},
		Backends: []flow.Backend{{Name: "a", Addr: dipA, Weight: 1}, {Name: "b", Addr: dipB, Weight: 1}}})
	e = newEnv(t, rules, testLocals())
	require.Equal(t, "nat_fragment", e.inbound(udp(ap(client4, 1), ap(vipB, 53)).to(macA).withFrag(2)).reason)
	require.EqualValues(t, 1, e.drops("nat_fragment"))
}

// TestSetHash: with SetHash both directions of a connection carry the same
// Packet.Hash, the symmetric hash of the client ↔ VIP key.
func TestSetHash(t *testing.T) {
	h := flow.NewHasher(7)
	e := newEnv(t, testRules(), testLocals(), func(c *nat.Config) { c.SetHash, c.Hasher = true, h })
	in := tcp(ap(client4, 47000), ap(vipA, 80)).to(macA)
	a := e.inbound(in)
	require.Empty(t, a.reason)
	b := e.reply(in.withDst(ap(dipA, 8080)).reply())
	require.Empty(t, b.reason)
	k := flow.KeyFrom(vni, flow.ProtoTCP, in.src, in.dst)
	require.Equal(t, h.SymmetricHash(&k), a.p.Hash)
	require.Equal(t, a.p.Hash, b.p.Hash)
}

// TestTableSideEntries: a connection of an all-ports rule with a fixed
// backend port keeps its VIP port in the side table, with the same class;
// the two entries expire together.
func TestTableSideEntries(t *testing.T) {
	e := newEnv(t, testRules(), testLocals())
	c := ap(client4, 48000)
	require.Empty(t, e.inbound(udp(c, ap(vipC, 1234)).to(macA)).reason)
	st, ok := e.state(flow.ProtoUDP, vni, ap(dipA, 9000), c)
	require.True(t, ok)
	require.True(t, st.HasVIPPort)
	require.EqualValues(t, 1234, st.VIPPort)
	require.Equal(t, 1, e.table.Ports().Len())

	// The same client port to another VIP port: one DIP-side connection,
	// the side table follows the latest (documented limitation).
	require.Empty(t, e.inbound(udp(c, ap(vipC, 4321)).to(macA)).reason)
	st, _ = e.state(flow.ProtoUDP, vni, ap(dipA, 9000), c)
	require.EqualValues(t, 4321, st.VIPPort)
	res := e.reply(udp(ap(dipA, 9000), c))
	require.Equal(t, udp(ap(vipC, 4321), c).frame(), res.frame)

	e.now += flow.Ticks(flow.DefaultTimeouts().UDP) + 1
	scanned, expired := e.table.Age(e.now, 1<<20)
	require.Positive(t, scanned)
	require.Equal(t, 2, expired)
	require.Zero(t, e.table.Len())
	require.Equal(t, "nat_no_state", e.reply(udp(ap(dipA, 9000), c)).reason)
}

// TestDirectConnections: a DIP's service port reached without the VIP (a
// neighbour VM, another host, an operator) answers with a SYN-ACK that has
// no NAT state. The connection is remembered as direct and every packet of
// it leaves untranslated on the Direct port — also those the stateless
// fallback would otherwise have translated to the VIP — while connections
// through the VIP are translated as before.
func TestDirectConnections(t *testing.T) {
	const directPort = 9
	e := newEnv(t, testRules(), testLocals(), func(c *nat.Config) { c.Direct, c.HasDirect = directPort, true })
	neighbour := ap(netip.MustParseAddr("198.19.1.2"), 40000)
	synAck := pkt{src: ap(dipA, 8080), dst: neighbour, syn: true, ack: true}

	res := e.reply(synAck)
	require.Empty(t, res.reason)
	require.Equal(t, engine.VerdictEmit, res.p.Verdict, "passed on at once, no next-hop stage")
	require.EqualValues(t, directPort, res.p.OutPort)
	require.Equal(t, synAck.frame(), res.frame, "untranslated")
	st, ok := e.state(flow.ProtoTCP, vni, ap(dipA, 8080), neighbour)
	require.True(t, ok, "the direct connection is remembered")
	require.Equal(t, flow.ReservedID, st.BackendID)

	// The rest of the connection: untranslated, not stateless.
	for _, p := range []pkt{{src: ap(dipA, 8080), dst: neighbour, ack: true, payload: "HTTP/1.1 200 OK"},
		{src: ap(dipA, 8080), dst: neighbour, ack: true, fin: true}} {
		res = e.reply(p)
		require.Empty(t, res.reason)
		require.EqualValues(t, directPort, res.p.OutPort)
		require.Equal(t, p.frame(), res.frame)
	}
	st, _ = e.state(flow.ProtoTCP, vni, ap(dipA, 8080), neighbour)
	require.Equal(t, flow.ClassClosing, st.Class, "a FIN closes the direct connection")

	// A connection through the VIP from another client port: translated.
	c := ap(client4, 5000)
	require.Empty(t, e.inbound(tcp(c, ap(vipA, 80)).to(macA)).reason)
	res = e.reply(pkt{src: ap(dipA, 8080), dst: c, syn: true, ack: true})
	require.Empty(t, res.reason)
	require.EqualValues(t, uplink, res.p.OutPort)
	require.Equal(t, pkt{src: ap(vipA, 80), dst: c, syn: true, ack: true}.frame(), res.frame)

	// The same 5-tuple later through the VIP (the neighbour's port reused
	// for a VIP connection): the client's packet through the VIP makes it
	// a VIP connection again.
	require.Empty(t, e.inbound(tcp(neighbour, ap(vipA, 80)).to(macA)).reason)
	res = e.reply(pkt{src: ap(dipA, 8080), dst: neighbour, ack: true})
	require.EqualValues(t, uplink, res.p.OutPort)
	require.Equal(t, pkt{src: ap(vipA, 80), dst: neighbour, ack: true}.frame(), res.frame)

	s := e.tr.Stats()
	require.EqualValues(t, 1, s.DirectFlows)
	require.EqualValues(t, 3, s.Direct)
	require.Zero(t, s.Stateless)
}
