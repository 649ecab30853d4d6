package nodemetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/nat"
)

var (
	descOutPackets = prometheus.NewDesc("xdplb_outbound_packets_total", "Packets of VMs' outbound connections (source NAT through a VIP), by outcome: out and in translated (pings included), icmp (echo messages and ICMP errors about outbound connections translated), local and passed sent on untranslated, exhausted, no_state and refused dropped.", []string{"outcome"}, nil)
	descOutConns   = prometheus.NewDesc("xdplb_outbound_connections_total", "Outbound connections, by event: created, reused (given a port another remote endpoint's connection holds), closed (FIN or RST), expired (their port free again).", []string{"event"}, nil)
	descOutEntries = prometheus.NewDesc("xdplb_outbound_table_entries", "Outbound connections held by the source NAT (idle ones included until aged out).", nil, nil)
	descOutSweeps  = prometheus.NewDesc("xdplb_outbound_sweeps_total", "Sweeps of the fleet's port guards this Host Agent's allocator made as the fleet's elected sweeper.", nil, nil)
	descOutSweeper = prometheus.NewDesc("xdplb_outbound_sweeper", "1 while this Host Agent's allocator is the fleet's elected sweeper of port guards (one Host Agent of the fleet), else 0.", nil, nil)
	descOutRanges  = prometheus.NewDesc("xdplb_outbound_ranges_total", "Outbound port ranges by the allocator's event: claimed, reclaimed (taken back after a restart), returned (idle), conflict (another writer won), exhausted (no free range in the pool), cooling (a dead holder's guard started), swept (of those cooling, a guard a sweep found: left in a pool no claim needed a range of).", []string{"event"}, nil)
)

// DescribeOutbound sends the source NAT's descriptors (Outbound).
func DescribeOutbound(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOutPackets, descOutConns, descOutEntries} {
		ch <- d
	}
}

// Outbound sends the source NAT's counters: xdplb_outbound_packets_total,
// xdplb_outbound_connections_total and xdplb_outbound_table_entries.
func Outbound(ch chan<- prometheus.Metric, s nat.SNATStats) {
	Counter(ch, descOutPackets, s.Out, "out")
	Counter(ch, descOutPackets, s.In, "in")
	Counter(ch, descOutPackets, s.Local, "local")
	Counter(ch, descOutPackets, s.Passed, "passed")
	Counter(ch, descOutPackets, s.Exhausted, "exhausted")
	Counter(ch, descOutPackets, s.NoState, "no_state")
	Counter(ch, descOutPackets, s.Refused, "refused")
	Counter(ch, descOutPackets, s.ICMP, "icmp")
	Counter(ch, descOutConns, s.Created, "created")
	Counter(ch, descOutConns, s.Reused, "reused")
	Counter(ch, descOutConns, s.Closed, "closed")
	Counter(ch, descOutConns, s.Expired, "expired")
	Gauge(ch, descOutEntries, float64(s.Entries))
}

// OutboundRanges returns a collector of a Host Agent's port allocator's
// counters (xdplb_outbound_ranges_total, xdplb_outbound_sweeps_total and
// xdplb_outbound_sweeper), read from counters at scrape time; it sends
// nothing while counters reports no allocator.
func OutboundRanges(counters func() (fleet.PortAllocatorCounters, bool)) prometheus.Collector {
	return rangesCollector(counters)
}

type rangesCollector func() (fleet.PortAllocatorCounters, bool)

func (c rangesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descOutRanges
	ch <- descOutSweeps
	ch <- descOutSweeper
}

func (c rangesCollector) Collect(ch chan<- prometheus.Metric) {
	s, ok := c()
	if !ok {
		return
	}
	Counter(ch, descOutRanges, s.Claims, "claimed")
	Counter(ch, descOutRanges, s.Reclaims, "reclaimed")
	Counter(ch, descOutRanges, s.Returns, "returned")
	Counter(ch, descOutRanges, s.Conflicts, "conflict")
	Counter(ch, descOutRanges, s.Exhausted, "exhausted")
	Counter(ch, descOutRanges, s.Cooling, "cooling")
	Counter(ch, descOutRanges, s.Swept, "swept")
	Counter(ch, descOutSweeps, s.Sweeps)
	sweeper := 0.0
	if s.Sweeper {
		sweeper = 1
	}
	Gauge(ch, descOutSweeper, sweeper)
}
