package hostagent

import (
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// partialDoc serves TCP and UDP over IPv4 (VM a) and IPv6 (VM b), with
// port remaps, so both NAT directions rewrite addresses and ports of
// every kind of segment.
const partialDoc = `version: 1
mux_prefixes: [198.18.1.2/32]
vips:
  - {name: web4, address: 198.18.100.1, protocol: tcp, port: 80, vni: 100,
     backends: [{name: a, address: 198.18.4.1, port: 8080, mac: "02:00:00:00:04:01", host: 198.18.3.2}]}
  - {name: dns4, address: 198.18.100.1, protocol: udp, port: 53, vni: 100,
     backends: [{name: a, address: 198.18.4.1, port: 5353, mac: "02:00:00:00:04:01", host: 198.18.3.2}]}
  - {name: web6, address: "2001:db8:100::1", protocol: tcp, port: 80, vni: 100,
     backends: [{name: b, address: "2001:db8:4::2", port: 8080, mac: "02:00:00:00:04:02", host: 198.18.3.2}]}
  - {name: dns6, address: "2001:db8:100::1", protocol: udp, port: 53, vni: 100,
     backends: [{name: b, address: "2001:db8:4::2", port: 5353, mac: "02:00:00:00:04:02", host: 198.18.3.2}]}
hosts:
  - name: host-1
    address: 198.18.3.2
    vms:
      - {vni: 100, address: 198.18.4.1, mac: "02:00:00:00:04:01", interface: vm_a}
      - {vni: 100, address: "2001:db8:4::2", mac: "02:00:00:00:04:02", interface: vm_b}
`

// segLayers are Ethernet/IP/TCP-or-UDP layers from src to dst.
func segLayers(dstMAC, srcMAC net.HardwareAddr, src, dst netip.AddrPort, udp bool, payload string) []gopacket.SerializableLayer {
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC}
	proto := layers.IPProtocolTCP
	if udp {
		proto = layers.IPProtocolUDP
	}
	var ip gopacket.SerializableLayer
	var nl gopacket.NetworkLayer
	if src.Addr().Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip4 := &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
		ip, nl = ip4, ip4
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
		ip, nl = ip6, ip6
	}
	var l4 gopacket.SerializableLayer
	if udp {
		u := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
		_ = u.SetNetworkLayerForChecksum(nl)
		l4 = u
	} else {
		t := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()), ACK: true, PSH: true, Window: 1000, Seq: 1, Ack: 1}
		_ = t.SetNetworkLayerForChecksum(nl)
		l4 = t
	}
	return []gopacket.SerializableLayer{eth, ip, l4, gopacket.Payload(payload)}
}

// TestPipelinesPartialChecksums: frames whose TCP/UDP checksum a local
// sender left partial (a client next to a Mux, inside the VXLAN; a VM on
// its port) leave both NAT directions with checksums that verify; frames
// with a corrupted checksum leave still corrupted (the rewrite is
// incremental, nothing is repaired).
func TestPipelinesPartialChecksums(t *testing.T) {
	client4 := netip.MustParseAddrPort("198.18.5.2:40000")
	client6 := netip.MustParseAddrPort("[2001:db8:5::2]:40000")
	macA, macB := net.HardwareAddr{2, 0, 0, 0, 4, 1}, net.HardwareAddr{2, 0, 0, 0, 4, 2}
	tests := []struct {
		name      string
		client    netip.AddrPort
		vip, dip  netip.AddrPort
		mac       net.HardwareAddr
		port      int
		udp       bool
		corrupted bool
	}{
		{"tcp4", client4, netip.MustParseAddrPort("198.18.100.1:80"), netip.MustParseAddrPort("198.18.4.1:8080"), macA, 1, false, false},
		{"udp4", client4, netip.MustParseAddrPort("198.18.100.1:53"), netip.MustParseAddrPort("198.18.4.1:5353"), macA, 1, true, false},
		{"tcp6", client6, netip.MustParseAddrPort("[2001:db8:100::1]:80"), netip.MustParseAddrPort("[2001:db8:4::2]:8080"), macB, 2, false, false},
		{"udp6", client6, netip.MustParseAddrPort("[2001:db8:100::1]:53"), netip.MustParseAddrPort("[2001:db8:4::2]:5353"), macB, 2, true, false},
		{"tcp4-corrupted", client4, netip.MustParseAddrPort("198.18.100.1:80"), netip.MustParseAddrPort("198.18.4.1:8080"), macA, 1, false, true},
		{"udp6-corrupted", client6, netip.MustParseAddrPort("[2001:db8:100::1]:53"), netip.MustParseAddrPort("[2001:db8:4::2]:5353"), macB, 2, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newPipeRigDoc(t, partialDoc, true)
			prepare := func(f []byte) []byte {
				if tc.corrupted {
					// A complete checksum, and a payload bit flipped
					// in transit.
					f[len(f)-1] ^= 0x20
					return f
				}
				return gpkt.MakePartial(t, f)
			}
			check := func(f []byte) {
				t.Helper()
				valid, ok := gpkt.TransportValid(f)
				require.True(t, ok)
				require.Equal(t, !tc.corrupted, valid, "transport checksum valid")
			}
			in := gpkt.Serialize(t, segLayers(tc.mac, net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, tc.client, tc.vip, tc.udp, "request")...)
			r.ports[UplinkPort].Inject(wrapVXLAN(t, prepare(in), nil))
			r.w.Poll()
			out := r.ports[tc.port].Transmitted()
			require.Len(t, out, 1)
			check(out[0])

			reply := gpkt.Serialize(t, segLayers(uplinkMAC, tc.mac, tc.dip, tc.client, tc.udp, "reply!")...)
			r.ports[tc.port].Inject(prepare(reply))
			r.w.Poll()
			back := r.ports[UplinkPort].Transmitted()
			require.Len(t, back, 1)
			check(back[0])

			want := uint64(2)
			if tc.corrupted {
				want = 0
			}
			got := uint64(0)
			for _, s := range r.a.partial {
				got += s.Completed()
			}
			require.Equal(t, want, got, "frames completed")
		})
	}
}
