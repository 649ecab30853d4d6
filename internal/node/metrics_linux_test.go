package node

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// TestMetricsServerClosesIdleConnections: a scraper that keeps its
// keep-alive connection open and idle does not hold it for ever — the
// server closes it after MetricsIdleTimeout (shortened to 300 ms here),
// as ss in the namespace shows. The client side never closes idle
// connections itself. The wait is a hang guard (10 s).
func TestMetricsServerClosesIdleConnections(t *testing.T) {
	lab := netlab.New(t, "nodem")
	ns, err := lab.Namespace("m")
	require.NoError(t, err)
	require.NoError(t, ns.AddAddr("lo", "198.18.7.1/32"))
	old := MetricsIdleTimeout
	MetricsIdleTimeout = 300 * time.Millisecond
	t.Cleanup(func() { MetricsIdleTimeout = old })

	const addr = "198.18.7.1:9100"
	var closeFn func()
	require.NoError(t, ns.Do(func() error {
		closeFn = ServeMetrics(slog.Default(), "test", addr, prometheus.NewCounter(prometheus.CounterOpts{Name: "xdplb_test_total"}))
		return nil
	}))
	defer closeFn()

	tr := &http.Transport{DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		return ns.Dial(ctx, network, a)
	}} // IdleConnTimeout 0: the client keeps idle connections
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(body), "xdplb_test_total")

	established := func() []string {
		out, err := ns.Command(context.Background(), "ss", "-Htn", "state", "established", "sport = :9100").CombinedOutput()
		require.NoError(t, err, "%s", out)
		var conns []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" {
				conns = append(conns, l)
			}
		}
		return conns
	}
	first := established()
	require.Len(t, first, 1, "the scrape's keep-alive connection is open: %v", first)
	t.Logf("after the scrape, ss: %v", first)
	deadline := time.Now().Add(10 * time.Second)
	for len(established()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the server still holds the idle connection after 10s: %v", established())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestParseCaps reads the capability lines of /proc/PID/status.
func TestParseCaps(t *testing.T) {
	caps, err := ParseCaps([]byte("Name:\tmux\nCapInh:\t0000000000000000\nCapPrm:\t0000008000003000\nCapEff:\t0000008000003000\nCapBnd:\t0000008000003000\nCapAmb:\t0000000000000000\n"))
	require.NoError(t, err)
	require.Equal(t, uint64(1)<<CapNetAdmin|1<<CapNetRaw|1<<CapBPF, caps["CapEff"])
	require.Equal(t, "cap_net_admin,cap_net_raw,cap_bpf,cap_net_bind_service", CapNames(MuxCaps))
	_, err = ParseCaps([]byte("Name:\tx\n"))
	require.Error(t, err)
}
