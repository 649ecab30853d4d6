package bgp

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metric descriptions of the Collector. Per-peer series carry a "peer"
// label (the neighbour's address).
var (
	descPeerUp = prometheus.NewDesc("xdplb_bgp_peer_up",
		"1 if the BGP session with the peer is established, else 0.", []string{"peer"}, nil)
	descPeerState = prometheus.NewDesc("xdplb_bgp_peer_state",
		"BGP session state of the peer: 1 for the current state, 0 for the others.", []string{"peer", "state"}, nil)
	descPeerUptime = prometheus.NewDesc("xdplb_bgp_peer_uptime_seconds",
		"How long the session with the peer has been established (0 if it is not).", []string{"peer"}, nil)
	descPeerFlaps = prometheus.NewDesc("xdplb_bgp_peer_flaps_total",
		"Times the established session with the peer went down.", []string{"peer"}, nil)
	descPeerAdvertised = prometheus.NewDesc("xdplb_bgp_peer_prefixes_advertised",
		"Prefixes advertised to the peer.", []string{"peer"}, nil)
	descPeerReceived = prometheus.NewDesc("xdplb_bgp_peer_prefixes_received",
		"Prefixes received from the peer.", []string{"peer"}, nil)
	descAnnounced = prometheus.NewDesc("xdplb_bgp_prefixes_announced",
		"Prefixes this node currently originates.", nil, nil)
	descDesired = prometheus.NewDesc("xdplb_bgp_prefixes_desired",
		"Prefixes this node should announce (its healthy VIPs); differs from announced while draining.", nil, nil)
	descDraining = prometheus.NewDesc("xdplb_bgp_draining",
		"1 while the announcer is draining (everything withdrawn, sessions kept).", nil, nil)
	descAnnouncements = prometheus.NewDesc("xdplb_bgp_announcements_total",
		"Prefix announcements made.", nil, nil)
	descWithdrawals = prometheus.NewDesc("xdplb_bgp_withdrawals_total",
		"Prefix withdrawals made.", nil, nil)
)

// Collector returns a Prometheus collector for the Announcer: session
// state, uptime, flaps and prefix counts per peer, and the announced and
// desired prefix counts. Register it once, e.g.
// prometheus.MustRegister(a.Collector()). Each scrape asks GoBGP for the
// peer list (one round trip through its event loop).
//
// GoBGP's own pkg/metrics.NewBgpCollector (message counters and more, under
// the bgp_ prefix) can be registered beside it for the server of a Mux
// that wants GoBGP's full detail; this collector exposes what a load
// balancer's operator alerts on.
func (a *Announcer) Collector() prometheus.Collector { return collector{a} }

type collector struct{ a *Announcer }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descPeerUp, descPeerState, descPeerUptime, descPeerFlaps, descPeerAdvertised, descPeerReceived,
		descAnnounced, descDesired, descDraining, descAnnouncements, descWithdrawals,
	} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, p := range c.a.PeerStates() {
		peer := p.Address.String()
		gauge(descPeerUp, b2f(p.State == StateEstablished), peer)
		for s := StateIdle; s <= StateEstablished; s++ {
			gauge(descPeerState, b2f(p.State == s), peer, s.String())
		}
		gauge(descPeerUptime, p.Uptime.Seconds(), peer)
		counter(descPeerFlaps, float64(p.Flaps), peer)
		gauge(descPeerAdvertised, float64(p.Advertised), peer)
		gauge(descPeerReceived, float64(p.Received), peer)
	}
	a := c.a
	a.mu.Lock()
	announced, desired, draining := len(a.announced), len(a.want), a.draining
	nAnn, nWd := a.nAnnounced, a.nWithdrawn
	a.mu.Unlock()
	gauge(descAnnounced, float64(announced))
	gauge(descDesired, float64(desired))
	gauge(descDraining, b2f(draining))
	counter(descAnnouncements, float64(nAnn))
	counter(descWithdrawals, float64(nWd))
}
