package node

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
)

const outboundDoc = `version: 1
mux_prefixes: [198.18.1.0/24]
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    backends:
      - {name: vm-a, address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}
hosts:
  - name: host-1
    address: 198.19.0.1
    vms:
      - {vni: 100, address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm-a}
outbound:
  - address: 198.18.100.1
    vni: 100
    dips: [198.19.1.1]
    ports: 1024-2047
    unit: 64
`

// agent stands for a Host Agent's outbound NAT, mux for a Mux's
// controller.
type agent struct {
	mu     sync.Mutex
	allocs []flow.PortAllocation
}

func (a *agent) SetOutboundAllocations(as []flow.PortAllocation) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.allocs = as
}

func (a *agent) OutboundUsage(dst []flow.PortRangeUse) []flow.PortRangeUse { return dst }

func (a *agent) held() []flow.PortAllocation {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.allocs)
}

type muxSink struct {
	mu     sync.Mutex
	allocs []flow.PortAllocation
}

func (m *muxSink) SetPortAllocations(as []flow.PortAllocation) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.allocs = as
	return nil
}

func (m *muxSink) seen() []flow.PortAllocation {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.allocs)
}

// TestFleetPortAllocation: a Host Agent's Fleet claims a range for its
// outbound DIP once the document that lists it is applied, and hands it
// to the agent; a Mux's Fleet hands the same range to its controller.
func TestFleetPortAllocation(t *testing.T) {
	c := etcdlab.NewCluster(t.TempDir(), 1)
	e, err := c.Start(0, 30*time.Second)
	require.NoError(t, err)
	t.Cleanup(e.Close) // after the nodes' (cleanups run last first)
	ep := c.Endpoints()[0]
	cli, err := etcdlab.Client(c.Endpoints())
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	run := func(f *Fleet) {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { f.Source.Run(ctx, func(*control.Document) error { return nil }) })
		wg.Go(func() { f.Run(ctx) })
		t.Cleanup(func() { cancel(); wg.Wait(); f.Close() })
	}
	ha, err := NewFleet(ep, "", fleet.RoleHostAgent, "host-1", log)
	require.NoError(t, err)
	ag := &agent{}
	require.NoError(t, ha.AllocatePorts(ag, time.Minute))
	run(ha)
	mx, err := NewFleet(ep, "", fleet.RoleMux, "mux-1", log)
	require.NoError(t, err)
	ms := &muxSink{}
	require.NoError(t, mx.WatchPortAllocations(ms))
	run(mx)

	doc, err := control.Parse([]byte(outboundDoc))
	require.NoError(t, err)
	_, err = fleet.Apply(context.Background(), cli, "", []byte(outboundDoc), doc, "test")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(ag.held()) == 1 }, 30*time.Second, 20*time.Millisecond)
	a := ag.held()[0]
	assert.Equal(t, flow.PortOwner{DIP: netip.MustParseAddr("198.19.1.1"), Host: netip.MustParseAddr("198.19.0.1"), VNI: 100,
		MAC: [6]byte{2, 0, 0, 0, 1, 1}}, a.Owner)
	require.Eventually(t, func() bool { return slices.Equal(ms.seen(), ag.held()) }, 30*time.Second, 20*time.Millisecond)
	cs, ok := ha.AllocationCounters()
	assert.True(t, ok)
	assert.Equal(t, uint64(1), cs.Claims)
	_, ok = mx.AllocationCounters()
	assert.False(t, ok)
}

// TestFleetReportsForwarding: with ReportForwarding the status in etcd
// says what the data path does — starting, running, down once it stopped
// forwarding — not only that a document was applied; SetDataPath's
// "stopped" wins.
func TestFleetReportsForwarding(t *testing.T) {
	f, cli := statusFleet(t)
	var forwarding atomic.Bool
	f.ReportForwarding(forwarding.Load)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f.Source.Run(ctx, func(*control.Document) error { return nil }) })
	wg.Go(func() { f.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait(); f.Close() })
	doc, err := control.Parse([]byte(outboundDoc))
	require.NoError(t, err)
	_, err = fleet.Apply(context.Background(), cli, "", []byte(outboundDoc), doc, "test")
	require.NoError(t, err)

	reported := func() string { return reportedDataPath(cli) }
	for _, step := range []struct {
		forwarding bool
		set, want  string
	}{
		{want: "starting"}, // the document is applied, the data path not open
		{forwarding: true, want: "running"},
		{want: "down"},
		{forwarding: true, want: "running"},
		{set: "stopped", want: "stopped"},
	} {
		forwarding.Store(step.forwarding)
		if step.set != "" {
			f.SetDataPath(step.set)
		}
		require.Eventually(t, func() bool { return reported() == step.want }, 30*time.Second, 20*time.Millisecond,
			"want %q, reported %q", step.want, reported())
	}
}

// TestFleetStartReportsStopping: a node run with Start reports its data
// path running while it forwards, "stopping" (not "down") from the moment
// its context ends although it no longer forwards, and its status is
// gone once the function Start returned is called.
func TestFleetStartReportsStopping(t *testing.T) {
	f, cli := statusFleet(t)
	var forwarding atomic.Bool
	forwarding.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srcCtx, srcCancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f.Source.Run(srcCtx, func(*control.Document) error { return nil }) })
	t.Cleanup(func() { srcCancel(); wg.Wait(); f.Close() })
	stop := f.Start(ctx, forwarding.Load)
	doc, err := control.Parse([]byte(outboundDoc))
	require.NoError(t, err)
	_, err = fleet.Apply(context.Background(), cli, "", []byte(outboundDoc), doc, "test")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return reportedDataPath(cli) == "running" }, 30*time.Second, 20*time.Millisecond)

	cancel() // a stop asked for: the node stops forwarding and withdraws
	forwarding.Store(false)
	require.Eventually(t, func() bool { return reportedDataPath(cli) == "stopping" }, 30*time.Second, 20*time.Millisecond,
		"reported %q", reportedDataPath(cli))
	time.Sleep(2 * ForwardingCheck) // followForwarding sees forwarding false: still "stopping"
	require.Equal(t, "stopping", reportedDataPath(cli))
	stop()
	st, err := fleet.ReadStatus(context.Background(), cli, "")
	require.NoError(t, err)
	require.Empty(t, st.Nodes, "the status is removed")
}

// statusFleet starts one etcd member and returns a Mux's Fleet on it
// (not running) and a client.
func statusFleet(t *testing.T) (*Fleet, *clientv3.Client) {
	c := etcdlab.NewCluster(t.TempDir(), 1)
	e, err := c.Start(0, 30*time.Second)
	require.NoError(t, err)
	t.Cleanup(e.Close)
	cli, err := etcdlab.Client(c.Endpoints())
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	f, err := NewFleet(c.Endpoints()[0], "", fleet.RoleMux, "mux-1", slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	return f, cli
}

// reportedDataPath is the data path state mux-1 reports for version 1 in
// etcd ("" before).
func reportedDataPath(cli *clientv3.Client) string {
	st, err := fleet.ReadStatus(context.Background(), cli, "")
	if err != nil || len(st.Nodes) != 1 || st.Nodes[0].Version != 1 {
		return ""
	}
	return st.Nodes[0].DataPath
}
