package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// The end-to-end topology (see TestMuxEndToEnd), a fleetlab.Star:
//
//	client [up 198.18.5.2] ── [c 198.18.5.1]
//	                                 router (BIRD 2, AS 65000, ECMP on L4)
//	mux1 [up 198.18.1.2] ──────── [m1 198.18.1.1]
//	mux2 [up 198.18.2.2] ──────── [m2 198.18.2.1]
//	host [up 198.18.3.2] ──────── [h 198.18.3.1]
//	     lo: the DIPs 198.18.4.1-3/32 (probe listeners on :8080)
//
// Every namespace but the router routes 198.18.0.0/15 to the router; the
// router routes the DIPs (198.18.4.0/24) to the host and learns the VIPs
// from the Muxes over BGP.
const (
	e2eClient  = "198.18.5.2"
	e2eHost    = "198.18.3.2"
	e2eVIPTCP  = "198.18.100.1"
	e2eVIPUDP  = "198.18.100.2"
	e2ePortTCP = 80
	e2ePortUDP = 7777
	e2eVNITCP  = 100
	e2eVNIUDP  = 200
	e2eProbe   = 8080
	e2eMetrics = 9100
	e2eVXLAN   = 4789
)

// e2eDIPs are the backends of both VIPs: addresses on the host's lo.
var e2eDIPs = []fleetlab.VM{
	{Name: "vm-a", Host: 1, Addr: netip.MustParseAddr("198.18.4.1"), MAC: net.HardwareAddr{2, 0, 0, 0, 4, 1}},
	{Name: "vm-b", Host: 1, Addr: netip.MustParseAddr("198.18.4.2"), MAC: net.HardwareAddr{2, 0, 0, 0, 4, 2}},
	{Name: "vm-c", Host: 1, Addr: netip.MustParseAddr("198.18.4.3"), MAC: net.HardwareAddr{2, 0, 0, 0, 4, 3}},
}

// e2eMux is one Mux's place in the topology.
type e2eMux struct {
	name   string
	addr   netip.Addr // on the uplink "up"
	router netip.Addr // the router's end of the link
}

var e2eMuxes = [2]e2eMux{
	{"mux1", netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("198.18.1.1")},
	{"mux2", netip.MustParseAddr("198.18.2.2"), netip.MustParseAddr("198.18.2.1")},
}

// e2eDocument is the desired-state document of Mux i. Only node and bgp
// differ between the Muxes; the VIPs and the hash seed are the fleet's.
// The web VIP's backends serve (and are probed) on port 8080; the dns
// VIP's keep the packet's port.
func e2eDocument(i int) *fleetlab.Doc {
	m := e2eMuxes[i]
	return &fleetlab.Doc{
		Version: 1,
		Node:    m.name,
		BGP:     fleetlab.MuxBGP(m.addr, m.router),
		Services: []fleetlab.Service{
			{Name: "web", Addr: netip.MustParseAddr(e2eVIPTCP), Proto: flow.ProtoTCP, Port: e2ePortTCP, VNI: e2eVNITCP, DIPPort: e2eProbe,
				Probe: &health.Spec{Type: health.ProbeTCP, Interval: 200 * time.Millisecond, Timeout: 100 * time.Millisecond, Rise: 1, Fall: 2}},
			{Name: "dns", Addr: netip.MustParseAddr(e2eVIPUDP), Proto: flow.ProtoUDP, Port: e2ePortUDP, VNI: e2eVNIUDP},
		},
		Pool:      e2eDIPs,
		Hosts:     []fleetlab.Host{{Name: "host", Addr: netip.MustParseAddr(e2eHost)}},
		OmitHosts: true,
	}
}

// e2eBIRDConfig is the router's configuration: both Muxes as eBGP peers.
func e2eBIRDConfig() fleetlab.BIRDConfig {
	c := fleetlab.BIRDConfig{RouterID: netip.MustParseAddr("198.18.0.1"), ASN: fleetlab.RouterASN}
	for _, m := range e2eMuxes {
		c.Peers = append(c.Peers, fleetlab.BIRDPeer{Name: m.name, Addr: m.addr, ASN: fleetlab.MuxASN})
	}
	return c
}

