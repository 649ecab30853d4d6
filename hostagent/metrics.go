package hostagent

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xdplb/xdplb/internal/nodemetrics"
)

// Collector returns a Prometheus collector of the agent's state. Everything
// is read when Prometheus scrapes: the data path's per-worker counters
// (summed, and kept across data path rebuilds), the NAT stages' counters
// and table, the source NAT's (xdplb_outbound_*), the document's version, the steering programs and the AF_XDP
// sockets. Nothing on the packet path touches a Prometheus API. The metric
// names are the Mux's where the meaning is the same.
func (a *Agent) Collector() prometheus.Collector { return agentCollector{a} }

type agentCollector struct{ a *Agent }

var (
	descNAT      = prometheus.NewDesc("xdplb_nat_packets_total", "Packets the NAT stages translated or refused, by outcome.", []string{"outcome"}, nil)
	descNATFlows = prometheus.NewDesc("xdplb_nat_table_entries", "Connections in the NAT table.", nil, nil)
	descNATCap   = prometheus.NewDesc("xdplb_nat_table_capacity", "Slots of the NAT table.", nil, nil)
	descNATEv    = prometheus.NewDesc("xdplb_nat_table_events_total", "NAT table events.", []string{"event"}, nil)
	descNATClass = prometheus.NewDesc("xdplb_nat_table_class_entries", "Connections in the NAT table by trust: untrusted (new, evictable) or proven.", []string{"class"}, nil)
	descUp       = prometheus.NewDesc("xdplb_datapath_up", "1 while the data path forwards.", nil, nil)
	descBuilds   = prometheus.NewDesc("xdplb_datapath_builds_total", "Data path builds (the first, and one per structural document change).", nil, nil)
	descFailed   = prometheus.NewDesc("xdplb_datapath_build_failures_total", "Data path builds that failed (a foreign XDP program on a new VM port, say): the running data path kept forwarding and the version was refused.", nil, nil)
	descDIPs     = prometheus.NewDesc("xdplb_local_dips", "DIPs (VM addresses) hosted here, per VM port.", []string{"interface"}, nil)
	descDIPUp    = prometheus.NewDesc("xdplb_dip_health", "1 while a DIP this host probes is up, 0 while it is down or not probed yet (Config.OnDIPHealth).", []string{"vni", "dip", "port"}, nil)
)

func (c agentCollector) Describe(ch chan<- *prometheus.Desc) {
	nodemetrics.Describe(ch)
	nodemetrics.DescribeOutbound(ch)
	for _, d := range []*prometheus.Desc{descNAT, descNATFlows, descNATCap, descNATEv, descNATClass, descUp, descBuilds, descFailed, descDIPs, descDIPUp} {
		ch <- d
	}
}

func (c agentCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}

	nodemetrics.Engine(ch, a.Stats())
	a.partialMu.Lock()
	for ifname, s := range a.partial {
		nodemetrics.PartialChecksums(ch, ifname, s)
	}
	a.partialMu.Unlock()

	ns := a.NATStats()
	counter(descNAT, ns.Inbound, "inbound")
	counter(descNAT, ns.Return, "return")
	counter(descNAT, ns.Stateless, "return_stateless")
	counter(descNAT, ns.Ambiguous, "ambiguous")
	counter(descNAT, ns.Stale, "stale")
	counter(descNAT, ns.Fragments, "fragment")
	counter(descNAT, ns.ICMPErrors, "icmp_error")
	counter(descNAT, ns.Direct, "direct")
	cs := a.table.Conns().Stats()
	gauge(descNATFlows, float64(cs.Entries))
	gauge(descNATCap, float64(a.table.Conns().Cap()))
	counter(descNATEv, ns.NewFlows, "new")
	counter(descNATEv, ns.Promoted, "promoted")
	counter(descNATEv, cs.PromoteRefused, "promote_refused")
	counter(descNATEv, cs.Moves, "move")
	gauge(descNATClass, float64(max(cs.Entries-cs.Proven, 0)), "untrusted")
	gauge(descNATClass, float64(cs.Proven), "proven")
	counter(descNATEv, ns.DirectFlows, "direct")
	counter(descNATEv, ns.TableRefused, "refused")
	counter(descNATEv, cs.Expired, "expired")
	counter(descNATEv, cs.Evictions, "eviction")

	nodemetrics.Outbound(ch, a.snat.Stats())

	nodemetrics.Config(ch, a.watcher.Status())
	for _, v := range a.DIPHealth() {
		up := 0.0
		if v.Up {
			up = 1
		}
		gauge(descDIPUp, up, strconv.FormatUint(uint64(v.VNI), 10), v.Addr.String(), strconv.Itoa(int(v.Port)))
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	counter(descBuilds, a.builds)
	counter(descFailed, a.failed)
	if a.plan != nil {
		per := map[string]int{}
		for _, e := range a.plan.Endpoints {
			for _, vp := range a.plan.Ports {
				if vp.Index == e.OutPort {
					per[vp.Interface] += len(e.Addrs)
				}
			}
		}
		for _, vp := range a.plan.Ports {
			gauge(descDIPs, float64(per[vp.Interface]), vp.Interface)
		}
	}
	dp := a.dp
	if dp == nil {
		gauge(descUp, 0)
		return
	}
	gauge(descUp, 1)
	nodemetrics.DataPath(ch, dp.live)
}
