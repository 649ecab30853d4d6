// Package nodemetrics holds the Prometheus metrics that the Mux and the
// Host Agent share — data-path counters, the running document, the
// steering programs and the AF_XDP sockets — so both nodes export them
// under the same names and labels. Everything is read at scrape time;
// nothing here is on the packet path.
package nodemetrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/datapath"
	"github.com/xdplb/xdplb/engine/rawip"
	"github.com/xdplb/xdplb/engine/steer"
)

var (
	descPackets  = prometheus.NewDesc("xdplb_packets_total", "Packets received (rx) and transmitted (tx) by the data path.", []string{"direction"}, nil)
	descDrops    = prometheus.NewDesc("xdplb_drops_total", "Packets dropped by the data path, by reason.", []string{"reason"}, nil)
	descVersion  = prometheus.NewDesc("xdplb_config_version", "Version of the running desired-state document.", nil, nil)
	descSync     = prometheus.NewDesc("xdplb_config_sync_delay_seconds", "Time from the running document's commit to the fleet's store (etcd), or else its 'written' stamp, to its application here.", nil, nil)
	descRevision = prometheus.NewDesc("xdplb_config_revision", "The etcd revision of the running document (only with a fleet store).", nil, nil)
	descRejected = prometheus.NewDesc("xdplb_config_rejected_total", "Documents refused (invalid, stale, or failed to apply).", nil, nil)
	descError    = prometheus.NewDesc("xdplb_config_error", "1 while the document file is not applied, by reason (unreadable, invalid, stale, conflict: same version, different content, apply); 0 for the other reasons.", []string{"reason"}, nil)
	descSteer    = prometheus.NewDesc("xdplb_steer_packets_total", "Packets seen by the XDP steering program of an interface, by outcome.", []string{"interface", "outcome"}, nil)
	descXSK      = prometheus.NewDesc("xdplb_xsk_kernel_total", "AF_XDP socket statistics from the kernel, per interface and queue.", []string{"interface", "queue", "counter"}, nil)
	descXSKTX    = prometheus.NewDesc("xdplb_xsk_tx_frames_total", "Frames transmitted per AF_XDP socket (copied: from another interface's socket).", []string{"interface", "queue", "kind"}, nil)
	descSlow     = prometheus.NewDesc("xdplb_slowpath_packets_total", "Packets the data path handed to the kernel to route (next hop not resolved yet), by result.", []string{"result"}, nil)
	descPartial  = prometheus.NewDesc("xdplb_partial_checksums_total", "Frames whose partial TCP/UDP checksum (left by a sender on this machine with checksum offload) the data path completed, by input interface.", []string{"interface"}, nil)
)

// Describe sends the shared descriptors.
func Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPackets, descDrops, descVersion, descSync, descRevision, descRejected, descError, descSteer, descXSK, descXSKTX, descSlow, descPartial} {
		ch <- d
	}
}

// Counter sends a counter sample.
func Counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

// Gauge sends a gauge sample.
func Gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

// PartialChecksums sends the count of frames stage s completed on the input
// interface ifname (engine.PartialChecksums).
func PartialChecksums(ch chan<- prometheus.Metric, ifname string, s *engine.PartialChecksums) {
	Counter(ch, descPartial, s.Completed(), ifname)
}

// Engine sends the data path's packet and drop counters.
func Engine(ch chan<- prometheus.Metric, s engine.Stats) {
	Counter(ch, descPackets, s.RX, "rx")
	Counter(ch, descPackets, s.TX, "tx")
	names := engine.DropReasons()
	for i, v := range s.Drops {
		if i > 0 && i < len(names) {
			Counter(ch, descDrops, v, names[i])
		}
	}
}

// Config sends the running document's version, sync delay and refusals,
// and why the file is not applied now, if it is not.
func Config(ch chan<- prometheus.Metric, st control.Status) {
	Gauge(ch, descVersion, float64(st.Version))
	if d := st.SyncDelay(); d > 0 {
		Gauge(ch, descSync, d.Seconds())
	}
	if st.Revision > 0 {
		Gauge(ch, descRevision, float64(st.Revision))
	}
	Counter(ch, descRejected, st.Rejected)
	for _, r := range control.Reasons {
		v := 0.0
		if st.LastError != nil && st.Reason == r {
			v = 1
		}
		Gauge(ch, descError, v, r)
	}
}

// Steer sends the steering program's outcomes on interface ifname.
func Steer(ch chan<- prometheus.Metric, ifname string, prog *steer.Program) {
	ss, err := prog.Stats()
	if err != nil {
		return
	}
	steerStats(ch, ifname, ss)
}

// steerStats sends ss, one outcome per way the program ends for a packet
// (the Matched counts say which rule steered it, not an outcome).
func steerStats(ch chan<- prometheus.Metric, ifname string, ss steer.Stats) {
	Counter(ch, descSteer, ss.Redirected, ifname, "redirected")
	Counter(ch, descSteer, ss.NoSocket, ifname, "no_socket")
	Counter(ch, descSteer, ss.NoSocketDropped, ifname, "no_socket_dropped")
	Counter(ch, descSteer, ss.NoMatch, ifname, "passed")
	Counter(ch, descSteer, ss.Infra, ifname, "infra")
	Counter(ch, descSteer, ss.ND, ifname, "nd")
	Counter(ch, descSteer, ss.NotIP, ifname, "not_ip")
	Counter(ch, descSteer, ss.Malformed, ifname, "malformed")
}

// XSK sends an AF_XDP socket's kernel statistics and transmit counts.
func XSK(ch chan<- prometheus.Metric, ifname string, p *afxdp.Port) {
	ps, err := p.Stats()
	if err != nil {
		return
	}
	q := strconv.Itoa(p.Queue())
	k := ps.Kernel
	Counter(ch, descXSK, k.RXDropped, ifname, q, "rx_dropped")
	Counter(ch, descXSK, k.RXRingFull, ifname, q, "rx_ring_full")
	Counter(ch, descXSK, k.RXFillRingEmptyDescs, ifname, q, "fill_ring_empty")
	Counter(ch, descXSK, k.TXInvalidDescs, ifname, q, "tx_invalid")
	Counter(ch, descXSKTX, ps.TXFrames-ps.TXCopied, ifname, q, "own")
	Counter(ch, descXSKTX, ps.TXCopied, ifname, q, "copied")
}

// SlowPath sends the counters of the slow-path port (engine/rawip).
func SlowPath(ch chan<- prometheus.Metric, p *rawip.Port) {
	st := p.Stats()
	Counter(ch, descSlow, st.Sent, "sent")
	Counter(ch, descSlow, st.Errors, "error")
	Counter(ch, descSlow, st.Malformed, "malformed")
}

// DataPath sends what an open data path's interfaces and slow path count:
// each interface's steering program (Steer) and sockets (XSK), and the
// slow-path port (SlowPath) when it has one. dp may be nil (not open).
func DataPath(ch chan<- prometheus.Metric, dp *datapath.DataPath) {
	if dp == nil {
		return
	}
	for _, l := range dp.Links() {
		if l.Program != nil {
			Steer(ch, l.Name, l.Program)
		}
		for _, p := range l.Sockets {
			if p != nil {
				XSK(ch, l.Name, p)
			}
		}
	}
	if slow := dp.SlowPath(); slow != nil {
		SlowPath(ch, slow)
	}
}
