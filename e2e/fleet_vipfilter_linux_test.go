package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// The VIPs of TestFleetEtcdOtherHostsVIPFiltered, each served by one
// host's VMs only (fleetlab.Service.Backends): A by host1's, B and C by
// host2's. C comes with version 2.
var (
	vfVIPA = fleetlab.FleetVIP                   // web-a: vm11, vm12 (host1)
	vfVIPB = netip.MustParseAddr("198.18.100.2") // web-b: vm21, vm22 (host2)
	vfVIPC = netip.MustParseAddr("198.18.100.3") // web-c: vm22 (host2), from version 2
	vfPool = map[string][]string{"web-a": {"vm11", "vm12"}, "web-b": {"vm21", "vm22"}, "web-c": {"vm22"}}
)

// vfServices are version v's VIPs: web-a and web-b, and web-c from
// version 2.
func vfServices(v uint64) []fleetlab.Service {
	svc := func(name string, addr netip.Addr) fleetlab.Service {
		return fleetlab.Service{Name: name, Addr: addr, Proto: flow.ProtoTCP, Port: flVIPPort, VNI: fleetlab.FleetVNI,
			DIPPort: flDIPPort, Probe: &flProbe, Backends: vfPool[name]}
	}
	s := []fleetlab.Service{svc("web-a", vfVIPA), svc("web-b", vfVIPB)}
	if v >= 2 {
		s = append(s, svc("web-c", vfVIPC))
	}
	return s
}

