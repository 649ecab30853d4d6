package hostagent

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xdplb/xdplb/engine"
)

// Collector returns a Prometheus collector of the agent's state. Everything
// is read when Prometheus scrapes: the data path's per-worker counters
// (summed, and kept across data path rebuilds), the NAT stages' counters
// and table, the document's version, the steering programs and the AF_XDP
// sockets. Nothing on the packet path touches a Prometheus API. The metric
// names are the Mux's where the meaning is the same.
func (a *Agent) Collector() prometheus.Collector { return agentCollector{a} }

type agentCollector struct{ a *Agent }

var (
	descPackets  = prometheus.NewDesc("xdplb_packets_total", "Packets received (rx) and transmitted (tx) by the data path.", []string{"direction"}, nil)
	descDrops    = prometheus.NewDesc("xdplb_drops_total", "Packets dropped by the data path, by reason.", []string{"reason"}, nil)
	descNAT      = prometheus.NewDesc("xdplb_nat_packets_total", "Packets the NAT stages translated or refused, by outcome.", []string{"outcome"}, nil)
	descNATFlows = prometheus.NewDesc("xdplb_nat_table_entries", "Connections in the NAT table.", nil, nil)
	descNATCap   = prometheus.NewDesc("xdplb_nat_table_capacity", "Slots of the NAT table.", nil, nil)
	descNATEv    = prometheus.NewDesc("xdplb_nat_table_events_total", "NAT table events.", []string{"event"}, nil)
	descVersion  = prometheus.NewDesc("xdplb_config_version", "Version of the running desired-state document.", nil, nil)
	descSync     = prometheus.NewDesc("xdplb_config_sync_delay_seconds", "Time from the running document's 'written' stamp to its application.", nil, nil)
	descRejected = prometheus.NewDesc("xdplb_config_rejected_total", "Documents refused (invalid, stale, or failed to apply).", nil, nil)
	descUp       = prometheus.NewDesc("xdplb_datapath_up", "1 while the data path forwards.", nil, nil)
	descBuilds   = prometheus.NewDesc("xdplb_datapath_builds_total", "Data path builds (the first, and one per structural document change).", nil, nil)
	descDIPs     = prometheus.NewDesc("xdplb_local_dips", "DIPs (VM addresses) hosted here, per VM port.", []string{"interface"}, nil)
	descSteer    = prometheus.NewDesc("xdplb_steer_packets_total", "Packets seen by the XDP steering program of an interface, by outcome.", []string{"interface", "outcome"}, nil)
	descXSK      = prometheus.NewDesc("xdplb_xsk_kernel_total", "AF_XDP socket statistics from the kernel, per interface and queue.", []string{"interface", "queue", "counter"}, nil)
	descXSKTX    = prometheus.NewDesc("xdplb_xsk_tx_frames_total", "Frames transmitted per AF_XDP socket (copied: from another interface's socket).", []string{"interface", "queue", "kind"}, nil)
)

func (c agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPackets, descDrops, descNAT, descNATFlows, descNATCap, descNATEv,
		descVersion, descSync, descRejected, descUp, descBuilds, descDIPs, descSteer, descXSK, descXSKTX} {
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

	s := a.Stats()
	counter(descPackets, s.RX, "rx")
	counter(descPackets, s.TX, "tx")
	names := engine.DropReasons()
	for i, v := range s.Drops {
		if i > 0 && i < len(names) {
			counter(descDrops, v, names[i])
		}
	}

	ns := a.NATStats()
	counter(descNAT, ns.Inbound, "inbound")
	counter(descNAT, ns.Return, "return")
	counter(descNAT, ns.Stateless, "return_stateless")
	counter(descNAT, ns.Ambiguous, "ambiguous")
	counter(descNAT, ns.Stale, "stale")
	counter(descNAT, ns.Fragments, "fragment")
	counter(descNAT, ns.ICMPErrors, "icmp_error")
	cs := a.table.Conns().Stats()
	gauge(descNATFlows, float64(cs.Entries))
	gauge(descNATCap, float64(a.table.Conns().Cap()))
	counter(descNATEv, ns.NewFlows, "new")
	counter(descNATEv, ns.TableRefused, "refused")
	counter(descNATEv, cs.Expired, "expired")
	counter(descNATEv, cs.Evictions, "eviction")

	st := a.watcher.Status()
	gauge(descVersion, float64(st.Version))
	if d := st.SyncDelay(); d > 0 {
		gauge(descSync, d.Seconds())
	}
	counter(descRejected, st.Rejected)

	a.mu.Lock()
	defer a.mu.Unlock()
	counter(descBuilds, a.builds)
	if a.plan != nil {
		per := map[string]int{}
		for _, e := range a.plan.Endpoints {
			for _, vp := range a.plan.Ports {
				if vp.Index == e.OutPort {
					per[vp.Interface]++
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
	for _, f := range append([]*iface{dp.uplink}, dp.vms...) {
		if ss, err := f.prog.Stats(); err == nil {
			counter(descSteer, ss.Redirected, f.name, "redirected")
			counter(descSteer, ss.NoSocket, f.name, "no_socket")
			counter(descSteer, ss.NoMatch, f.name, "passed")
			counter(descSteer, ss.Infra, f.name, "infra")
			counter(descSteer, ss.NotIP, f.name, "not_ip")
			counter(descSteer, ss.Malformed, f.name, "malformed")
		}
		for q, p := range f.sockets {
			ps, err := p.Stats()
			if err != nil {
				continue
			}
			qs := strconv.Itoa(q)
			k := ps.Kernel
			counter(descXSK, k.RXDropped, f.name, qs, "rx_dropped")
			counter(descXSK, k.RXRingFull, f.name, qs, "rx_ring_full")
			counter(descXSK, k.RXFillRingEmptyDescs, f.name, qs, "fill_ring_empty")
			counter(descXSK, k.TXInvalidDescs, f.name, qs, "tx_invalid")
			counter(descXSKTX, ps.TXFrames-ps.TXCopied, f.name, qs, "own")
			counter(descXSKTX, ps.TXCopied, f.name, qs, "copied")
		}
	}
}
