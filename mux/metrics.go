package mux

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/internal/nodemetrics"
)

// Collector returns a Prometheus collector of the Mux's state. Everything
// is read when Prometheus scrapes: the data path's per-worker counters,
// summed (packets and drops by reason; packets, bytes and new flows per VIP
// and per backend, from balance.Account), the connection table, the Maglev
// tables, the health checker, the steering program and the AF_XDP
// sockets. Nothing on the packet path touches a Prometheus API. Register
// the BGP announcer's collector (bgp.Announcer.Collector) beside it.
func (m *Mux) Collector() prometheus.Collector { return muxCollector{m} }

type muxCollector struct{ m *Mux }

var (
	descConns     = prometheus.NewDesc("xdplb_conntable_entries", "Flows in the connection table.", nil, nil)
	descConnCap   = prometheus.NewDesc("xdplb_conntable_capacity", "Slots of the connection table.", nil, nil)
	descConnInUse = prometheus.NewDesc("xdplb_conntable_in_use", "Slots of the part of the connection table in use: it grows with the flows stored, up to xdplb_conntable_capacity.", nil, nil)
	descConnEv    = prometheus.NewDesc("xdplb_conntable_events_total", "Connection table events.", []string{"event"}, nil)
	descConnClass = prometheus.NewDesc("xdplb_conntable_class_entries", "Flows in the connection table by trust: untrusted (new, evictable) or proven (established, closing, udp).", []string{"class"}, nil)
	descVIPConn   = prometheus.NewDesc("xdplb_vip_conntable_total", "New flows of a VIP by what the connection table did: inserted (untrusted), evicted (inserted over another flow's entry), promoted (proven), refused (no room), share_refused (the VIP past its share of untrusted entries; forwarded without an entry). Removed VIPs keep their name.", []string{"vip", "outcome"}, nil)
	descSkew      = prometheus.NewDesc("xdplb_maglev_skew", "Maglev table skew per VIP: the largest backend's slot share over the mean share of active backends.", []string{"vip"}, nil)
	descBackends  = prometheus.NewDesc("xdplb_backend_up", "1 when a backend takes new flows (active, weight > 0, healthy).", []string{"vip", "backend"}, nil)
	descProbes    = prometheus.NewDesc("xdplb_probes_total", "Health probes sent, and failed.", []string{"vip_backend", "result"}, nil)
	descProbeUp   = prometheus.NewDesc("xdplb_probe_state", "Health state per target (0 unknown, 1 up, 2 down).", []string{"vip_backend"}, nil)
	descAnnounced = prometheus.NewDesc("xdplb_vips_announced", "VIP prefixes the Mux asks BGP to announce.", nil, nil)
	descFast      = prometheus.NewDesc("xdplb_mux_fastpath_packets_total", "TCP and UDP packets the workers looked up in their caches of established flows' decisions: hit (encapsulated from the cache) or miss (through the full pipeline). Packets of batches with ICMP, and of workers napping, are not looked up.", []string{"result"}, nil)
	descFastNaps  = prometheus.NewDesc("xdplb_mux_fastpath_naps_total", "Times a worker stopped looking up its cache of flows' decisions for a while because too few packets hit it (too many flows, or too evenly spread).", nil, nil)
	descImages    = prometheus.NewDesc("xdplb_mux_fastpath_images_total", "Packets of the full pipeline that the workers encapsulated from their backend's tunnel image (the headers last written for that backend) instead of running the encap and next-hop stages; they are counted by backend as any other.", nil, nil)
	descUp        = prometheus.NewDesc("xdplb_datapath_up", "1 while the data path forwards; 0 before it starts and once it has failed or stopped (the VIPs are then withdrawn).", nil, nil)

	// Traffic per VIP and per backend, from the workers' Account stages.
	descVIPPackets  = prometheus.NewDesc("xdplb_vip_packets_total", "Packets forwarded to a VIP's backends, those removed by a reload included.", []string{"vip"}, nil)
	descVIPBytes    = prometheus.NewDesc("xdplb_vip_bytes_total", "Bytes of the client IP packets forwarded to a VIP's backends (without Ethernet or VXLAN headers), those removed by a reload included.", []string{"vip"}, nil)
	descVIPFlows    = prometheus.NewDesc("xdplb_vip_new_flows_total", "Flows placed on a VIP's backends (connection-table misses), those removed by a reload included.", []string{"vip"}, nil)
	descBackPackets = prometheus.NewDesc("xdplb_backend_packets_total", "Packets forwarded to a backend.", []string{"vip", "backend"}, nil)
	descBackBytes   = prometheus.NewDesc("xdplb_backend_bytes_total", "Bytes of the client IP packets forwarded to a backend (without Ethernet or VXLAN headers).", []string{"vip", "backend"}, nil)
	descBackFlows   = prometheus.NewDesc("xdplb_backend_new_flows_total", "Flows placed on a backend (connection-table misses).", []string{"vip", "backend"}, nil)

	// Returning traffic of outbound connections (balance.Returns).
	descReturnPackets = prometheus.NewDesc("xdplb_vip_return_packets_total", "Packets returning to a VIP address's source-NATed outbound connections, sent to the hosts of the ports' owners.", []string{"address"}, nil)
	descReturnBytes   = prometheus.NewDesc("xdplb_vip_return_bytes_total", "Bytes of the IP packets returning to a VIP address's outbound connections (without Ethernet or VXLAN headers).", []string{"address"}, nil)
	descAllocations   = prometheus.NewDesc("xdplb_outbound_allocations", "Outbound port allocations in the range table (static and dynamic).", nil, nil)
	descAllocRefused  = prometheus.NewDesc("xdplb_outbound_allocations_refused_total", "Dynamic outbound allocations refused (no outbound section, outside the pool, an inbound port, overlapping).", nil, nil)
)

