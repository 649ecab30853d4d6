package hostagent

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/health"
)

// TestDIPProberReports checks the OnDIPHealth contract without a network:
// added DIPs are reported down ("not probed yet"), then every verdict
// change, in batches that never overlap; DIPHealth lists exactly the DIPs
// probed now; a probe's target key names its VM port, so two tenants'
// DIPs with one address are probed apart.
func TestDIPProberReports(t *testing.T) {
	var (
		mu      sync.Mutex
		failing = map[string]bool{} // VM port → its DIP fails
		calls   [][]DIPHealth
		inCall  atomic.Int32
		overlap atomic.Bool
	)
	errDown := errors.New("connection refused")
	prober := health.ProberFunc(func(ctx context.Context, addr netip.AddrPort, spec health.Spec) error {
		ifname, _, _ := strings.Cut(health.TargetKey(ctx), "/")
		mu.Lock()
		defer mu.Unlock()
		if failing[ifname] {
			return errDown
		}
		return nil
	})
	notify := func(vs []DIPHealth) {
		if inCall.Add(1) > 1 {
			overlap.Store(true)
		}
		mu.Lock()
		calls = append(calls, slices.Clone(vs))
		mu.Unlock()
		inCall.Add(-1)
	}
	p, err := newDIPProber(notify, slog.New(slog.DiscardHandler), prober)
	require.NoError(t, err)
	dip := netip.MustParseAddr("198.18.4.1")
	spec := health.Spec{Type: health.ProbeTCP, Interval: 10 * time.Millisecond, Timeout: 50 * time.Millisecond, Rise: 1, Fall: 1}.WithDefaults()
	plan := &Plan{Version: 1, Probes: []DIPProbe{
		{VNI: 100, Addr: dip, Port: 8080, Interface: "vm_a", Spec: spec},
		{VNI: 200, Addr: dip, Port: 8080, Interface: "vm_t", Spec: spec},
	}}
	plan.Host.Address = netip.MustParseAddr("198.18.3.2")
	require.NoError(t, p.set(plan))
	mu.Lock()
	require.Len(t, calls, 1, "the added DIPs, reported at once")
	for _, v := range calls[0] {
		assert.False(t, v.Up)
		assert.Equal(t, "not probed yet", v.Reason)
	}
	assert.Equal(t, []health.VerdictKey{{VNI: 100, Addr: dip, Port: 8080}, {VNI: 200, Addr: dip, Port: 8080}},
		[]health.VerdictKey{calls[0][0].Key(), calls[0][1].Key()})
	mu.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.checker.Run(ctx) }()
	defer func() { cancel(); <-done }()

	state := func() map[uint32]bool {
		out := map[uint32]bool{}
		for _, v := range p.verdicts() {
			out[v.VNI] = v.Up
		}
		return out
	}
	waitUntil(t, func() bool { s := state(); return s[100] && s[200] })

	mu.Lock()
	failing["vm_t"] = true
	mu.Unlock()
	waitUntil(t, func() bool { s := state(); return s[100] && !s[200] })
	vs := p.verdicts()
	require.Len(t, vs, 2)
	assert.True(t, vs[0].Up)
	assert.Empty(t, vs[0].Reason)
	assert.False(t, vs[1].Up)
	assert.Contains(t, vs[1].Reason, "connection refused")

	// The last reported verdict of each DIP is its current one.
	waitUntil(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		last := map[uint32]DIPHealth{}
		for _, c := range calls {
			for _, v := range c {
				last[v.VNI] = v
			}
		}
		return last[100].Up && !last[200].Up && strings.Contains(last[200].Reason, "1 consecutive failures: connection refused")
	})

	// A document that stops probing VNI 200's DIP: it is gone, unreported.
	mu.Lock()
	n := len(calls)
	mu.Unlock()
	require.NoError(t, p.set(&Plan{Version: 2, Host: plan.Host, Probes: plan.Probes[:1]}))
	vs = p.verdicts()
	require.Len(t, vs, 1)
	assert.EqualValues(t, 100, vs[0].VNI)
	mu.Lock()
	for _, c := range calls[n:] {
		for _, v := range c {
			assert.NotEqualValues(t, 200, v.VNI, "a removed DIP is not reported")
		}
	}
	mu.Unlock()
	assert.False(t, overlap.Load(), "OnDIPHealth ran concurrently")
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second) // a hang guard, not a timing assertion
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached (hang guard)")
		}
		time.Sleep(time.Millisecond)
	}
}
