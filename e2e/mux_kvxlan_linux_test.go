package e2e

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// The kernel VXLAN topology (TestMuxKernelVXLANBackend), a fleetlab.Star:
//
//	cloff [up 198.18.5.2]  ─ [c5 198.18.5.1]  ┐  client, checksum offload off
//	clon  [up 198.18.6.2]  ─ [c6 198.18.6.1]  ┤  client, the kernel's default offloads
//	mux1  [up 198.18.1.2]  ─ [m1 198.18.1.1]  ├ router (BIRD 2, ECMP on L4)
//	mux2  [up 198.18.2.2]  ─ [m2 198.18.2.1]  ┤
//	host3 [up 198.18.23.2] ─ [h3 198.18.23.1] ┘  no Host Agent: vxlan100 (VNI 100, port 4789,
//	                                               nolearning) holding the VIP 198.18.100.1/32
//
// (fleetlab.FleetKernelVXLAN, set up by the README's recipe). host3's
// servers listen on the VIP (HTTP on 80, UDP echo on 7) and, for the
// Muxes' probes, on 198.18.23.2:80.
const (
	kvxBackend = "kvx3"
	kvxHTTP    = 80
	kvxEcho    = 7
	kvxN       = 100 // HTTP requests and UDP datagrams per setting
)

// kvxDocument is Mux i's document: the VIP's web (TCP 80, probed by TCP
// connect) and echo (UDP 7) services, both served by host3's one backend.
func kvxDocument(i int, k fleetlab.KernelVXLAN) *fleetlab.Doc {
	m := e2eMuxes[i]
	return &fleetlab.Doc{
		Version: 1,
		Node:    m.name,
		BGP:     fleetlab.MuxBGP(m.addr, m.router),
		Services: []fleetlab.Service{
			{Name: "web", Addr: fleetlab.FleetVIP, Proto: flow.ProtoTCP, Port: kvxHTTP, VNI: k.VNI,
				Probe: &health.Spec{Type: health.ProbeTCP, Interval: 200 * time.Millisecond, Timeout: 100 * time.Millisecond, Rise: 1, Fall: 2}},
			{Name: "echo", Addr: fleetlab.FleetVIP, Proto: flow.ProtoUDP, Port: kvxEcho, VNI: k.VNI},
		},
		Pool:  []fleetlab.VM{k.Backend(kvxBackend, 1, 1)},
		Hosts: []fleetlab.Host{k.Host()},
	}
}

