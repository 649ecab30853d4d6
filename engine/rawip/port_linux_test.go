package rawip_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/rawip"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// frame builds an Ethernet frame (optionally VLAN-tagged) carrying UDP
// from src to dst with payload, checksums set (gopacket).
func frame(t *testing.T, src, dst netip.AddrPort, vlan bool, payload string) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}}
	udp := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
	var ip gopacket.NetworkLayer
	var et layers.EthernetType
	if src.Addr().Is4() {
		ip4 := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, Flags: layers.IPv4DontFragment,
			SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
		ip, et = ip4, layers.EthernetTypeIPv4
	} else {
		ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
			SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
		ip, et = ip6, layers.EthernetTypeIPv6
	}
	require.NoError(t, udp.SetNetworkLayerForChecksum(ip))
	ls := []gopacket.SerializableLayer{eth}
	if vlan {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: 7, Type: et})
	} else {
		eth.EthernetType = et
	}
	ls = append(ls, ip.(gopacket.SerializableLayer), udp, gopacket.Payload(payload))
	return gpkt.Serialize(t, ls...)
}

// TestPortSendsThroughTheKernel: frames from a non-local source (a VIP, as
// DSR replies have) handed to the port leave through the kernel, which
// resolves the destination's MAC by itself (no neighbour entry exists
// beforehand), and arrive at a UDP socket in the peer namespace with the
// source address unchanged. Malformed frames are counted, not sent.
func TestPortSendsThroughTheKernel(t *testing.T) {
	lab := netlab.New(t, "rawip")
	host, err := lab.Namespace("host")
	require.NoError(t, err)
	peer, err := lab.Namespace("peer")
	require.NoError(t, err)
	_, _, err = lab.Veth(host, "up0", peer, "eth0")
	require.NoError(t, err)
	for _, step := range []error{
		host.AddAddr("up0", "198.18.0.1/24"),
		host.AddAddr("up0", "2001:db8:0:1::1/64"),
		peer.AddAddr("eth0", "198.18.0.2/24"),
		peer.AddAddr("eth0", "2001:db8:0:1::2/64"),
		// The replies' source (the VIP) is routed back through host.
		peer.AddRoute("198.18.50.0/24", "198.18.0.1"),
		peer.AddRoute("2001:db8:50::/64", "2001:db8:0:1::1"),
	} {
		require.NoError(t, step)
	}
	var port *rawip.Port
	require.NoError(t, host.Do(func() error { port, err = rawip.Open("slow"); return err }))
	t.Cleanup(func() { port.Close() })
	require.Equal(t, "slow", port.Name())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cases := []struct {
		name     string
		src, dst netip.AddrPort
		vlan     bool
	}{
		{"IPv4", netip.MustParseAddrPort("198.18.50.1:80"), netip.MustParseAddrPort("198.18.0.2:7001"), false},
		{"IPv4, VLAN-tagged", netip.MustParseAddrPort("198.18.50.1:80"), netip.MustParseAddrPort("198.18.0.2:7002"), true},
		{"IPv6", netip.MustParseAddrPort("[2001:db8:50::1]:80"), netip.MustParseAddrPort("[2001:db8:0:1::2]:7003"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := peer.ListenPacket(ctx, "udp", tc.dst.String())
			require.NoError(t, err)
			defer pc.Close()
			f := frame(t, tc.src, tc.dst, tc.vlan, "hello "+tc.name)
			var p engine.Packet
			p.SetBuffer(nil, 0, f, 0, len(f), 0)
			before := port.Stats().Sent
			require.Equal(t, 1, port.Transmit([]*engine.Packet{&p}))
			require.Equal(t, before+1, port.Stats().Sent)
			require.NoError(t, pc.SetReadDeadline(time.Now().Add(10*time.Second))) // a hang guard
			buf := make([]byte, 2048)
			n, from, err := pc.ReadFrom(buf)
			require.NoError(t, err)
			require.Equal(t, "hello "+tc.name, string(buf[:n]))
			require.Equal(t, tc.src.String(), netip.MustParseAddrPort(from.String()).String())
		})
	}

	// Not IP: counted as malformed; the port still takes the packet.
	junk := make([]byte, 60)
	junk[12], junk[13] = 0x08, 0x06 // ARP
	var p engine.Packet
	p.SetBuffer(nil, 0, junk, 0, len(junk), 0)
	require.Equal(t, 1, port.Transmit([]*engine.Packet{&p}))
	st := port.Stats()
	require.EqualValues(t, 1, st.Malformed)
	require.EqualValues(t, 0, st.Errors)
}
