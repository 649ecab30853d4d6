package mux

import (
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/flow"
)

// metricsDoc serves benchVIPs (so benchTargets addresses their traffic)
// with a few backends each, on IPv4 and IPv6 hosts; backend web4/c's host,
// 198.18.254.99, has no next hop in the tests (partialHops): its
// frames take the slow path (port 1, the kernel's in a running Mux).
const metricsDoc = `
version: %d
hash_seed: 7
vips:
  - name: web4
    address: 198.19.255.1
    protocol: tcp
    port: 80
    vni: 100
    backends:
%s
  - name: dns4
    address: 198.19.255.2
    protocol: udp
    port: 53
    vni: 200
    backends:
      - {name: d, address: 198.18.201.4, mac: "02:00:00:00:02:04", host: 198.18.254.4}
      - {name: e, address: 198.18.201.5, mac: "02:00:00:00:02:05", host: "2001:db8:254::5"}
  - name: web6
    address: 2001:db8:100::1
    protocol: tcp
    port: 80
    vni: 300
    backends:
      - {name: f, address: "2001:db8:200::6", mac: "02:00:00:00:03:06", host: "2001:db8:254::6"}
      - {name: g, address: "2001:db8:200::7", mac: "02:00:00:00:03:07", host: 198.18.254.7}
`

// metricsWebBackends are web4's backends; a reload drops a.
var metricsWebBackends = []string{
	`      - {name: a, address: 198.18.200.1, mac: "02:00:00:00:01:01", host: 198.18.254.1}`,
	`      - {name: b, address: 198.18.200.2, mac: "02:00:00:00:01:02", host: "2001:db8:254::2"}`,
	`      - {name: c, address: 198.18.200.3, mac: "02:00:00:00:01:03", host: 198.18.254.99}`,
}

func metricsDocument(t *testing.T, version int, web []string) *control.Document {
	doc, err := control.Parse([]byte(fmt.Sprintf(metricsDoc, version, strings.Join(web, "\n"))))
	require.NoError(t, err)
	return doc
}

// partialHops answers every destination with benchHop except
// 198.18.254.99, which stays unresolved (sent to the slow path by the
// next-hop stage).
var partialHops = nexthop.Static{Default: benchHop, Hops: map[netip.Addr]nexthop.Hop{netip.MustParseAddr("198.18.254.99"): {}}}

// metricsRig is a Mux that has applied a document, without a data path of
// its own: its workers run the Mux's pipeline (Mux.pipeline) over
// MemPorts.
type metricsRig struct {
	m       *Mux
	workers []*engine.Worker
	ports   []*engine.MemPort // the uplinks, port 0 of each worker
	kernel  []*engine.MemPort // port 1 of each worker: the slow path
}