// TestMuxKernelVXLANBackend sends real HTTP and UDP through two Muxes to
// a backend host that runs no xdplb code, only the kernel's vxlan device
// (the "DR" model of the README's "Backends without a Host Agent"): the
// kernel must accept our VXLAN as it is (an interop test against an
// implementation we did not write), every request is answered, from the
// VIP (a connected UDP socket and a TCP connection accept nothing else),
// without a checksum error on the host, and the Muxes carry only the
// client → VIP direction: what they forwarded for the VIP is exactly what
// the client sent, so none of the host's replies crossed them.
//
// A subtest per client checksum offload setting: with offload on, the
// client's frames reach the Mux with partial checksums, which the Mux
// must finish before it wraps them in VXLAN, since the host's kernel
// verifies every checksum (issue 9 item 7: 0/100 answered, and
// TcpInCsumErrors on the host, before it did).
func TestMuxKernelVXLANBackend(t *testing.T) {
	lab := netlab.New(t, "muxkvx")
	fleetlabtest.RequireBIRD(t, "the kernel VXLAN backend test")
	star, err := fleetlab.NewStar(lab)
	require.NoError(t, err)
	attach := func(name, rif string, subnet int) *netlab.NS {
		n, err := star.Attach(name, rif, subnet)
		require.NoError(t, err)
		return n
	}
	muxNS := [2]*netlab.NS{attach("mux1", "m1", 1), attach("mux2", "m2", 2)}
	k := fleetlab.FleetKernelVXLAN()
	host, err := star.AttachKernelVXLAN(k, "h3", fleetlab.FleetKernelVXLANSubnet)
	require.NoError(t, err)
	srv, err := fleetlab.ServeKernelVXLAN(host, k, kvxBackend, kvxHTTP, kvxEcho)
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })

	bird := fleetlabtest.StartBIRD(t, star.Router, e2eBIRDConfig())
	bin := filepath.Join(fleetlabtest.Build(t, fleetlab.MuxPackage), "mux")
	dir := t.TempDir()
	var muxes [2]*muxProc
	for i, m := range e2eMuxes {
		conf := filepath.Join(dir, m.name+".yaml")
		fleetlabtest.WriteDocument(t, conf, kvxDocument(i, k))
		muxes[i] = &muxProc{ns: muxNS[i], Proc: fleetlabtest.Start(t, muxNS[i], m.name, bin,
			"-interface", "up", "-config", conf, "-metrics", netip.AddrPortFrom(m.addr, e2eMetrics).String())}
	}
	fleetlabtest.WaitNextHops(t, star.Router, bird, 30*time.Second, netip.PrefixFrom(fleetlab.FleetVIP, 32),
		e2eMuxes[0].addr, e2eMuxes[1].addr)
	for i, p := range muxes {
		fleetlabtest.WaitFor(t, e2eMuxes[i].name+": host3's backend up (probed at 198.18.23.2:80)", 30*time.Second, func() bool {
			ms, err := p.metrics(e2eMuxes[i].addr)
			return err == nil && ms[fmt.Sprintf(`xdplb_backend_up{backend=%q,vip="web"}`, kvxBackend)] == 1
		})
	}

	for _, tc := range []struct {
		name     string
		client   string
		subnet   int
		offloads bool // the client's checksum offload stays on
	}{
		{"offloads-off", "cloff", 5, false},
		{"offloads-on", "clon", 6, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := attach(tc.client, fmt.Sprintf("c%d", tc.subnet), tc.subnet)
			if !tc.offloads {
				require.NoError(t, client.DisableChecksumOffload("up"))
			}
			hostBefore, clientBefore, muxBefore := snmp(t, host), snmp(t, client), vipPackets(t, muxes)
			partialBefore := partialChecksums(t, muxes)
			toMuxesBefore := framesToMuxes(t, star.Router)

			hc := fleetlab.HTTPClient(client, 5*time.Second)
			httpOK, udpOK := 0, 0
			var firstErr error
			failures := 0
			for i := 0; i < kvxN && failures < 3; i++ { // a broken path fails in seconds, not minutes
				body, err := fleetlab.Get(hc, fmt.Sprintf("http://%v/?q=%d", fleetlab.FleetVIP, i))
				if err == nil && body != fmt.Sprintf("%s %d", kvxBackend, i) {
					err = fmt.Errorf("GET %d answered %q", i, body)
				}
				if err == nil {
					httpOK++
				} else if failures++; firstErr == nil {
					firstErr = err
				}
				msg := fmt.Sprintf("echo %d", i)
				answer, err := fleetlab.UDPEcho(client, netip.AddrPortFrom(fleetlab.FleetVIP, kvxEcho), msg, 2*time.Second)
				if err == nil && answer != kvxBackend+": "+msg {
					err = fmt.Errorf("echo %d answered %q", i, answer)
				}
				if err == nil {
					udpOK++
				} else if failures++; firstErr == nil {
					firstErr = err
				}
			}
			hostAfter := snmp(t, host)
			t.Logf("HTTP %d/%d, UDP %d/%d answered from the VIP; host3 TcpInCsumErrors +%d, UdpInCsumErrors +%d",
				httpOK, kvxN, udpOK, kvxN, hostAfter["Tcp.InCsumErrors"]-hostBefore["Tcp.InCsumErrors"],
				hostAfter["Udp.InCsumErrors"]-hostBefore["Udp.InCsumErrors"])
			require.Equal(t, kvxN, httpOK, "HTTP requests answered by host3 through the VIP; first error: %v", firstErr)
			require.Equal(t, kvxN, udpOK, "UDP datagrams answered by host3 from the VIP; first error: %v", firstErr)
			for _, c := range []string{"Tcp.InCsumErrors", "Udp.InCsumErrors"} {
				require.Zero(t, hostAfter[c]-hostBefore[c], "host3's kernel counted checksum errors (%s)", c)
			}
			require.Positive(t, hostAfter["Tcp.OutSegs"]-hostBefore["Tcp.OutSegs"], "host3 sent the TCP replies")
			// The setting took effect: with offload on, the Muxes finished
			// the client's partial checksums; with it off, there were none.
			if partial := partialChecksums(t, muxes) - partialBefore; tc.offloads {
				require.Positive(t, partial, "partial checksums the Muxes completed")
			} else {
				require.Zero(t, partial, "partial checksums the Muxes completed")
			}

			// Direct Server Return. First, the Muxes forwarded for the VIP
			// exactly the packets the client sent (every one of its TCP
			// segments and UDP datagrams goes to the VIP), each once. Wait
			// for the last segments (a closing ACK) to be counted.
			var sent, forwarded int64
			fleetlabtest.WaitFor(t, "the Muxes to forward as many VIP packets as the client sent", 10*time.Second, func() bool {
				c := snmp(t, client)
				sent = c["Tcp.OutSegs"] + c["Tcp.RetransSegs"] + c["Udp.OutDatagrams"] -
					(clientBefore["Tcp.OutSegs"] + clientBefore["Tcp.RetransSegs"] + clientBefore["Udp.OutDatagrams"])
				forwarded = vipPackets(t, muxes) - muxBefore
				return sent == forwarded
			})
			t.Logf("the client sent %d packets to the VIP; the Muxes forwarded %d", sent, forwarded)
			// Second, the host's replies did not reach the Muxes at all
			// (not even their kernels, which the data path's counters do not
			// see): besides the client's packets, the router sent the Muxes
			// fewer frames than the host sent packets. The host's packets
			// are its replies plus its answers to the Muxes' probes; the
			// frames beyond the client's are those answers, BGP and ARP. Had
			// the replies crossed the Muxes, the extra frames would be at
			// least all the host's packets.
			hostAfter = snmp(t, host)
			hostSent := hostAfter["Tcp.OutSegs"] + hostAfter["Tcp.RetransSegs"] + hostAfter["Udp.OutDatagrams"] -
				(hostBefore["Tcp.OutSegs"] + hostBefore["Tcp.RetransSegs"] + hostBefore["Udp.OutDatagrams"])
			extra := framesToMuxes(t, star.Router) - toMuxesBefore - forwarded
			t.Logf("host3 sent %d packets; the router sent the Muxes %d frames besides the client's", hostSent, extra)
			require.Less(t, extra, hostSent, "the host's replies crossed the Muxes (no Direct Server Return)")
		})
	}
}

