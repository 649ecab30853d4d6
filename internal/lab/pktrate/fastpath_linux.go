//go:build linux

package pktrate

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// A FastPathReader is an Instance that can read its fast path's counters
// (the Mux's). The harness reads them at the start and the end of every
// measurement window and puts the difference in Sample.FastPath.
type FastPathReader interface {
	Instance
	// FastPath returns the counters since the instance started.
	FastPath() (FastPathCounts, error)
}

// MuxMetricsAddr is where the Mux mode has its program serve /metrics
// (-metrics), inside the DUT namespace, whose loopback nothing else uses.
const MuxMetricsAddr = "127.0.0.1:9109"

// muxInstance is a started Mux: its counters are read from its /metrics
// endpoint, from inside the DUT namespace.
type muxInstance struct {
	Instance
	ns     *netlab.NS
	addr   string
	client *http.Client
}

func newMuxInstance(inst Instance, ns *netlab.NS, addr string) *muxInstance {
	return &muxInstance{Instance: inst, ns: ns, addr: addr, client: &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
				return ns.Dial(ctx, network, address)
			},
			DisableKeepAlives: true,
		},
	}}
}

// FastPath scrapes the Mux's /metrics and returns its fast-path counters.
func (m *muxInstance) FastPath() (FastPathCounts, error) {
	resp, err := m.client.Get("http://" + m.addr + "/metrics")
	if err != nil {
		return FastPathCounts{}, fmt.Errorf("pktrate: the Mux's metrics in %s: %w", m.ns, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return FastPathCounts{}, fmt.Errorf("pktrate: the Mux's metrics in %s: %s", m.ns, resp.Status)
	}
	c, err := ParseFastPathCounts(resp.Body)
	if err != nil {
		return FastPathCounts{}, fmt.Errorf("pktrate: the Mux's metrics in %s: %w", m.ns, err)
	}
	return c, nil
}