// TestFleetEtcdOtherHostsVIPFiltered shows, with real packets, that in
// etcd mode a Host Agent's client filters drop what claims a VIP its host
// does not serve, an address it learns only from views.vips (issue 12:
// its view lists only its own VIPs). The fleet (two Muxes behind BIRD,
// two hosts with Host Agents, four VMs) runs from one document in an etcd
// member embedded in the test, applied with the xdplbctl binary: VIP A
// (198.18.100.1) is served by host1's VMs only, VIP B (198.18.100.2) by
// host2's only, so host1's view holds VIP A and not B.
//
//  1. Requests through VIP A are answered by vm11 and vm12, through VIP B
//     by vm21 and vm22: the set-up is sound. host1's view in etcd lists
//     web-a only; views.vips lists both addresses.
//  2. vm11 (host1) sends TCP segments from its DIP endpoint
//     (198.18.31.1:8080, the one its port steers to the data path) to
//     VIP B:80, as a reply to a client at VIP B's address would be: host1's
//     Host Agent drops every one as src_vip (the return path's filter
//     checks the reply's destination), none is translated or routed
//     (xdplb_nat_packets_total{outcome="direct"} stands still), and no Mux
//     forwards a packet for VIP B.
//  3. VXLAN from mux1's address (a tunnel source host1 accepts) to host1,
//     VNI 100, vm11's MAC, holding a SYN from VIP B:80 to VIP A:80 — what
//     a Mux that did not know VIP B would send: host1's Host Agent drops
//     every one as src_vip (the uplink's filter checks the inner source)
//     and translates none (outcome "inbound" stands still).
//  4. vm11's segments to 198.18.100.3:80 pass the filter (they leave
//     untranslated, for the kernel to route: no VIP has that address).
//     Version 2 adds VIP C at that address, served by vm22 on host2 only:
//     host1's view is not rewritten (same bytes, same etcd revision),
//     views.vips gains the address, host1 runs version 2, and the same
//     segments are now dropped as src_vip; no Mux forwards any for VIP C,
//     whose requests vm22 answers.
//
// Everything is removed at cleanup, also when the test fails.
func TestFleetEtcdOtherHostsVIPFiltered(t *testing.T) {
	began := time.Now()
	l := newVFLab(t)
	t.Logf("fleet ready after %v", time.Since(began).Round(time.Millisecond))

	// 1. Both VIPs answer, each from its own host's VMs.
	for _, w := range []struct {
		vip netip.Addr
		vms []string
	}{{vfVIPA, vfPool["web-a"]}, {vfVIPB, vfPool["web-b"]}} {
		for _, vm := range w.vms {
			waitFor(t, fmt.Sprintf("an answer from %s through %v", vm, w.vip), 30*time.Second, func() bool {
				name, err := l.get(w.vip, "warm")
				return err == nil && name == vm
			})
		}
	}
	view1, rev1 := l.view("host1")
	require.Equal(t, []string{"web-a"}, vipNames(t, view1), "host1's view lists the VIPs it serves")
	require.Equal(t, []netip.Addr{vfVIPA, vfVIPB}, l.vipAddresses(), "views.vips lists every VIP's address")

	// 2. vm11 sends to VIP B from its DIP endpoint.
	const n = 10
	vm11 := l.f.VMs["vm11"]
	raw := rawSender(t, vm11)
	c0 := l.counters()
	for i := range n {
		raw.send(t, vfSegment(t, vmAddr("vm11"), flDIPPort, vfVIPB, flVIPPort, uint32(i)))
	}
	c1 := l.waitSrcVIP(c0, n, "vm11's segments to VIP B")
	require.Equal(t, float64(n), c1.srcVIP-c0.srcVIP, "host1 dropped each of vm11's segments to VIP B as src_vip")
	require.Zero(t, c1.direct-c0.direct, "host1 sent none of them on untranslated")
	require.Zero(t, c1.muxVIP["web-b"]-c0.muxVIP["web-b"], "a Mux forwarded packets for VIP B")

	// 3. VXLAN from mux1's address: a SYN from VIP B to VIP A for vm11.
	c0 = c1
	l.sendVXLANFromMux1(t, n)
	c1 = l.waitSrcVIP(c0, n, "the SYNs from VIP B in VXLAN")
	require.Equal(t, float64(n), c1.srcVIP-c0.srcVIP, "host1 dropped each SYN from VIP B as src_vip")
	require.Zero(t, c1.inbound-c0.inbound, "host1 translated none of them for vm11")

	// 4. VIP C, added later. Before: its address passes host1's filter.
	c0 = c1
	for i := range n {
		raw.send(t, vfSegment(t, vmAddr("vm11"), flDIPPort, vfVIPC, flVIPPort, uint32(i)))
	}
	waitFor(t, "host1 to send vm11's segments to 198.18.100.3 on untranslated", 30*time.Second, func() bool {
		c, err := l.countersErr()
		return err == nil && c.direct-c0.direct >= n
	})
	c1 = l.counters()
	require.Equal(t, float64(n), c1.direct-c0.direct, "vm11's segments to 198.18.100.3 before VIP C: untranslated")
	require.Zero(t, c1.srcVIP-c0.srcVIP, "dropped as src_vip before any VIP has the address")

	l.apply(2)
	l.waitVersion(2, map[string][]string{"web-a": vfPool["web-a"], "web-b": vfPool["web-b"], "web-c": vfPool["web-c"]})
	view2, rev2 := l.view("host1")
	require.Equal(t, rev1, rev2, "host1's view rewritten by version 2, which adds a VIP host1 does not serve")
	require.Equal(t, view1, view2, "host1's view changed")
	require.Equal(t, []netip.Addr{vfVIPA, vfVIPB, vfVIPC}, l.vipAddresses(), "views.vips lists VIP C's address")

	c0 = l.counters()
	for i := range n {
		raw.send(t, vfSegment(t, vmAddr("vm11"), flDIPPort, vfVIPC, flVIPPort, uint32(n+i)))
	}
	c1 = l.waitSrcVIP(c0, n, "vm11's segments to VIP C")
	require.Equal(t, float64(n), c1.srcVIP-c0.srcVIP, "host1 dropped each of vm11's segments to VIP C as src_vip")
	require.Zero(t, c1.direct-c0.direct, "host1 sent none of them on untranslated")
	require.Zero(t, c1.muxVIP["web-c"]-c0.muxVIP["web-c"], "a Mux forwarded packets for VIP C")
	fleetlabtest.WaitNextHops(t, l.f.Router, l.bird, 30*time.Second, netip.PrefixFrom(vfVIPC, 32),
		fleetlab.FleetMuxAddr(1), fleetlab.FleetMuxAddr(2))
	waitFor(t, "an answer from vm22 through VIP C", 30*time.Second, func() bool {
		name, err := l.get(vfVIPC, "c")
		return err == nil && name == "vm22"
	})
	t.Logf("host1's drops: %v", nonZero(l.counters().host1, "xdplb_drops_total"))
	t.Logf("test ran %v", time.Since(began).Round(time.Millisecond))
}

