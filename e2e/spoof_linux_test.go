package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// TestSpoofedSourcesEndToEnd runs examples/mux and examples/hostagent in
// the TestHostAgentEndToEnd topology with their default flags (no
// -tunnel-sources: the document's mux_prefixes name the Mux) and has the
// client send what issue 10 describes:
//
//  1. spoofed UDP datagrams VIP:7 → VIP:7 (with the UDP echo service
//     behind the VIP they would loop between the Mux, the VM and the
//     router), datagrams from the Mux's own address and from an
//     infrastructure prefix, and one whose TTL runs out at the Mux: the
//     Mux drops each with its reason (src_vip, src_node, src_infra,
//     ttl_exceeded), its data path receives exactly what the client sent
//     (0 looped packets) and transmits nothing;
//  2. VXLAN of its own to the host's port 4789, with the VNI and a VM's
//     MAC: the Host Agent drops every datagram as bad_tunnel_source and
//     delivers nothing.
//
// Raw IPv4 sockets (IPPROTO_RAW, header included) in the client's
// namespace send the spoofed packets; the router forwards them (its
// reverse-path filter is off).
func TestSpoofedSourcesEndToEnd(t *testing.T) {
	l := newHALab(t)
	l.serveVMs()
	l.start("mux", l.mux, "mux", "-interface", "up", "-metrics", netip.AddrPortFrom(netip.MustParseAddr(haMux), haMuxMet).String(), "-conns", "65536")
	l.start("hostagent", l.host, "hostagent", "-uplink", "up", "-host", "host-1",
		"-metrics", netip.AddrPortFrom(netip.MustParseAddr(haHost), haHostMet).String(), "-conns", "65536")
	muxMetrics := func() map[string]float64 { return l.scrape(t, l.mux, haMux, haMuxMet) }
	hostMetrics := func() map[string]float64 { return l.scrape(t, l.host, haHost, haHostMet) }
	waitFor(t, "the Host Agent's data path", 30*time.Second, func() bool {
		m, err := scrapeErr(l.host, haHost, haHostMet)
		return err == nil && m["xdplb_datapath_up"] == 1 && m["xdplb_config_version"] == 1
	})
	waitFor(t, "both backends up on the Mux", 30*time.Second, func() bool {
		m, err := scrapeErr(l.mux, haMux, haMuxMet)
		return err == nil && m[`xdplb_backend_up{backend="vm-a",vip="web"}`] == 1 &&
			m[`xdplb_backend_up{backend="vm-b",vip="web"}`] == 1
	})
	// A real client's UDP echo through the VIP works (and the next hops
	// are resolved) before the spoofing starts.
	waitFor(t, "a UDP echo through the VIP", 30*time.Second, func() bool {
		_, err := l.udpEcho("hello")
		return err == nil
	})

	vip := netip.MustParseAddr(haVIP)
	const loops, fromMux, fromInfra, expiring = 20, 3, 4, 5
	t.Run("1_MuxDropsSpoofedSources", func(t *testing.T) {
		m0 := muxMetrics()
		h0 := hostMetrics()
		raw := rawSender(t, l.client)
		for i := 0; i < loops; i++ {
			raw.send(t, spoofedUDP(t, vip, 7, vip, 7, 64, fmt.Sprintf("loop %d", i)))
		}
		for i := 0; i < fromMux; i++ {
			raw.send(t, spoofedUDP(t, netip.MustParseAddr(haMux), 7, vip, 7, 64, "from the Mux"))
		}
		for i := 0; i < fromInfra; i++ {
			raw.send(t, spoofedUDP(t, netip.MustParseAddr("198.18.1.77"), 4000, vip, 7, 64, "from infrastructure"))
		}
		// TTL 2: the router takes it to 1, the Mux must not forward it.
		for i := 0; i < expiring; i++ {
			raw.send(t, spoofedUDP(t, netip.MustParseAddr(haClient), 40000+uint16(i), vip, 7, 2, "expiring"))
		}
		drop := func(m map[string]float64, reason string) float64 {
			return m[fmt.Sprintf(`xdplb_drops_total{reason=%q}`, reason)]
		}
		total := float64(loops + fromMux + fromInfra + expiring)
		waitFor(t, "the Mux counted every spoofed datagram", 30*time.Second, func() bool {
			m, err := scrapeErr(l.mux, haMux, haMuxMet)
			return err == nil && m[`xdplb_packets_total{direction="rx"}`]-m0[`xdplb_packets_total{direction="rx"}`] >= total
		})
		m1 := muxMetrics()
		rx := m1[`xdplb_packets_total{direction="rx"}`] - m0[`xdplb_packets_total{direction="rx"}`]
		tx := m1[`xdplb_packets_total{direction="tx"}`] - m0[`xdplb_packets_total{direction="tx"}`]
		t.Logf("the client sent %v; the Mux's data path received %v and transmitted %v; drops %v",
			total, rx, tx, nonZero(m1, "xdplb_drops_total"))
		require.Equal(t, float64(loops), drop(m1, "src_vip")-drop(m0, "src_vip"), "VIP:7 → VIP:7")
		require.Equal(t, float64(fromMux), drop(m1, "src_node")-drop(m0, "src_node"), "from the Mux's own address")
		require.Equal(t, float64(fromInfra), drop(m1, "src_infra")-drop(m0, "src_infra"), "from an infrastructure prefix")
		require.Equal(t, float64(expiring), drop(m1, "ttl_exceeded")-drop(m0, "ttl_exceeded"), "TTL 1 at the Mux")
		require.Equal(t, total, rx, "the Mux received what the client sent and nothing more: 0 looped packets")
		require.Zero(t, tx, "the Mux forwarded none of it")
		h1 := hostMetrics()
		require.Zero(t, h1[`xdplb_packets_total{direction="rx"}`]-h0[`xdplb_packets_total{direction="rx"}`],
			"nothing reached the Host Agent's data path")
	})

	t.Run("2_HostDropsClientVXLAN", func(t *testing.T) {
		const n = 10
		h0 := hostMetrics()
		// The client's own VXLAN: VNI 100, inner destination vm-a's MAC,
		// a UDP datagram to the VIP's echo port inside, as a Mux would
		// send it.
		inner := gpkt.Serialize(t,
			&layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, DstMAC: haVMs[0].MAC, EthernetType: layers.EthernetTypeIPv4},
			&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.ParseIP(haClient).To4(), DstIP: net.ParseIP(haVIP).To4()},
			&layers.UDP{SrcPort: 41000, DstPort: 7}, gopacket.Payload("around the Mux"))
		vx := make([]byte, 8, 8+len(inner))
		vx[0] = 0x08 // I flag
		binary.BigEndian.PutUint32(vx[4:], 100<<8)
		vx = append(vx, inner...)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := l.client.Dial(ctx, "udp", net.JoinHostPort(haHost, "4789"))
		require.NoError(t, err)
		defer c.Close()
		for i := 0; i < n; i++ {
			_, err := c.Write(vx)
			require.NoError(t, err)
		}
		bad := `xdplb_drops_total{reason="bad_tunnel_source"}`
		waitFor(t, "the Host Agent counted the client's VXLAN", 30*time.Second, func() bool {
			m, err := scrapeErr(l.host, haHost, haHostMet)
			return err == nil && m[bad]-h0[bad] >= n
		})
		h1 := hostMetrics()
		t.Logf("Host Agent drops: %v", nonZero(h1, "xdplb_drops_total"))
		require.Equal(t, float64(n), h1[bad]-h0[bad], "every client-sent VXLAN datagram dropped as bad_tunnel_source")
		require.Zero(t, h1[`xdplb_packets_total{direction="tx"}`]-h0[`xdplb_packets_total{direction="tx"}`],
			"nothing delivered to a VM")
	})
}

// rawIPv4 is a raw IPv4 socket (IPPROTO_RAW: the caller writes the IP
// header) opened in a namespace.
type rawIPv4 struct{ fd int }

func rawSender(t *testing.T, n *netlab.NS) *rawIPv4 {
	t.Helper()
	r := &rawIPv4{fd: -1}
	require.NoError(t, n.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		r.fd = fd
		return err
	}))
	t.Cleanup(func() { _ = unix.Close(r.fd) })
	return r
}

// send sends the IPv4 packet pkt to its destination.
func (r *rawIPv4) send(t *testing.T, pkt []byte) {
	t.Helper()
	sa := &unix.SockaddrInet4{Addr: [4]byte(pkt[16:20])}
	require.NoError(t, unix.Sendto(r.fd, pkt, 0, sa))
}

// spoofedUDP builds an IPv4 UDP datagram with gopacket, any source.
func spoofedUDP(t *testing.T, src netip.Addr, sport uint16, dst netip.Addr, dport uint16, ttl uint8, payload string) []byte {
	return gpkt.Serialize(t,
		&layers.IPv4{Version: 4, TTL: ttl, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()},
		&layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}, gopacket.Payload(payload))
}
