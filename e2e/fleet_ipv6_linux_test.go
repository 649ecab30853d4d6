package e2e

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// TestFleetIPv6 runs the fleet dual-stack (fleetlab.Fleet.AddIPv6): the
// same four VMs, each with one MAC and one eth0, serve the IPv4 VIP from
// their IPv4 addresses and the IPv6 VIP 2001:db8:100::1 from their IPv6
// addresses (TCP 80 → 8080, UDP 7 → 7007), through two Muxes that
// announce the IPv6 VIP to BIRD over their IPv4 sessions with an IPv6
// next hop, and the two Host Agents. The VMs find their IPv6 gateway by
// neighbour discovery. It checks:
//
//  1. the router installs an ECMP route to the IPv6 VIP over both Muxes'
//     IPv6 addresses;
//  2. HTTP (net/http) and UDP from the client over IPv6 through the VIP:
//     every request answered, by every VM, the UDP answers from the VIP
//     and its port (a connected socket accepts nothing else), with the
//     port remap; the IPv4 VIP still works on the same VMs;
//  3. DSR: the Muxes forwarded what they received and received no more
//     than the client sent;
//  4. a datagram with a hop-by-hop options header to an all-ports IPv6
//     VIP reaches a Mux's data path (the steering program walks the
//     extension header), is counted there, and is answered;
//  5. ICMPv6 echo to the VIP is answered (by a Mux);
//  6. a datagram whose encapsulation would exceed the Muxes' uplink MTU
//     gets an ICMPv6 Packet Too Big back, with MTU 1500 − 50.
func TestFleetIPv6(t *testing.T) {
	lab := netlab.New(t, "fl6")
	fleetlabtest.RequireBIRD(t, "the dual-stack fleet test")
	vms := fleetlab.FleetVMs()
	vms6 := fleetlab.FleetVMs6(vms)
	f, err := fleetlab.BuildFleet(lab, 1, vms)
	require.NoError(t, err)
	require.NoError(t, f.AddIPv6(vms6))
	client := f.Clients[0]
	for i, vm := range vms {
		fleetlabtest.ServeVM(t, f.VMs[vm.Name], vm.Name, vm.Addr, flDIPPort, 7007)
		fleetlabtest.ServeVM(t, f.VMs[vm.Name], vm.Name, vms6[i].Addr, flDIPPort, 7007)
	}
	vip4, vip6 := fleetlab.FleetVIP, fleetlab.FleetVIP6
	vipAny6 := netip.MustParseAddr("2001:db8:100::2") // UDP, every port
	services := []fleetlab.Service{
		{Name: "web", Addr: vip4, Proto: flow.ProtoTCP, Port: flVIPPort, VNI: fleetlab.FleetVNI, DIPPort: flDIPPort, Probe: &flProbe},
		{Name: "web6", Addr: vip6, Proto: flow.ProtoTCP, Port: flVIPPort, VNI: fleetlab.FleetVNI, DIPPort: flDIPPort, Probe: &flProbe},
		{Name: "echo6", Addr: vip6, Proto: flow.ProtoUDP, Port: 7, VNI: fleetlab.FleetVNI, DIPPort: 7007},
		{Name: "any6", Addr: vipAny6, Proto: flow.ProtoUDP, VNI: fleetlab.FleetVNI},
	}
	bird := fleetlabtest.StartBIRD(t, f.Router, fleetlab.FleetBIRD6())
	bin := fleetlabtest.Examples(t)
	dir := t.TempDir()
	hostConf := filepath.Join(dir, "fleet.yaml")
	fleetlabtest.WriteDocument(t, hostConf, fleetlab.FleetDoc6(1, 0, true, services, vms, vms6))
	var muxes [fleetlab.FleetMuxes]*fleetlab.Proc
	for i := range muxes {
		conf := filepath.Join(dir, fmt.Sprintf("mux%d.yaml", i+1))
		fleetlabtest.WriteDocument(t, conf, fleetlab.FleetDoc6(1, i+1, true, services, vms, vms6))
		muxes[i] = fleetlabtest.Start(t, f.Muxes[i], fmt.Sprintf("mux%d", i+1), filepath.Join(bin, "mux"),
			"-interface", "up", "-config", conf, "-conns", "65536",
			"-metrics", net.JoinHostPort(fleetlab.FleetMuxAddr(i+1).String(), strconv.Itoa(flMetrics)))
	}
	for j := range fleetlab.FleetHosts {
		fleetlabtest.Start(t, f.Hosts[j], fmt.Sprintf("host%d", j+1), filepath.Join(bin, "hostagent"),
			"-uplink", "up", "-host", fmt.Sprintf("host%d", j+1), "-config", hostConf, "-conns", "65536",
			"-metrics", net.JoinHostPort(fleetlab.FleetHostAddr(j+1).String(), strconv.Itoa(flMetrics)))
	}
	muxMetrics := func(i int) map[string]float64 {
		return fleetlabtest.Scrape(t, f.Muxes[i], netip.AddrPortFrom(fleetlab.FleetMuxAddr(i+1), flMetrics))
	}

	// 1. Every backend up on both Muxes, the IPv6 VIP routed over both.
	waitFor(t, "every IPv6 backend up on both Muxes", 30*time.Second, func() bool {
		for i := range muxes {
			m, err := fleetlab.Scrape(f.Muxes[i], netip.AddrPortFrom(fleetlab.FleetMuxAddr(i+1), flMetrics))
			if err != nil {
				return false
			}
			for _, vm := range vms6 {
				if m[fmt.Sprintf(`xdplb_backend_up{backend=%q,vip="web6"}`, vm.Name)] != 1 {
					return false
				}
			}
		}
		return true
	})
	for _, v := range []netip.Addr{vip6, vipAny6} {
		fleetlabtest.WaitNextHops(t, f.Router, bird, 30*time.Second, netip.PrefixFrom(v, 128),
			fleetlab.FleetMuxAddr6(1), fleetlab.FleetMuxAddr6(2))
	}

	// 2. HTTP and UDP over IPv6; first until one of each is answered (the
	// nodes' next hops resolve), then counted.
	hc := fleetlab.HTTPClient(client, 5*time.Second)
	url6 := func(q string) string { return fmt.Sprintf("http://[%s]:%d/?q=%s", vip6, flVIPPort, q) }
	echo6 := netip.AddrPortFrom(vip6, 7)
	waitFor(t, "a first HTTP answer over IPv6", 30*time.Second, func() bool {
		_, err := fleetlab.Get(hc, url6("warm"))
		return err == nil
	})
	waitFor(t, "a first UDP answer over IPv6", 30*time.Second, func() bool {
		_, err := fleetlab.UDPEcho(client, echo6, "warm", time.Second)
		return err == nil
	})
	cl0 := fleetlabtest.LinkStats(t, client, "up")
	rx0, tx0 := muxPacketsOf(t, muxMetrics)
	const n = 200
	served := map[string]int{}
	names := map[string]bool{}
	for _, vm := range vms {
		names[vm.Name] = true
	}
	for i := range n {
		q := strconv.Itoa(i)
		body, err := fleetlab.Get(hc, url6(q))
		require.NoError(t, err, "HTTP request %d over IPv6", i)
		name, got, _ := strings.Cut(body, " ")
		require.True(t, names[name] && got == q, "HTTP request %d: answer %q", i, body)
		served[name]++
	}
	for _, vm := range vms {
		require.Positive(t, served[vm.Name], "%s served none of %d IPv6 requests: %v", vm.Name, n, served)
	}
	const udpN = 50
	for i := range udpN {
		msg := fmt.Sprintf("dgram %d", i)
		ans, err := fleetlab.UDPEcho(client, echo6, msg, 2*time.Second)
		require.NoError(t, err, "UDP datagram %d over IPv6", i)
		name, got, _ := strings.Cut(ans, ": ")
		require.True(t, names[name] && got == msg, "UDP datagram %d: answer %q", i, ans)
	}
	t.Logf("IPv6: %d HTTP requests answered %v, %d UDP datagrams answered from %v", n, served, udpN, echo6)
	body, err := fleetlab.Get(hc, fmt.Sprintf("http://%s:%d/?q=v4", vip4, flVIPPort))
	require.NoError(t, err, "the IPv4 VIP on the same VMs")
	require.True(t, strings.HasSuffix(body, " v4"), "IPv4 answer %q", body)

	// 3. DSR.
	var rx, tx [fleetlab.FleetMuxes]float64
	waitFor(t, "each Mux to have transmitted what it received", 10*time.Second, func() bool {
		rx, tx = muxPacketsOf(t, muxMetrics)
		return rx[0]-rx0[0] == tx[0]-tx0[0] && rx[1]-rx0[1] == tx[1]-tx0[1]
	})
	cl1 := fleetlabtest.LinkStats(t, client, "up")
	clTX, clRX := cl1.TxPackets-cl0.TxPackets, cl1.RxPackets-cl0.RxPackets
	d0, d1 := rx[0]-rx0[0], rx[1]-rx0[1]
	t.Logf("client sent %d packets and received %d; mux1 received %v, mux2 %v (each transmitted as many)", clTX, clRX, d0, d1)
	require.Positive(t, d0+d1, "the Muxes carried the flows")
	require.LessOrEqual(t, d0+d1, float64(clTX), "the Muxes received only what the client sent: no reply passed through them")
	require.GreaterOrEqual(t, clRX, uint64(3*n+udpN), "the replies reached the client")

	// 4. A datagram with a hop-by-hop options header to the all-ports
	// VIP: the Muxes' steering walks the extension header to UDP, the
	// Mux forwards and counts it, the Host Agent translates it behind
	// the header, and the VM's answer comes back from the VIP.
	any0 := 0.0
	for i := range muxes {
		any0 += muxMetrics(i)[`xdplb_vip_packets_total{vip="any6"}`]
	}
	hbh := netip.AddrPortFrom(vipAny6, 7007)
	waitFor(t, "an answer to a datagram with a hop-by-hop header", 10*time.Second, func() bool {
		ans, err := udpEchoHopByHop(t, client, hbh, "hop-by-hop", time.Second)
		return err == nil && strings.HasSuffix(ans, ": hop-by-hop")
	})
	any1 := 0.0
	for i := range muxes {
		any1 += muxMetrics(i)[`xdplb_vip_packets_total{vip="any6"}`]
	}
	require.Positive(t, any1-any0, "the Muxes counted the datagrams with a hop-by-hop header for the all-ports VIP")

	// 5 and 6: ICMPv6 on a raw socket in the client.
	var ic net.PacketConn
	require.NoError(t, client.Do(func() (err error) {
		ic, err = net.ListenPacket("ip6:ipv6-icmp", fleetlab.FleetClientAddr6(1).String())
		return err
	}))
	defer ic.Close()
	echo := make([]byte, 8+16)
	echo[0] = 128 // echo request; the kernel fills in the checksum
	binary.BigEndian.PutUint16(echo[4:], 0x6c62)
	binary.BigEndian.PutUint16(echo[6:], 1)
	copy(echo[8:], "xdplb ipv6 echo!")
	waitFor(t, "an ICMPv6 echo reply from the VIP", 10*time.Second, func() bool {
		_, err := ic.WriteTo(echo, &net.IPAddr{IP: vip6.AsSlice()})
		require.NoError(t, err)
		typ, from, msg := readICMPv6(t, ic, time.Second)
		return typ == 129 && from == vip6 && string(msg[8:]) == string(echo[8:])
	})

	// A 1500-byte IPv6 packet (the client's MTU): 1550 bytes once
	// encapsulated, more than the Muxes' uplink MTU of 1500.
	uc, err := client.Dial(t.Context(), "udp6", echo6.String())
	require.NoError(t, err)
	defer uc.Close()
	big := make([]byte, 1500-40-8)
	copy(big, "too big")
	_, err = uc.Write(big)
	require.NoError(t, err)
	var ptb []byte
	waitFor(t, "an ICMPv6 Packet Too Big for the large datagram", 10*time.Second, func() bool {
		typ, _, msg := readICMPv6(t, ic, time.Second)
		if typ == 2 {
			ptb = msg
			return true
		}
		return false
	})
	require.EqualValues(t, 1500-50, binary.BigEndian.Uint32(ptb[4:]), "Packet Too Big MTU: the uplink's 1500 less VXLAN over IPv4")
	quoted := ptb[8:]
	require.GreaterOrEqual(t, len(quoted), 40+8)
	require.Equal(t, vip6, netip.AddrFrom16([16]byte(quoted[24:40])), "the quoted packet is the datagram to the VIP")
	require.EqualValues(t, 17, quoted[6])
	require.EqualValues(t, 7, binary.BigEndian.Uint16(quoted[40+2:]))
}