// vfLab is the running fleet of TestFleetEtcdOtherHostsVIPFiltered.
type vfLab struct {
	*ovLab // its client, get and xdplbctl; the rest is unused
	f      *fleetlab.Fleet
	bird   *fleetlab.BIRD
	cli    *clientv3.Client
	dir    string
}

// newVFLab builds the fleet's topology with flVMs, starts an embedded
// etcd member and applies version 1 with xdplbctl, starts BIRD, the Muxes
// (-etcd, -node) and the Host Agents (-etcd, -host), and returns once
// every node runs version 1, both Muxes have every backend in service and
// the router routes VIPs A and B over both Muxes.
func newVFLab(t *testing.T) *vfLab {
	t.Helper()
	lab := netlab.New(t, "vpf")
	fleetlabtest.RequireBIRD(t, "the fleet test of another host's VIP")
	f, err := fleetlab.BuildFleet(lab, 1, flVMs)
	require.NoError(t, err)
	l := &vfLab{ovLab: &ovLab{t: t, client: f.Clients[0]}, f: f, dir: t.TempDir()}
	l.port.Store(10000 - 1) // see ovLab.get
	for name, n := range f.VMs {
		fleetlabtest.ServeVM(t, n, name, vmAddr(name), flDIPPort, 0)
	}

	// etcd, embedded, on a Unix socket; stopped after the nodes (cleanups
	// run last first), so they revoke their leases on the way out.
	cluster := etcdlab.NewCluster(l.dir, 1)
	e, err := cluster.Start(0, 30*time.Second)
	require.NoError(t, err)
	t.Cleanup(e.Close)
	l.etcd = cluster.Endpoints()[0]
	l.cli, err = etcdlab.Client(cluster.Endpoints())
	require.NoError(t, err)
	t.Cleanup(func() { l.cli.Close() })
	bin := fleetlabtest.Examples(t)
	l.ctl = filepath.Join(bin, "xdplbctl")
	l.apply(1)

	l.bird = fleetlabtest.StartBIRD(t, f.Router, fleetlab.FleetBIRD())
	for i, n := range f.Muxes {
		name := fmt.Sprintf("mux%d", i+1)
		fleetlabtest.Start(t, n, name, filepath.Join(bin, "mux"), "-interface", "up", "-etcd", l.etcd, "-node", name,
			"-conns", "65536", "-metrics", netip.AddrPortFrom(fleetlab.FleetMuxAddr(i+1), flMetrics).String())
	}
	for j, n := range f.Hosts {
		name := fmt.Sprintf("host%d", j+1)
		fleetlabtest.Start(t, n, name, filepath.Join(bin, "hostagent"), "-uplink", "up", "-etcd", l.etcd, "-host", name,
			"-conns", "65536", "-metrics", netip.AddrPortFrom(fleetlab.FleetHostAddr(j+1), flMetrics).String())
	}
	l.waitVersion(1, map[string][]string{"web-a": vfPool["web-a"], "web-b": vfPool["web-b"]})
	for _, vip := range []netip.Addr{vfVIPA, vfVIPB} {
		fleetlabtest.WaitNextHops(t, f.Router, l.bird, 30*time.Second, netip.PrefixFrom(vip, 32),
			fleetlab.FleetMuxAddr(1), fleetlab.FleetMuxAddr(2))
	}
	return l
}

