package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// keepAlive is one HTTP/1.1 connection through the VIP, kept open.
type keepAlive struct {
	c  net.Conn
	rd *bufio.Reader
	vm string // the VM that served its first request
}

func (l *haLab) dialKeepAlive(t *testing.T, addr string) *keepAlive {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.client.Dial(ctx, "tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &keepAlive{c: c, rd: bufio.NewReader(c)}
}

// get sends one request on the connection and returns the body (the name
// of the VM that served it).
func (k *keepAlive) get() (string, error) {
	_ = k.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(k.c, "GET / HTTP/1.1\r\nHost: vip\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(k.rd, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestFloodEndToEnd runs examples/mux and examples/hostagent, both with
// tables of 1,024 connections, and floods them from spoofed sources with
// every kind of packet issue 10 names — SYNs, FINs, RSTs, pairs of ACKs and
// pairs of UDP datagrams, 20 × the table's capacity of each — aimed at a
// second TCP port of the VIP ("bait", whose VMs answer with RSTs and
// SYN-ACKs as kernels do) and at the UDP echo service, while HTTP
// connections to the web service live through it:
//
//   - connections established before the flood, and connections opened
//     during it, keep their entries on both nodes: after the flood a third
//     VM joins the pool, which moves about a third of the web service's
//     Maglev picks, and every one of those connections still answers from
//     the VM that served it before (a connection without an entry would
//     be sent to the new VM and reset);
//   - on the Mux the attacked services are held to their share
//     (xdplb_vip_conntable_total{outcome="share_refused"}), the web
//     service's new flows are never refused;
//   - the Host Agent's NAT table, which gets the flood the Mux forwarded
//     without entries, evicted flood entries and nothing else.
//
// The spoofed sources are in 198.19.128.0/17, which the router blackholes,
// so the VMs' answers to them end there.
func TestFloodEndToEnd(t *testing.T) {
	const capacity = 1024
	l := newHALab(t)
	vmC := fleetlab.VM{Name: "vm-c", Host: 1, Port: "vm_c", Addr: netip.MustParseAddr("198.18.4.3"), MAC: net.HardwareAddr{2, 0, 0, 0, 4, 3}}
	ns, err := l.lab.Namespace("vmc")
	require.NoError(t, err)
	require.NoError(t, fleetlab.WireVM(l.lab, l.host, ns, vmC, netip.MustParseAddr(haGateway)))
	l.serveVMs()
	fleetlabtest.ServeVM(t, ns, vmC.Name, vmC.Addr, 8080, 7007)
	spoofNet := netip.MustParsePrefix("198.19.128.0/17")
	require.NoError(t, l.router.Do(func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: spoofNet.Addr().AsSlice(), Mask: net.CIDRMask(17, 32)}, Type: unix.RTN_BLACKHOLE})
	}))
	vip := netip.MustParseAddr(haVIP)
	doc := func(v uint64, vms ...fleetlab.VM) *fleetlab.Doc {
		d := haDocumentOf(v, vms...)
		d.Services = append(d.Services, fleetlab.Service{Name: "bait", Addr: vip, Proto: flow.ProtoTCP, Port: 81, VNI: 100, DIPPort: 8081})
		return d
	}
	l.writeDocument(doc(1, haVMs...))
	conns := fmt.Sprint(capacity)
	l.start("mux", l.mux, "mux", "-interface", "up", "-metrics", netip.AddrPortFrom(netip.MustParseAddr(haMux), haMuxMet).String(), "-conns", conns)
	l.start("hostagent", l.host, "hostagent", "-uplink", "up", "-host", "host-1",
		"-metrics", netip.AddrPortFrom(netip.MustParseAddr(haHost), haHostMet).String(), "-conns", conns)
	muxMetrics := func() map[string]float64 { return l.scrape(t, l.mux, haMux, haMuxMet) }
	hostMetrics := func() map[string]float64 { return l.scrape(t, l.host, haHost, haHostMet) }
	waitFor(t, "both backends up on the Mux", 30*time.Second, func() bool {
		m, err := scrapeErr(l.mux, haMux, haMuxMet)
		return err == nil && m[`xdplb_backend_up{backend="vm-a",vip="web"}`] == 1 &&
			m[`xdplb_backend_up{backend="vm-b",vip="web"}`] == 1
	})
	waitFor(t, "an HTTP GET through the VIP", 30*time.Second, func() bool {
		_, err := get(l.httpClient())
		return err == nil
	})

	web := net.JoinHostPort(haVIP, "80")
	open := func(n int) []*keepAlive {
		ks := make([]*keepAlive, n)
		for i := range ks {
			ks[i] = l.dialKeepAlive(t, web)
			vm, err := ks[i].get()
			require.NoError(t, err)
			ks[i].vm = vm
		}
		// A second request after ProveAfter (200 ms) proves each
		// connection on both nodes.
		time.Sleep(300 * time.Millisecond)
		for _, k := range ks {
			vm, err := k.get()
			require.NoError(t, err)
			require.Equal(t, k.vm, vm)
		}
		return ks
	}
	const perPhase = 24
	before := open(perPhase)

	// The flood: 20 × capacity spoofed flows of each kind, in five
	// interleaved streams; the web connections opened meanwhile.
	raw := rawSender(t, l.client)
	rng := rand.New(rand.NewPCG(1, 2))
	kinds := []struct {
		name string
		pkts int
		make func(src netip.Addr, sport uint16) []byte
	}{
		{"SYN", 1, func(s netip.Addr, p uint16) []byte { return spoofedTCP(t, s, p, vip, 81, layers.TCP{SYN: true}) }},
		{"FIN", 1, func(s netip.Addr, p uint16) []byte {
			return spoofedTCP(t, s, p, vip, 81, layers.TCP{FIN: true, ACK: true})
		}},
		{"RST", 1, func(s netip.Addr, p uint16) []byte { return spoofedTCP(t, s, p, vip, 81, layers.TCP{RST: true}) }},
		{"ACK-pairs", 2, func(s netip.Addr, p uint16) []byte { return spoofedTCP(t, s, p, vip, 81, layers.TCP{ACK: true}) }},
		{"UDP", 2, func(s netip.Addr, p uint16) []byte { return spoofedUDP(t, s, p, vip, 7, 64, "flood") }},
	}
	m0, h0 := muxMetrics(), hostMetrics()
	sent := 0
	var during []*keepAlive
	for i := range capacity * 20 {
		for _, k := range kinds {
			src := spoofNet.Addr().As4()
			src[2], src[3] = 128+byte(rng.IntN(128)), byte(rng.IntN(256))
			pkt := k.make(netip.AddrFrom4(src), uint16(1024+rng.IntN(60000)))
			for range k.pkts {
				raw.send(t, pkt)
				sent++
			}
		}
		if i%(capacity*20/perPhase) == 0 && len(during) < perPhase {
			during = append(during, open(1)...)
		}
	}
	waitFor(t, "the Mux received the flood", 30*time.Second, func() bool {
		m, err := scrapeErr(l.mux, haMux, haMuxMet)
		return err == nil && m[`xdplb_packets_total{direction="rx"}`]-m0[`xdplb_packets_total{direction="rx"}`] >= float64(sent)*0.9
	})
	m1, h1 := muxMetrics(), hostMetrics()
	delta := func(a, b map[string]float64, k string) float64 { return b[k] - a[k] }
	t.Logf("sent %d spoofed packets; Mux: %v %v; Host Agent: %v %v", sent,
		nonZero(m1, "xdplb_vip_conntable_total"), nonZero(m1, "xdplb_conntable_"), nonZero(h1, "xdplb_nat_table"), nonZero(h1, "xdplb_drops_total"))
	for _, vipName := range []string{"bait", "echo"} {
		require.Positive(t, delta(m0, m1, fmt.Sprintf(`xdplb_vip_conntable_total{outcome="share_refused",vip=%q}`, vipName)),
			"the flood on %s was not held to its share", vipName)
	}
	require.Zero(t, m1[`xdplb_vip_conntable_total{outcome="share_refused",vip="web"}`]+m1[`xdplb_vip_conntable_total{outcome="refused",vip="web"}`],
		"the web service's new flows were refused")
	require.Positive(t, delta(h0, h1, `xdplb_nat_table_events_total{event="eviction"}`), "the flood did not fill the Host Agent's table")

	// A third VM joins: flows without an entry would move.
	l.writeDocument(doc(2, append(haVMs, vmC)...))
	waitFor(t, "vm-c up on the Mux", 30*time.Second, func() bool {
		m, err := scrapeErr(l.mux, haMux, haMuxMet)
		return err == nil && m[`xdplb_backend_up{backend="vm-c",vip="web"}`] == 1
	})
	waitFor(t, "a new connection served by vm-c", 30*time.Second, func() bool {
		hc := l.httpClient()
		for range 20 {
			if vm, err := get(hc); err == nil && vm == "vm-c" {
				return true
			}
		}
		return false
	})
	for i, k := range append(before, during...) {
		vm, err := k.get()
		require.NoError(t, err, "connection %d (served by %s) after vm-c joined", i, k.vm)
		require.Equal(t, k.vm, vm, "connection %d moved", i)
	}
}

// spoofedTCP builds an IPv4 TCP segment with gopacket, any source, with
// the flags of f.
func spoofedTCP(t *testing.T, src netip.Addr, sport uint16, dst netip.Addr, dport uint16, f layers.TCP) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	f.SrcPort, f.DstPort, f.Seq, f.Window = layers.TCPPort(sport), layers.TCPPort(dport), 1000, 1024
	_ = f.SetNetworkLayerForChecksum(ip)
	return gpkt.Serialize(t, ip, &f, gopacket.Payload(nil))
}