// snmp returns n's kernel protocol counters.
func snmp(t *testing.T, n *netlab.NS) map[string]int64 {
	t.Helper()
	c, err := fleetlab.SNMP(n)
	require.NoError(t, err)
	out := make(map[string]int64, len(c))
	for k, v := range c {
		out[k] = int64(v) // for differences
	}
	return out
}

// framesToMuxes returns how many frames the router sent on its links to
// the Muxes (m1, m2): its kernel's count, which sees everything.
func framesToMuxes(t *testing.T, router *netlab.NS) int64 {
	t.Helper()
	var sum int64
	for _, ifname := range []string{"m1", "m2"} {
		sum += int64(fleetlabtest.LinkStats(t, router, ifname).TxPackets)
	}
	return sum
}

// partialChecksums returns how many partial checksums both Muxes
// completed (xdplb_partial_checksums_total, every interface).
func partialChecksums(t *testing.T, muxes [2]*muxProc) int64 {
	t.Helper()
	var sum float64
	for i, p := range muxes {
		ms, err := p.metrics(e2eMuxes[i].addr)
		require.NoError(t, err)
		for k, v := range ms {
			if strings.HasPrefix(k, "xdplb_partial_checksums_total") {
				sum += v
			}
		}
	}
	return int64(sum)
}

// vipPackets returns the packets both Muxes forwarded for the VIP's two
// services (xdplb_vip_packets_total).
func vipPackets(t *testing.T, muxes [2]*muxProc) int64 {
	t.Helper()
	var sum float64
	for i, p := range muxes {
		ms, err := p.metrics(e2eMuxes[i].addr)
		require.NoError(t, err)
		sum += ms[`xdplb_vip_packets_total{vip="web"}`] + ms[`xdplb_vip_packets_total{vip="echo"}`]
	}
	return int64(sum)
}
