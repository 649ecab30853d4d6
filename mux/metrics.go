package mux

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// Collector returns a Prometheus collector of the Mux's state. Everything
// is read when Prometheus scrapes: the data path's per-worker counters
// (summed), the connection table, the Maglev tables, the health checker,
// the steering program and the AF_XDP sockets. Nothing on the packet path
// touches a Prometheus API. Register the BGP announcer's collector
// (bgp.Announcer.Collector) beside it.
func (m *Mux) Collector() prometheus.Collector { return muxCollector{m} }

type muxCollector struct{ m *Mux }

var (
	descPackets   = prometheus.NewDesc("xdplb_packets_total", "Packets received (rx) and transmitted (tx) by the data path.", []string{"direction"}, nil)
	descDrops     = prometheus.NewDesc("xdplb_drops_total", "Packets dropped by the data path, by reason.", []string{"reason"}, nil)
	descConns     = prometheus.NewDesc("xdplb_conntable_entries", "Flows in the connection table.", nil, nil)
	descConnCap   = prometheus.NewDesc("xdplb_conntable_capacity", "Slots of the connection table.", nil, nil)
	descConnEv    = prometheus.NewDesc("xdplb_conntable_events_total", "Connection table events.", []string{"event"}, nil)
	descVersion   = prometheus.NewDesc("xdplb_config_version", "Version of the running desired-state document.", nil, nil)
	descSync      = prometheus.NewDesc("xdplb_config_sync_delay_seconds", "Time from the running document's 'written' stamp to its application.", nil, nil)
	descRejected  = prometheus.NewDesc("xdplb_config_rejected_total", "Documents refused (invalid, stale, or failed to apply).", nil, nil)
	descSkew      = prometheus.NewDesc("xdplb_maglev_skew", "Maglev table skew per VIP: the largest backend's slot share over the mean share of active backends.", []string{"vip"}, nil)
	descBackends  = prometheus.NewDesc("xdplb_backend_up", "1 when a backend takes new flows (active, weight > 0, healthy).", []string{"vip", "backend"}, nil)
	descProbes    = prometheus.NewDesc("xdplb_probes_total", "Health probes sent, and failed.", []string{"vip_backend", "result"}, nil)
	descProbeUp   = prometheus.NewDesc("xdplb_probe_state", "Health state per target (0 unknown, 1 up, 2 down).", []string{"vip_backend"}, nil)
	descSteer     = prometheus.NewDesc("xdplb_steer_packets_total", "Packets seen by the XDP steering program, by outcome.", []string{"outcome"}, nil)
	descXSK       = prometheus.NewDesc("xdplb_xsk_kernel_total", "AF_XDP socket statistics from the kernel, per queue.", []string{"queue", "counter"}, nil)
	descAnnounced = prometheus.NewDesc("xdplb_vips_announced", "VIP prefixes the Mux asks BGP to announce.", nil, nil)
)

func (c muxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPackets, descDrops, descConns, descConnCap, descConnEv, descVersion,
		descSync, descRejected, descSkew, descBackends, descProbes, descProbeUp, descSteer, descXSK, descAnnounced} {
		ch <- d
	}
}

func (c muxCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}

	s := m.Stats()
	counter(descPackets, s.RX, "rx")
	counter(descPackets, s.TX, "tx")
	names := engine.DropReasons()
	for i, v := range s.Drops {
		if i > 0 && i < len(names) {
			counter(descDrops, v, names[i])
		}
	}

	cs := m.conns.Stats()
	gauge(descConns, float64(cs.Entries))
	gauge(descConnCap, float64(m.conns.Cap()))
	counter(descConnEv, cs.Inserts, "insert")
	counter(descConnEv, cs.Updates, "update")
	counter(descConnEv, cs.Evictions, "eviction")
	counter(descConnEv, cs.Refused, "refused")
	counter(descConnEv, cs.Expired, "expired")
	counter(descConnEv, cs.Busy, "busy")

	st := m.watcher.Status()
	gauge(descVersion, float64(st.Version))
	if d := st.SyncDelay(); d > 0 {
		gauge(descSync, d.Seconds())
	}
	counter(descRejected, st.Rejected)

	for _, r := range m.rules.Load().Rules() {
		if mg := r.Maglev(); mg != nil {
			active, max := 0, 0
			for i := range r.Backends {
				if n := mg.Slots(i); n > 0 {
					active++
					if n > max {
						max = n
					}
				}
			}
			if active > 0 {
				mean := float64(mg.Size()) / float64(active)
				gauge(descSkew, float64(max)/mean, r.Name)
			}
		}
		for i := range r.Backends {
			b := &r.Backends[i]
			up := 0.0
			if b.State == flow.BackendActive && b.Weight > 0 {
				up = 1
			}
			gauge(descBackends, up, r.Name, b.Name)
		}
	}

	for key, hs := range m.checker.Snapshot() {
		counter(descProbes, hs.Probes-hs.Failures, key, "ok")
		counter(descProbes, hs.Failures, key, "failed")
		gauge(descProbeUp, probeState(hs.State), key)
	}

	m.mu.Lock()
	prog, ports := m.prog, m.ports
	m.mu.Unlock()
	if prog != nil {
		if ss, err := prog.Stats(); err == nil {
			counter(descSteer, ss.Redirected, "redirected")
			counter(descSteer, ss.NoSocket, "no_socket")
			counter(descSteer, ss.NoMatch, "passed")
			counter(descSteer, ss.NotIP, "not_ip")
			counter(descSteer, ss.Malformed, "malformed")
		}
	}
	for _, p := range ports {
		ps, err := p.Stats()
		if err != nil {
			continue
		}
		q := strconv.Itoa(p.Queue())
		k := ps.Kernel
		counter(descXSK, k.RXDropped, q, "rx_dropped")
		counter(descXSK, k.RXRingFull, q, "rx_ring_full")
		counter(descXSK, k.RXFillRingEmptyDescs, q, "fill_ring_empty")
		counter(descXSK, k.TXInvalidDescs, q, "tx_invalid")
	}
	gauge(descAnnounced, float64(len(m.ctl.Announced())))
}

func probeState(s health.State) float64 {
	switch s {
	case health.Up:
		return 1
	case health.Down:
		return 2
	}
	return 0
}