// apply makes version v (vfServices, every VM of flVMs on its host) the
// fleet's document with xdplbctl apply.
func (l *vfLab) apply(v uint64) {
	t := l.t
	t.Helper()
	text, err := fleetlab.FleetShared(v, true, vfServices(v), flVMs, nil).Marshal()
	require.NoError(t, err)
	path := filepath.Join(l.dir, fmt.Sprintf("fleet-v%d.yaml", v))
	require.NoError(t, os.WriteFile(path, text, 0o644))
	out, err := l.xdplbctl("apply", "-f", path)
	require.NoError(t, err, out)
	require.Contains(t, out, fmt.Sprintf("applied version %d ", v))
}

// waitVersion waits until both Host Agents run version v with their
// data paths up, and both Muxes run it with every backend of backends
// (by VIP name) in service.
func (l *vfLab) waitVersion(v uint64, backends map[string][]string) {
	l.t.Helper()
	waitFor(l.t, fmt.Sprintf("version %d on every node, every backend in service on both Muxes", v), time.Minute, func() bool {
		for j := range l.f.Hosts {
			m, err := l.agentMetrics(j)
			if err != nil || m["xdplb_config_version"] != float64(v) || m["xdplb_datapath_up"] != 1 {
				return false
			}
		}
		for i := range l.f.Muxes {
			m, err := l.muxMetricsOf(i)
			if err != nil || m["xdplb_config_version"] != float64(v) {
				return false
			}
			for vip, vms := range backends {
				for _, vm := range vms {
					if m[fmt.Sprintf(`xdplb_backend_up{backend=%q,vip=%q}`, vm, vip)] != 1 {
						return false
					}
				}
			}
		}
		return true
	})
}

func (l *vfLab) agentMetrics(j int) (map[string]float64, error) {
	return fleetlab.Scrape(l.f.Hosts[j], netip.AddrPortFrom(fleetlab.FleetHostAddr(j+1), flMetrics))
}

func (l *vfLab) muxMetricsOf(i int) (map[string]float64, error) {
	return fleetlab.Scrape(l.f.Muxes[i], netip.AddrPortFrom(fleetlab.FleetMuxAddr(i+1), flMetrics))
}

// vfCounters are the counters the test reads: host1's src_vip drops and
// NAT outcomes (all of its metrics in host1), and the packets both Muxes
// together forwarded per VIP name.
type vfCounters struct {
	srcVIP, direct, inbound float64
	muxVIP                  map[string]float64
	host1                   map[string]float64
}

func (l *vfLab) countersErr() (vfCounters, error) {
	m, err := l.agentMetrics(0)
	if err != nil {
		return vfCounters{}, err
	}
	c := vfCounters{srcVIP: m[`xdplb_drops_total{reason="src_vip"}`], direct: m[`xdplb_nat_packets_total{outcome="direct"}`],
		inbound: m[`xdplb_nat_packets_total{outcome="inbound"}`], muxVIP: map[string]float64{}, host1: m}
	for i := range l.f.Muxes {
		mm, err := l.muxMetricsOf(i)
		if err != nil {
			return vfCounters{}, err
		}
		for vip := range vfPool {
			c.muxVIP[vip] += mm[fmt.Sprintf(`xdplb_vip_packets_total{vip=%q}`, vip)]
		}
	}
	return c, nil
}

func (l *vfLab) counters() vfCounters {
	l.t.Helper()
	c, err := l.countersErr()
	require.NoError(l.t, err)
	return c
}

// waitSrcVIP waits until host1 counted n more src_vip drops than in c0,
// and returns the counters then.
func (l *vfLab) waitSrcVIP(c0 vfCounters, n int, what string) vfCounters {
	t := l.t
	t.Helper()
	var last vfCounters
	err := fleetlab.Poll(context.Background(), fmt.Sprintf("host1 to count %d src_vip drops of %s", n, what), 30*time.Second, func() bool {
		c, err := l.countersErr()
		last = c
		return err == nil && c.srcVIP-c0.srcVIP >= float64(n)
	})
	if err != nil {
		t.Fatalf("%v: host1 counted %v src_vip drops of them; its drops %v, NAT %v", err, last.srcVIP-c0.srcVIP,
			nonZero(last.host1, "xdplb_drops_total"), nonZero(last.host1, "xdplb_nat_packets_total"))
	}
	c := l.counters()
	t.Logf("%s: host1's drops %v, NAT %v", what, nonZero(c.host1, "xdplb_drops_total"), nonZero(c.host1, "xdplb_nat_packets_total"))
	return c
}

