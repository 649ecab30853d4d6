//go:build linux

package pktrate

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// helperEnv makes the test binary act as a DUT program (see helperDUT).
const helperEnv = "PKTRATE_TEST_HELPER"

func TestMain(m *testing.M) {
	helpers := map[string]func([]string) error{
		"redirect":  helperDUT,
		"mux":       helperMux,
		"hostagent": helperHostAgent,
	}
	if h, ok := helpers[os.Getenv(helperEnv)]; ok {
		if err := h(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helperDUT is a stand-in for examples/l2fwd with the same flags: it
// attaches the XDP redirect program to -in through netlink (so, unlike a
// bpf_link, it outlives the process: Process.Stop must remove it), then
// waits for SIGTERM.
func helperDUT(args []string) error {
	fs := flag.NewFlagSet("helper", flag.ContinueOnError)
	in := fs.String("in", "", "")
	out := fs.String("out", "", "")
	dstMAC := fs.String("dst-mac", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	mac, err := net.ParseMAC(*dstMAC)
	if err != nil {
		return err
	}
	inLink, err := netlink.LinkByName(*in)
	if err != nil {
		return err
	}
	outLink, err := netlink.LinkByName(*out)
	if err != nil {
		return err
	}
	spec, err := loadRedirect()
	if err != nil {
		return err
	}
	for name, v := range map[string]any{
		"out_ifindex": uint32(outLink.Attrs().Index),
		"new_dst":     [6]byte(mac),
		"new_src":     [6]byte(outLink.Attrs().HardwareAddr),
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return err
		}
	}
	var objs redirectObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return err
	}
	if err := netlink.LinkSetXdpFdWithFlags(inLink, objs.XdpL2redirect.FD(), nl.XDP_FLAGS_DRV_MODE); err != nil {
		return err
	}
	<-term
	return nil
}

// TestHarnessLowLoad runs every kind of DUT mode briefly at a load any of
// them sustains and checks that the sink counted what the generator sent,
// with the right MACs, and that nothing is left behind.
func TestHarnessLowLoad(t *testing.T) {
	netlab.RequireRoot(t)
	const prefix = "pkrt"
	self, err := os.Executable()
	require.NoError(t, err)
	lab := netlab.New(t, prefix)

	helper := Process{
		Label: "helper", Path: self, Env: []string{helperEnv + "=redirect"},
		Args: []string{"-in", "{in}", "-out", "{out}", "-dst-mac", "{next_mac}"},
	}
	var trials int
	cfg := Config{
		DUTs:   []DUT{helper, XDPRedirect{}, KernelForward{}}, // helper first: its left-behind program must be gone for the next
		Sizes:  []int{64},
		Flows:  []int{1000},
		Loads:  []Load{{PPS: 10_000}},
		Warmup: 200 * time.Millisecond, Duration: 500 * time.Millisecond, Drain: 200 * time.Millisecond,
		Trials:   1,
		Progress: func(Point, int, Sample) { trials++ },
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results, err := Run(ctx, lab, cfg)
	require.NoError(t, err)
	require.Len(t, results, 3)
	assert.Equal(t, 3, trials)
	for _, r := range results {
		require.Len(t, r.Samples, 1, r.DUT)
		s := r.Samples[0]
		t.Logf("%s: sent %d, received %d, window %v: %d/%d, drops %+v", r.DUT, s.Sent, s.Received, s.Window, s.WindowSent, s.WindowReceived, s.Drops)
		assert.NotZero(t, s.Sent, r.DUT)
		assert.GreaterOrEqual(t, float64(s.Received), 0.99*float64(s.Sent), "%s: sink counted too few", r.DUT)
		assert.LessOrEqual(t, s.Received, s.Sent, r.DUT)
		assert.Zero(t, s.WrongMAC, "%s: frames reached the sink without the sink's MAC", r.DUT)
		assert.NotZero(t, s.WindowReceived, r.DUT)
	}

	require.NoError(t, lab.Close())
	assert.Empty(t, netlab.Leftovers(prefix))
}

// TestProcessReportsEarlyExit: a DUT program that dies before it attaches
// anything fails Start with its output, and leaves nothing running.
func TestProcessReportsEarlyExit(t *testing.T) {
	netlab.RequireRoot(t)
	lab := netlab.New(t, "pkrx")
	topo, err := NewTopology(lab, TopologyConfig{})
	require.NoError(t, err)
	defer topo.Close()

	p := Process{Label: "false", Path: "sh", Args: []string{"-c", "echo no luck on {in} >&2; exit 3"}}
	_, err = p.Start(context.Background(), topo)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no luck on "+topo.DUTIn.Name)

	attached, err := topo.DUTXDPAttached()
	require.NoError(t, err)
	assert.False(t, attached)
}

// TestRunNeedsDUTs: a config without DUTs fails before it builds anything.
func TestRunNeedsDUTs(t *testing.T) {
	_, err := Run(context.Background(), nil, Config{})
	assert.Error(t, err)
	assert.False(t, errors.Is(err, context.Canceled))
}