// e2eLab is the running topology.
type e2eLab struct {
	t      *testing.T
	lab    *netlab.Lab
	dir    string
	client *netlab.NS
	router *netlab.NS
	host   *netlab.NS
	muxNS  [2]*netlab.NS
	bird   *fleetlab.BIRD
	bin    string // the examples/mux binary
}

// newE2ELab builds the namespaces, links, addresses and routes, starts
// BIRD in the router and builds the Mux binary. Everything is removed at
// cleanup, also when the test fails.
func newE2ELab(t *testing.T) *e2eLab {
	t.Helper()
	return newE2ELabWith(t, e2eBIRDConfig())
}

// newE2ELabWith is newE2ELab with the router's BIRD configured by bird.
func newE2ELabWith(t *testing.T, bird fleetlab.BIRDConfig) *e2eLab {
	t.Helper()
	lab := netlab.New(t, "muxe2e")
	fleetlabtest.RequireBIRD(t, "the Mux end-to-end test")
	l := &e2eLab{t: t, lab: lab, dir: t.TempDir()}
	star, err := fleetlab.NewStar(lab)
	require.NoError(t, err)
	l.router = star.Router
	attach := func(name, rif string, subnet int) *netlab.NS {
		n, err := star.Attach(name, rif, subnet)
		require.NoError(t, err)
		return n
	}
	l.muxNS[0], l.muxNS[1] = attach("mux1", "m1", 1), attach("mux2", "m2", 2)
	l.host = attach("host", "h", 3)
	l.client = attach("client", "c", 5)
	// The client keeps the kernel's offloads: its frames reach the Muxes
	// with partial checksums, which the Muxes complete
	// (engine.PartialChecksums) before the host's kernel sees them.
	for _, d := range e2eDIPs {
		require.NoError(t, l.host.AddAddr("lo", d.Addr.String()+"/32"))
	}
	require.NoError(t, l.router.AddRoute("198.18.4.0/24", e2eHost))

	l.bird = fleetlabtest.StartBIRD(t, l.router, bird)
	l.bin = filepath.Join(fleetlabtest.Build(t, fleetlab.MuxPackage), "mux")
	return l
}

func (l *e2eLab) birdc(args string) (string, error) { return l.bird.Birdc(args) }

// nextHops returns the gateways of the router's kernel route to p, sorted;
// nil when there is none.
func (l *e2eLab) nextHops(p netip.Prefix) []netip.Addr {
	l.t.Helper()
	return fleetlabtest.NextHops(l.t, l.router, p)
}

// waitNextHops polls the router's kernel table until the route to p has
// exactly want as next hops and returns when it saw that. The deadline is a
// hang guard, not a timing assertion.
func (l *e2eLab) waitNextHops(p netip.Prefix, want ...netip.Addr) time.Time {
	l.t.Helper()
	return fleetlabtest.WaitNextHops(l.t, l.router, l.bird, 30*time.Second, p, want...)
}

// muxProc is a running examples/mux process.
type muxProc struct {
	*fleetlab.Proc
	ns *netlab.NS
}

// startMux writes Mux i's document and runs the binary in its namespace.
func (l *e2eLab) startMux(i int) *muxProc {
	t := l.t
	m := e2eMuxes[i]
	conf := filepath.Join(l.dir, m.name+".yaml")
	fleetlabtest.WriteDocument(t, conf, e2eDocument(i))
	p := fleetlabtest.Start(t, l.muxNS[i], m.name, l.bin,
		"-interface", "up",
		"-config", conf,
		"-metrics", netip.AddrPortFrom(m.addr, e2eMetrics).String(),
		"-conns", "65536",
	)
	return &muxProc{Proc: p, ns: l.muxNS[i]}
}

