package nat_test

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// TestICMPErrorsInbound: an ICMP error about a VIP reply (a router's
// fragmentation needed / packet too big, forwarded by the Mux to the DIP)
// reaches the VM as the exact frame gopacket builds for an error about the
// DIP's own packet: outer destination and quoted source translated, the
// quoted IP and TCP/UDP checksums and the ICMP checksum right.
func TestICMPErrorsInbound(t *testing.T) {
	router4, router6 := netip.MustParseAddr("198.18.50.1"), netip.MustParseAddr("2001:db8:50::1")
	tests := []struct {
		name    string
		router  netip.Addr
		mac     header.MAC
		reply   pkt            // the VIP's reply the error quotes
		dip     netip.AddrPort // the DIP endpoint it came from
		cut     int            // quote length, 0: whole
		reason  string
		noState bool
	}{
		{"tcp4 whole quote", router4, macA, tcp(ap(vipA, 80), ap(client4, 40000)), ap(dipA, 8080), 0, "", false},
		{"tcp4 quote of 28 bytes (RFC 792)", router4, macA, tcp(ap(vipA, 80), ap(client4, 40000)), ap(dipA, 8080), 28, "", false},
		{"tcp4 quote without the checksum", router4, macA, tcp(ap(vipA, 80), ap(client4, 40000)), ap(dipA, 8080), 20 + 17, "", false},
		{"udp4 all-ports remapped", router4, macA, udp(ap(vipC, 7777), ap(client4, 40001)), ap(dipA, 9000), 0, "", false},
		{"tcp6 packet too big", router6, mac6, tcp(ap(vip6, 443), ap(client6, 40002)), ap(dip6, 8443), 0, "", false},
		{"udp6 quote cut in the payload", router6, mac6, udp(ap(vip6, 53), ap(client6, 40003)), ap(dip6, 53), 40 + 8 + 5, "", false},
		{"no state needed", router4, macB, tcp(ap(vipA, 80), ap(client4, 40004)), ap(dipB, 8080), 0, "", true},
		{"quote too short for the ports", router4, macA, tcp(ap(vipA, 80), ap(client4, 40000)), ap(dipA, 8080), 22, "bad_l4", false},
		{"quote of no VIP", router4, macA, tcp(ap(client4, 80), ap(client4, 40000)), netip.AddrPort{}, 0, "nat_no_rule", true},
		{"not our backend's MAC", router4, macR, tcp(ap(vipA, 80), ap(client4, 40000)), netip.AddrPort{}, 0, "nat_no_local_backend", true},
		{"about an infrastructure client", router4, macA, tcp(ap(vipA, 80), ap(prober, 40000)), netip.AddrPort{}, 0, "nat_infra", true},
		{"from a router inside the infrastructure prefixes", netip.MustParseAddr("198.18.200.1"), macA, tcp(ap(vipA, 80), ap(client4, 40005)), ap(dipA, 8080), 0, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testRules(), testLocals())
			if !tc.noState {
				require.Empty(t, e.inbound(tc.reply.reply().to(tc.mac)).reason) // the connection
			}
			before := e.table.Len()
			vip := tc.reply.src.Addr()
			res := e.run(e.in, icmpErr(tc.router, vip, tc.mac, tc.reply, tc.cut, false), vni)
			require.Equal(t, tc.reason, res.reason)
			if tc.reason != "" {
				return
			}
			want := icmpErr(tc.router, tc.dip.Addr(), tc.mac, tc.reply.withSrc(tc.dip), tc.cut, false)
			if tc.name == "tcp4 quote without the checksum" {
				// The half of the TCP checksum in the quote stays as it was.
				orig := icmpErr(tc.router, vip, tc.mac, tc.reply, tc.cut, false)
				last := len(want) - 1
				want[last] = orig[last]
				fixICMPv4Checksum(want)
			}
			require.Equal(t, want, res.frame)
			require.Equal(t, tc.dip.Addr(), res.p.Key.DstAddr())
			require.EqualValues(t, 1, e.tr.Stats().ICMPErrors)
			require.Equal(t, before, e.table.Len(), "errors do not create state")
		})
	}
}

// fixICMPv4Checksum recomputes the ICMP checksum of an Ethernet/IPv4/ICMP
// frame with gopacket, lengths as they are (not gpkt.Serialize, which
// fixes them).
func fixICMPv4Checksum(frame []byte) {
	pk := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	var ls []gopacket.SerializableLayer
	for _, l := range pk.Layers() {
		ls = append(ls, l.(gopacket.SerializableLayer))
		if _, ok := l.(*layers.ICMPv4); ok {
			ls = append(ls, gopacket.Payload(l.LayerPayload()))
			break
		}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, ls...); err != nil {
		panic(err)
	}
	copy(frame, buf.Bytes())
}

// TestICMPErrorsReturn: an ICMP error the VM sends about a client packet
// leaves as the error the client expects from the VIP, by state or
// statelessly.
func TestICMPErrorsReturn(t *testing.T) {
	tests := []struct {
		name   string
		client pkt            // the client packet, as the VM received it
		vip    netip.AddrPort // what the client sent it to
		state  bool
		reason string
	}{
		{"udp4 port unreachable, by state", udp(ap(client4, 5000), ap(dipA, 53)), ap(vipA, 53), true, ""},
		{"udp4 port unreachable, stateless", udp(ap(client4, 5001), ap(dipA, 53)), ap(vipA, 53), false, ""},
		{"udp4 all-ports remapped, by state", udp(ap(client4, 5002), ap(dipA, 9000)), ap(vipC, 6666), true, ""},
		{"udp6, by state", udp(ap(client6, 5003), ap(dip6, 53)), ap(vip6, 53), true, ""},
		{"all-ports remapped without state", udp(ap(client4, 5004), ap(dipA, 9000)), netip.AddrPort{}, false, "nat_no_state"},
		{"to an infrastructure address", udp(ap(prober, 5005), ap(dipA, 53)), netip.AddrPort{}, false, "nat_infra"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testRules(), testLocals())
			mac := macA
			if tc.client.dst.Addr() == dip6 {
				mac = mac6
			}
			if tc.state {
				require.Empty(t, e.inbound(tc.client.withDst(tc.vip).to(mac)).reason)
			}
			dip, cl := tc.client.dst.Addr(), tc.client.src.Addr()
			res := e.run(e.ret, icmpErr(dip, cl, macGW, tc.client, 0, true), vni)
			require.Equal(t, tc.reason, res.reason)
			if tc.reason != "" {
				return
			}
			want := icmpErr(tc.vip.Addr(), cl, macGW, tc.client.withDst(tc.vip), 0, true)
			require.Equal(t, want, res.frame)
			require.EqualValues(t, uplink, res.p.OutPort)
			require.EqualValues(t, 1, e.tr.Stats().ICMPErrors)
		})
	}
}

// TestICMPEchoIsNotAnError: echo requests to a VIP with an ICMP rule are
// translated as a connection of their own, not as errors.
func TestICMPEchoIsNotAnError(t *testing.T) {
	e := newEnv(t, testRules(), testLocals())
	res := e.inbound(pkt{src: ap(client4, 0), dst: ap(vipA, 0), proto: flow.ProtoICMP}.to(macA))
	require.Empty(t, res.reason)
	require.Zero(t, e.tr.Stats().ICMPErrors)
	require.EqualValues(t, 1, e.tr.Stats().Inbound)
}