// udpEchoHopByHop is fleetlab.UDPEcho with a hop-by-hop options header
// (one PadN option) on the datagram sent (IPV6_HOPOPTS, CAP_NET_RAW).
func udpEchoHopByHop(t *testing.T, n *netlab.NS, to netip.AddrPort, msg string, timeout time.Duration) (string, error) {
	t.Helper()
	c, err := n.Dial(t.Context(), "udp6", to.String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	rc, err := c.(*net.UDPConn).SyscallConn()
	require.NoError(t, err)
	var serr error
	require.NoError(t, rc.Control(func(fd uintptr) {
		opt := string([]byte{0, 0, 1, 4, 0, 0, 0, 0}) // next header, length 0 (8 bytes), PadN of 4
		serr = unix.SetsockoptString(int(fd), unix.IPPROTO_IPV6, unix.IPV6_HOPOPTS, opt)
	}))
	require.NoError(t, serr, "IPV6_HOPOPTS")
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	require.NoError(t, c.SetReadDeadline(time.Now().Add(timeout)))
	buf := make([]byte, 2048)
	k, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	return string(buf[:k]), nil
}

// readICMPv6 reads one ICMPv6 message from c within timeout; type 0 when
// none came.
func readICMPv6(t *testing.T, c net.PacketConn, timeout time.Duration) (typ uint8, from netip.Addr, msg []byte) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(timeout)))
	buf := make([]byte, 2048)
	k, addr, err := c.ReadFrom(buf)
	if err != nil || k < 8 {
		return 0, netip.Addr{}, nil
	}
	a, _ := netip.AddrFromSlice(addr.(*net.IPAddr).IP)
	return buf[0], a.Unmap(), buf[:k]
}

// muxPacketsOf returns each Mux's data-path receive and transmit counters.
func muxPacketsOf(t *testing.T, metrics func(int) map[string]float64) (rx, tx [fleetlab.FleetMuxes]float64) {
	t.Helper()
	for i := range rx {
		m := metrics(i)
		rx[i], tx[i] = m[`xdplb_packets_total{direction="rx"}`], m[`xdplb_packets_total{direction="tx"}`]
	}
	return rx, tx
}