// metrics scrapes the Mux's /metrics endpoint from inside its namespace
// and returns the samples, keyed by the metric line's name and labels as
// printed (e.g. `xdplb_packets_total{direction="rx"}`).
func (p *muxProc) metrics(addr netip.Addr) (map[string]float64, error) {
	return fleetlab.Scrape(p.ns, netip.AddrPortFrom(addr, e2eMetrics))
}

// vxlanCapture receives the VXLAN datagrams that reach the host: the kernel
// delivers the UDP payload (VXLAN header and inner frame) and the outer
// source (the Mux that sent it).
type vxlanCapture struct {
	conn net.PacketConn
	mu   sync.Mutex
	got  []captured
	done chan struct{}
}

// captured is one decoded VXLAN datagram.
type captured struct {
	outerSrc netip.Addr
	vni      uint32
	innerDst net.HardwareAddr
	src, dst netip.AddrPort
	proto    uint8
	syn      bool
	payload  []byte
	err      error // decoding failed: what was wrong
}

func (l *e2eLab) captureVXLAN() *vxlanCapture {
	t := l.t
	conn, err := l.host.ListenPacket(context.Background(), "udp4", netip.AddrPortFrom(netip.MustParseAddr(e2eHost), e2eVXLAN).String())
	require.NoError(t, err)
	c := &vxlanCapture{conn: conn, done: make(chan struct{})}
	go c.run()
	t.Cleanup(func() {
		conn.Close()
		<-c.done
	})
	return c
}

func (c *vxlanCapture) run() {
	defer close(c.done)
	buf := make([]byte, 65536)
	for {
		n, from, err := c.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		rec := decodeVXLAN(buf[:n])
		if ua, ok := from.(*net.UDPAddr); ok {
			rec.outerSrc = ua.AddrPort().Addr().Unmap()
		}
		c.mu.Lock()
		c.got = append(c.got, rec)
		c.mu.Unlock()
	}
}

// take returns and forgets what was captured so far.
func (c *vxlanCapture) take() []captured {
	c.mu.Lock()
	defer c.mu.Unlock()
	got := c.got
	c.got = nil
	return got
}

// decodeVXLAN decodes a VXLAN header and the inner frame with gopacket,
// the independent oracle.
func decodeVXLAN(b []byte) captured {
	var rec captured
	pkt := gopacket.NewPacket(b, layers.LayerTypeVXLAN, gopacket.Default)
	if el := pkt.ErrorLayer(); el != nil {
		rec.err = fmt.Errorf("gopacket: %v", el.Error())
		return rec
	}
	vx, ok := pkt.Layer(layers.LayerTypeVXLAN).(*layers.VXLAN)
	if !ok || !vx.ValidIDFlag {
		rec.err = fmt.Errorf("no VXLAN header with the I flag")
		return rec
	}
	rec.vni = vx.VNI
	eth, ok := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if !ok {
		rec.err = fmt.Errorf("no inner Ethernet header")
		return rec
	}
	rec.innerDst = eth.DstMAC
	ip, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if !ok {
		rec.err = fmt.Errorf("no inner IPv4 header (EtherType %v)", eth.EthernetType)
		return rec
	}
	src, _ := netip.AddrFromSlice(ip.SrcIP.To4())
	dst, _ := netip.AddrFromSlice(ip.DstIP.To4())
	rec.proto = uint8(ip.Protocol)
	switch l4 := pkt.TransportLayer().(type) {
	case *layers.UDP:
		rec.src, rec.dst = netip.AddrPortFrom(src, uint16(l4.SrcPort)), netip.AddrPortFrom(dst, uint16(l4.DstPort))
		rec.payload = bytes.Clone(l4.Payload)
	case *layers.TCP:
		rec.src, rec.dst = netip.AddrPortFrom(src, uint16(l4.SrcPort)), netip.AddrPortFrom(dst, uint16(l4.DstPort))
		rec.syn = l4.SYN && !l4.ACK
		rec.payload = bytes.Clone(l4.Payload)
	default:
		rec.err = fmt.Errorf("inner protocol %v", ip.Protocol)
	}
	return rec
}