func newMetricsRig(t *testing.T, workers int) *metricsRig {
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	require.NoError(t, os.WriteFile(path, []byte("version: 0\n"), 0o644))
	m, err := New(Config{Interface: "uplink0", ConfigPath: path, SourceV4: benchMuxSrc,
		SourceV6: netip.MustParseAddr("2001:db8:254::1"), Conns: flow.ConnTableConfig{Capacity: 4096},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	doc := metricsDocument(t, 1, metricsWebBackends)
	require.NoError(t, m.ctl.Apply(doc))
	r := &metricsRig{m: m}
	for i := 0; i < workers; i++ {
		pl, err := m.pipeline(doc.HashSeed, benchUplink, partialHops, workers)
		require.NoError(t, err)
		mp, err := engine.NewMemPort(engine.MemPortConfig{Name: fmt.Sprintf("uplink:%d", i), Capture: true})
		require.NoError(t, err)
		kp, err := engine.NewMemPort(engine.MemPortConfig{Name: fmt.Sprintf("kernel:%d", i), Capture: true})
		require.NoError(t, err)
		w, err := engine.NewWorker(engine.WorkerConfig{ID: i, Ports: []engine.Port{mp, kp}, Inputs: []engine.Input{{Port: 0, Pipeline: pl}}})
		require.NoError(t, err)
		r.workers, r.ports, r.kernel = append(r.workers, w), append(r.ports, mp), append(r.kernel, kp)
	}
	return r
}

// send hands frame i to worker i%workers and runs every worker until its
// port is drained. It returns the frames transmitted by this call.
func (r *metricsRig) send(frames [][]byte) [][]byte {
	all := append(append([]*engine.MemPort(nil), r.ports...), r.kernel...)
	sent := make([]int, len(all))
	for i, p := range all {
		sent[i] = len(p.Transmitted())
	}
	for i, f := range frames {
		r.ports[i%len(r.ports)].Inject(f)
	}
	for i, w := range r.workers {
		for r.ports[i].Stats().Queued > 0 {
			w.Poll()
		}
	}
	var out [][]byte
	for i, p := range all {
		out = append(out, p.Transmitted()[sent[i]:]...)
	}
	return out
}

// stats sums the workers' engine counters.
func (r *metricsRig) stats() engine.Stats {
	var s engine.Stats
	for _, w := range r.workers {
		w.Counters().Snapshot(&s)
	}
	return s
}

// scrape gathers c through a pedantic registry (which also checks that
// every sample matches a described metric) and returns the samples as
// `name{label="value",...}` → value, labels sorted by name.
func scrape(t *testing.T, c prometheus.Collector) map[string]float64 {
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			slices.Sort(ls)
			key := mf.GetName()
			if len(ls) > 0 {
				key += "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// trafficOracle is what the transmitted frames say, decoded by gopacket:
// per backend (by the inner destination MAC) and per VIP, the packets, the
// bytes of the inner IP packets, and the new flows: packets of a flow
// (inner 5-tuple) not seen before, or seen going to another backend (the
// flow was re-placed).
type trafficOracle struct {
	seen  map[string]string // flow → the sample labels of its backend
	macs  map[string][2]string
	count map[string]float64 // metric sample keys → value
}

func newTrafficOracle(doc *control.Document) *trafficOracle {
	o := &trafficOracle{seen: map[string]string{}, macs: map[string][2]string{}, count: map[string]float64{}}
	for _, v := range doc.VIPs {
		for _, b := range v.Backends {
			o.macs[net.HardwareAddr(b.MAC[:]).String()] = [2]string{v.Name, b.Name}
		}
	}
	return o
}

func (o *trafficOracle) add(t *testing.T, frames [][]byte) {
	for i, f := range frames {
		pkt := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
		vx, ok := pkt.Layer(layers.LayerTypeVXLAN).(*layers.VXLAN)
		require.True(t, ok, "frame %d: no VXLAN layer", i)
		in := gopacket.NewPacket(vx.Payload, layers.LayerTypeEthernet, gopacket.Default)
		eth := in.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		be, ok := o.macs[eth.DstMAC.String()]
		require.True(t, ok, "frame %d: inner destination %v is no backend", i, eth.DstMAC)
		nl := in.NetworkLayer()
		require.NotNil(t, nl, "frame %d", i)
		ipLen := len(nl.LayerContents()) + len(nl.LayerPayload())
		flowKey := nl.NetworkFlow().String() + " " + in.TransportLayer().TransportFlow().String()
		vip := fmt.Sprintf("{vip=%q}", be[0])
		bk := fmt.Sprintf("{backend=%q,vip=%q}", be[1], be[0])
		o.count["xdplb_vip_packets_total"+vip]++
		o.count["xdplb_backend_packets_total"+bk]++
		o.count["xdplb_vip_bytes_total"+vip] += float64(ipLen)
		o.count["xdplb_backend_bytes_total"+bk] += float64(ipLen)
		if o.seen[flowKey] != bk {
			o.seen[flowKey] = bk
			o.count["xdplb_vip_new_flows_total"+vip]++
			o.count["xdplb_backend_new_flows_total"+bk]++
		}
	}
}

// traffic returns the samples of the per-VIP and per-backend traffic
// metrics in ms.
func traffic(ms map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range ms {
		for _, p := range []string{"xdplb_vip_packets_total", "xdplb_vip_bytes_total", "xdplb_vip_new_flows_total",
			"xdplb_backend_packets_total", "xdplb_backend_bytes_total", "xdplb_backend_new_flows_total"} {
			if strings.HasPrefix(k, p+"{") {
				out[k] = v
			}
		}
	}
	return out
}

// TestCollectorTraffic pushes traffic through two workers running the
// Mux's pipeline and checks the per-VIP and per-backend packets, bytes and
// new flows the collector exports against the transmitted frames decoded by
// gopacket:
//   - the counts are what left: backend web4/c's host has no next hop, so
//     its packets are dropped after balancing and encapsulation, and it
//     counts nothing (the Account stage runs after the next hop);
//   - bytes are the client's IP packets (VLAN tags and encapsulation not
//     counted), new flows are each flow's first packet;
//   - every backend of the snapshot has its series, traffic or not;
//   - after a reload removing backend a, a's series go, the VIP totals keep
//     its counts and only grow.
func TestCollectorTraffic(t *testing.T) {
	r := newMetricsRig(t, 2)
	doc1 := metricsDocument(t, 1, metricsWebBackends)
	oracle := newTrafficOracle(doc1)

	flows := benchFlows(600, muxAgreeMix, 11, true)
	frames := benchTargets.Frames(flows)
	var sent [][]byte
	for pass := 0; pass < 2; pass++ { // new flows, then established
		out := r.send(frames)
		oracle.add(t, out)
		sent = append(sent, out...)
	}
	s := r.stats()
	require.EqualValues(t, 2*len(frames), s.RX)
	slow := 0
	for _, k := range r.kernel {
		slow += int(k.Stats().TXFrames)
	}
	require.NotZero(t, slow, "web4/c must have been picked, and its frames sent to the slow path")
	require.Empty(t, s.DropsByName())
	require.EqualValues(t, s.RX, len(sent))

	// The expected samples: the oracle's, every backend's series (c's at
	// zero), without those of removed backends.
	expected := func(removed ...string) map[string]float64 {
		want := maps.Clone(oracle.count)
		for _, n := range []string{"packets", "bytes", "new_flows"} {
			k := "xdplb_backend_" + n + `_total{backend="c",vip="web4"}`
			want[k] += 0
			for _, b := range removed {
				delete(want, "xdplb_backend_"+n+fmt.Sprintf(`_total{backend=%q,vip="web4"}`, b))
			}
		}
		return want
	}
	all := scrape(t, r.m.Collector())
	got := traffic(all)
	require.Equal(t, expected(), got)
	// The connection table's part in use, grown with the 600 flows, and
	// all of it.
	require.EqualValues(t, r.m.Conns().InUse(), all["xdplb_conntable_in_use"])
	require.EqualValues(t, r.m.Conns().Cap(), all["xdplb_conntable_capacity"])
	require.Less(t, all["xdplb_conntable_in_use"], all["xdplb_conntable_capacity"])
	require.EqualValues(t, len(sent), got[`xdplb_vip_packets_total{vip="web4"}`]+
		got[`xdplb_vip_packets_total{vip="dns4"}`]+got[`xdplb_vip_packets_total{vip="web6"}`])
	require.EqualValues(t, len(flows), got[`xdplb_vip_new_flows_total{vip="web4"}`]+
		got[`xdplb_vip_new_flows_total{vip="dns4"}`]+got[`xdplb_vip_new_flows_total{vip="web6"}`],
		"every flow is new once, those on c (slow path) included")
	require.NotZero(t, got[`xdplb_backend_packets_total{backend="a",vip="web4"}`])

	// Reload without backend a: its series go; the VIP keeps its counts.
	require.NoError(t, r.m.ctl.Apply(metricsDocument(t, 2, metricsWebBackends[1:])))
	after := traffic(scrape(t, r.m.Collector()))
	require.Equal(t, expected("a"), after)

	// More traffic: a's flows are re-placed on b and c (new flows again);
	// nothing goes back.
	oracle.add(t, r.send(frames))
	final := traffic(scrape(t, r.m.Collector()))
	require.Equal(t, expected("a"), final)
	for k, v := range after {
		require.GreaterOrEqual(t, final[k], v, "%s went back", k)
	}
	require.Greater(t, final[`xdplb_vip_new_flows_total{vip="web4"}`], after[`xdplb_vip_new_flows_total{vip="web4"}`])
}

// TestCollectorFastPath: the fast path's hits and misses are exported,
// summed over the workers' pipelines: after the flows proved themselves
// (flow.DefaultProveAfter), their packets hit.
func TestCollectorFastPath(t *testing.T) {
	r := newMetricsRig(t, 2)
	frames := benchTargets.Frames(benchFlows(200, muxAgreeMix, 11, true))
	r.send(frames)
	time.Sleep(flow.DefaultProveAfter + 50*time.Millisecond) // not timed: the flows may be proven after it
	r.send(frames)                                           // proven
	r.send(frames)                                           // kept
	r.send(frames)                                           // hits
	all := scrape(t, r.m.Collector())
	hit, miss := all[`xdplb_mux_fastpath_packets_total{result="hit"}`], all[`xdplb_mux_fastpath_packets_total{result="miss"}`]
	require.NotZero(t, hit)
	require.LessOrEqual(t, hit+miss, float64(4*len(frames)))
	var h, m uint64
	for _, fp := range r.m.fastPaths {
		a, b := fp.Stats()
		h, m = h+a, m+b
	}
	require.EqualValues(t, h, hit)
	require.EqualValues(t, m, miss)
	require.Contains(t, all, "xdplb_mux_fastpath_naps_total")
}