func (c muxCollector) Describe(ch chan<- *prometheus.Desc) {
	nodemetrics.Describe(ch)
	for _, d := range []*prometheus.Desc{descConns, descConnCap, descConnInUse, descConnEv, descConnClass, descVIPConn, descSkew, descBackends, descProbes,
		descProbeUp, descAnnounced, descFast, descFastNaps, descImages, descUp, descVIPPackets, descVIPBytes, descVIPFlows, descBackPackets, descBackBytes, descBackFlows,
		descReturnPackets, descReturnBytes, descAllocations, descAllocRefused} {
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

	nodemetrics.Engine(ch, m.Stats())
	up := 0.0
	if m.Forwarding() {
		up = 1
	}
	gauge(descUp, up)
	nodemetrics.PartialChecksums(ch, m.cfg.Interface, m.partial)

	if conns := m.Conns(); conns != nil { // built with the data path
		cs := conns.Stats()
		gauge(descConns, float64(cs.Entries))
		gauge(descConnCap, float64(conns.Cap()))
		gauge(descConnInUse, float64(conns.InUse()))
		counter(descConnEv, cs.Inserts, "insert")
		counter(descConnEv, cs.Updates, "update")
		counter(descConnEv, cs.Evictions, "eviction")
		counter(descConnEv, cs.Refused, "refused")
		counter(descConnEv, cs.Expired, "expired")
		counter(descConnEv, cs.Busy, "busy")
		counter(descConnEv, cs.PromoteRefused, "promote_refused")
		counter(descConnEv, cs.Moves, "move")
		gauge(descConnClass, float64(max(cs.Entries-cs.Proven, 0)), "untrusted")
		gauge(descConnClass, float64(cs.Proven), "proven")
	}
	m.mu.Lock()
	bals := m.balancers
	m.mu.Unlock()
	for name, v := range balance.SumVIPStats(bals...) {
		counter(descVIPConn, v.Inserted, name, "inserted")
		counter(descVIPConn, v.Evicted, name, "evicted")
		counter(descVIPConn, v.Promoted, name, "promoted")
		counter(descVIPConn, v.Refused, name, "refused")
		counter(descVIPConn, v.ShareRefused, name, "share_refused")
	}

	m.mu.Lock()
	fps := m.fastPaths
	m.mu.Unlock()
	var fs fastStats
	for _, fp := range fps {
		s := fp.stats()
		fs.hits += s.hits
		fs.misses += s.misses
		fs.naps += s.naps
		fs.images += s.images
	}
	counter(descFast, fs.hits, "hit")
	counter(descFast, fs.misses, "miss")
	counter(descFastNaps, fs.naps)
	counter(descImages, fs.images)

	nodemetrics.Config(ch, m.watcher.Status())

	// Traffic is labelled with the running snapshot's names: a VIP's
	// totals include the backends a reload removed (their counters stay
	// in the workers' Accounts; backend IDs are stable and not reused), so
	// they never decrease; a removed backend's own series go away.
	m.mu.Lock()
	accts := m.accounts
	m.mu.Unlock()
	traffic := balance.SumAccounts(accts...)
	for _, r := range m.rules.Load().Rules() {
		vc := traffic.VIP(r.VIP)
		counter(descVIPPackets, vc.Packets, r.Name)
		counter(descVIPBytes, vc.Bytes, r.Name)
		counter(descVIPFlows, vc.NewFlows, r.Name)
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
			bc := traffic.Backend(b.ID)
			counter(descBackPackets, bc.Packets, r.Name, b.Name)
			counter(descBackBytes, bc.Bytes, r.Name, b.Name)
			counter(descBackFlows, bc.NewFlows, r.Name, b.Name)
		}
	}

	for a, i := range m.ctl.outboundIndexes() {
		rc := traffic.Returns(i)
		counter(descReturnPackets, rc.Packets, a.String())
		counter(descReturnBytes, rc.Bytes, a.String())
	}
	gauge(descAllocations, float64(m.ctl.Snapshot().(*muxSnapshot).Returns().Len()))
	counter(descAllocRefused, m.ctl.refused.Load())

	for key, hs := range m.checker.Snapshot() {
		counter(descProbes, hs.Probes-hs.Failures, key, "ok")
		counter(descProbes, hs.Failures, key, "failed")
		gauge(descProbeUp, probeState(hs.State), key)
	}

	m.mu.Lock()
	dp := m.dp
	m.mu.Unlock()
	nodemetrics.DataPath(ch, dp)
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