// view returns the text of host's view as etcd holds it, and the key's
// revision.
func (l *vfLab) view(host string) ([]byte, int64) {
	t := l.t
	t.Helper()
	kv := l.etcdKey("/xdplb/views/" + host)
	require.NotNil(t, kv, "no view for %s in etcd", host)
	return gunzipped(t, kv.Value), kv.ModRevision
}

// vipAddresses returns the addresses etcd holds in views.vips.
func (l *vfLab) vipAddresses() []netip.Addr {
	t := l.t
	t.Helper()
	kv := l.etcdKey("/xdplb/views.vips")
	require.NotNil(t, kv, "no views.vips in etcd")
	text := gunzipped(t, kv.Value)
	addrs, ok := control.ReadVIPAddresses(text)
	require.True(t, ok, "views.vips: %q", text)
	return addrs
}

func (l *vfLab) etcdKey(key string) *mvccpb.KeyValue {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := l.cli.Get(ctx, key)
	require.NoError(l.t, err)
	if len(r.Kvs) == 0 {
		return nil
	}
	return r.Kvs[0]
}

// gunzipped returns b decompressed when it is gzip (as fleet.Apply stores
// views), else b.
func gunzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	if !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		return b
	}
	r, err := gzip.NewReader(bytes.NewReader(b))
	require.NoError(t, err)
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	return out
}

// vipNames returns the names of the VIPs of a view's text.
func vipNames(t *testing.T, text []byte) []string {
	t.Helper()
	d, err := control.Parse(text)
	require.NoError(t, err, "%s", text)
	var out []string
	for _, v := range d.VIPs {
		out = append(out, v.Name)
	}
	return out
}

// vfSegment builds an IPv4 TCP SYN-ACK src → dst, sequence number seq.
func vfSegment(t *testing.T, src netip.Addr, sport uint16, dst netip.Addr, dport uint16, seq uint32) []byte {
	return gpkt.Serialize(t,
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()},
		&layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: seq, Ack: 1, SYN: true, ACK: true,
			Window: 64240})
}

// sendVXLANFromMux1 sends n VXLAN datagrams from mux1's namespace (its
// address, a tunnel source of the document) to host1's VXLAN port: VNI
// FleetVNI, inner destination vm11's MAC, inside a TCP SYN from VIP B:80
// to VIP A:80.
func (l *vfLab) sendVXLANFromMux1(t *testing.T, n int) {
	t.Helper()
	vm11 := flVMs[slices.IndexFunc(flVMs, func(vm fleetlab.VM) bool { return vm.Name == "vm11" })]
	inner := gpkt.Serialize(t,
		&layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, DstMAC: vm11.MAC, EthernetType: layers.EthernetTypeIPv4},
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: vfVIPB.AsSlice(), DstIP: vfVIPA.AsSlice()},
		&layers.TCP{SrcPort: flVIPPort, DstPort: flVIPPort, Seq: 1, SYN: true, Window: 64240})
	vx := make([]byte, 8, 8+len(inner))
	vx[0] = 0x08 // I flag
	binary.BigEndian.PutUint32(vx[4:], fleetlab.FleetVNI<<8)
	vx = append(vx, inner...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.f.Muxes[0].Dial(ctx, "udp", netip.AddrPortFrom(fleetlab.FleetHostAddr(1), control.DefaultVXLANPort).String())
	require.NoError(t, err)
	defer c.Close()
	for range n {
		_, err := c.Write(vx)
		require.NoError(t, err)
	}
}
