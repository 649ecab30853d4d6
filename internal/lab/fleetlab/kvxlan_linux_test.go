package fleetlab_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// TestKernelVXLANHost builds a kernel VXLAN host by its recipe and sends
// it VXLAN by hand from a client (gopacket frames, no Mux): the kernel
// takes a frame for the device's MAC in the device's VNI apart and the
// echo server answers the client from the VIP, straight through the
// router; a frame for another MAC or VNI goes unanswered; and the host
// does not answer ARP for the VIP on its uplink.
func TestKernelVXLANHost(t *testing.T) {
	lab := netlab.New(t, "flkvx")
	star, err := fleetlab.NewStar(lab)
	require.NoError(t, err)
	client, err := star.Attach("client", "c", 11)
	require.NoError(t, err)
	k := fleetlab.FleetKernelVXLAN()
	host, err := star.AttachKernelVXLAN(k, "h3", fleetlab.FleetKernelVXLANSubnet)
	require.NoError(t, err)
	srv, err := fleetlab.ServeKernelVXLAN(host, k, "kvx3", 80, 7)
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })

	// The probes' path: HTTP on the host's own address.
	body, err := fleetlab.Get(fleetlab.HTTPClient(client, 10*time.Second), "http://"+k.Addr.String()+"/")
	require.NoError(t, err)
	require.Equal(t, "kvx3", body)

	clientAddr := fleetlab.SubnetAddr(11, 2)
	// rx receives the echo's answers: what arrives at the inner source.
	rx, err := client.ListenPacket(context.Background(), "udp4", netip.AddrPortFrom(clientAddr, 0).String())
	require.NoError(t, err)
	defer rx.Close()
	rxPort := uint16(rx.LocalAddr().(*net.UDPAddr).Port)
	tx, err := client.Dial(context.Background(), "udp4", netip.AddrPortFrom(k.Addr, 4789).String())
	require.NoError(t, err)
	defer tx.Close()

	for _, tc := range []struct {
		name     string
		vni      uint32
		innerDst net.HardwareAddr
		answered bool
	}{
		{"the device's MAC and VNI", k.VNI, k.MAC, true},
		{"another MAC", k.VNI, net.HardwareAddr{2, 0, 0, 0, 0x99, 0x99}, false},
		{"another VNI", k.VNI + 1, k.MAC, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := "hi " + tc.name
			frame := gpkt.Serialize(t,
				&layers.VXLAN{ValidIDFlag: true, VNI: tc.vni},
				&layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0x11, 2}, DstMAC: tc.innerDst, EthernetType: layers.EthernetTypeIPv4},
				&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: clientAddr.AsSlice(), DstIP: fleetlab.FleetVIP.AsSlice()},
				&layers.UDP{SrcPort: layers.UDPPort(rxPort), DstPort: 7},
				gopacket.Payload(msg))
			_, err := tx.Write(frame)
			require.NoError(t, err)
			wait := 10 * time.Second // a hang guard
			if !tc.answered {
				wait = time.Second // how long an answer that should not come is awaited
			}
			require.NoError(t, rx.SetReadDeadline(time.Now().Add(wait)))
			buf := make([]byte, 2048)
			n, from, err := rx.ReadFrom(buf)
			if !tc.answered {
				require.Error(t, err, "answered %q from %v", buf[:n], from)
				return
			}
			require.NoError(t, err)
			require.Equal(t, "kvx3: "+msg, string(buf[:n]))
			require.Equal(t, netip.AddrPortFrom(fleetlab.FleetVIP, 7), from.(*net.UDPAddr).AddrPort(), "the answer comes from the VIP")
		})
	}

	t.Run("no ARP answer for the VIP on the uplink", func(t *testing.T) {
		// Make the router look for the VIP on host3's link, as a router
		// sharing a segment with the host would, and send it something.
		h3, err := star.Router.Link("h3")
		require.NoError(t, err)
		vip := &net.IPNet{IP: fleetlab.FleetVIP.AsSlice(), Mask: net.CIDRMask(32, 32)}
		require.NoError(t, star.Router.Netlink().RouteAdd(&netlink.Route{LinkIndex: h3.Attrs().Index, Dst: vip, Scope: netlink.SCOPE_LINK}))
		c, err := star.Router.Dial(context.Background(), "udp4", netip.AddrPortFrom(fleetlab.FleetVIP, 7).String())
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Write([]byte("who has the VIP?"))
		require.NoError(t, err)
		var state int
		require.NoError(t, fleetlab.Poll(context.Background(), "the router's ARP for the VIP to resolve or fail", 30*time.Second, func() bool {
			ns, err := star.Router.Netlink().NeighList(h3.Attrs().Index, netlink.FAMILY_V4)
			if err != nil {
				return false
			}
			for _, n := range ns {
				if n.IP.Equal(vip.IP) {
					state = n.State
				}
			}
			return state&(netlink.NUD_FAILED|netlink.NUD_REACHABLE|netlink.NUD_STALE) != 0
		}))
		require.Equal(t, netlink.NUD_FAILED, state, "the router's neighbour entry for the VIP on h3 (NUD state %#x)", state)
	})
}
