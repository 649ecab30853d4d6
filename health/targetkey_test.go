package health

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTargetKey: every probe's context names its target, also inside a
// NetProber's DialContext (TCP and HTTP), so a prober can tell apart two
// targets with the same address (two tenants' DIPs behind two interfaces).
func TestTargetKey(t *testing.T) {
	assert.Empty(t, TargetKey(context.Background()))
	var mu sync.Mutex
	dialed := map[string][]string{} // key → probe types dialed
	errNoNet := errors.New("no network in this test")
	np := &NetProber{DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		dialed[TargetKey(ctx)] = append(dialed[TargetKey(ctx)], address)
		return nil, errNoNet
	}}
	clk := newFakeClock()
	c, err := NewChecker(CheckerConfig{Prober: np, Rand: fixedRand(0.5), clock: clk})
	require.NoError(t, err)
	same := netip.MustParseAddrPort("198.18.31.1:8080")
	require.NoError(t, c.Set([]Target{
		{Key: "vm1/100", Addr: same, Spec: Spec{Type: ProbeTCP, Interval: time.Second}},
		{Key: "vm2/200", Addr: same, Spec: Spec{Type: ProbeHTTP, Interval: time.Second}},
	}))
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	clk.step(t, 2)
	require.NoError(t, c.Close())
	require.NoError(t, <-done)
	assert.Equal(t, map[string][]string{"vm1/100": {same.String()}, "vm2/200": {same.String()}}, dialed)
	for _, k := range []string{"vm1/100", "vm2/200"} {
		st, _ := c.Status(k)
		assert.ErrorIs(t, st.LastErr, errNoNet, k)
	}
}

func TestVerdictJSON(t *testing.T) {
	v := Verdict{VNI: 200, Addr: netip.MustParseAddr("198.18.31.1"), Port: 8080, Since: epoch, Reason: "health: probe timed out"}
	b, err := json.Marshal(v)
	require.NoError(t, err)
	assert.JSONEq(t, `{"vni":200,"addr":"198.18.31.1","port":8080,"up":false,"since":"2026-11-30T10:00:00Z","reason":"health: probe timed out"}`, string(b))
	var back Verdict
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, v, back)
	assert.Equal(t, VerdictKey{200, v.Addr, 8080}, back.Key())
	assert.Equal(t, "vni 200 198.18.31.1:8080 down since 2026-11-30T10:00:00Z: health: probe timed out", v.String())
}
