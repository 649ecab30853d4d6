package fleetlab_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// waitOutput waits until the process has written want (a hang guard, no
// timing check).
func waitOutput(t *testing.T, p *fleetlab.Proc, want string) {
	t.Helper()
	require.NoError(t, fleetlab.Poll(context.Background(), p.Name()+" to write "+want, 30*time.Second, func() bool {
		return strings.Contains(p.Output(), want)
	}), "output: %q", p.Output())
}

func TestProc(t *testing.T) {
	lab := netlab.New(t, "flproc")
	n, err := lab.Namespace("n")
	require.NoError(t, err)

	t.Run("StopTerminates", func(t *testing.T) {
		p, err := fleetlab.StartProc(n, fleetlab.ProcConfig{Name: "sleeper", Path: "sh", Args: []string{"-c", "echo started; exec sleep 60"}})
		require.NoError(t, err)
		waitOutput(t, p, "started")
		require.False(t, p.Exited())
		require.Nil(t, p.Err(), "no exit error before the exit")
		err = p.Stop(30 * time.Second)
		require.ErrorContains(t, err, "signal: terminated")
		require.True(t, p.Exited())
		require.Equal(t, err, p.Err())
		require.Equal(t, err, p.Stop(time.Second), "Stop after the exit returns the same error")
	})

	t.Run("StopKillsAfterGrace", func(t *testing.T) {
		p, err := fleetlab.StartProc(n, fleetlab.ProcConfig{Name: "stubborn", Path: "sh",
			Args: []string{"-c", `trap "" TERM; echo ready; while :; do sleep 0.05; done`}})
		require.NoError(t, err)
		waitOutput(t, p, "ready")
		require.ErrorContains(t, p.Stop(100*time.Millisecond), "signal: killed")
	})

	t.Run("StdioAndEnv", func(t *testing.T) {
		var stdout fleetlab.LockedBuffer
		p, err := fleetlab.StartProc(n, fleetlab.ProcConfig{Name: "io", Path: "sh",
			Args:   []string{"-c", `read x; echo "$FLEETLAB_X $x"; echo log >&2`},
			Env:    []string{"FLEETLAB_X=env"},
			Stdin:  strings.NewReader("in\n"),
			Stdout: &stdout})
		require.NoError(t, err)
		require.NoError(t, p.Wait(30*time.Second))
		require.Equal(t, "env in\n", stdout.String())
		require.Equal(t, "log\n", p.Output())
	})
}

// TestStarVM wires one VM behind a host on a star and reaches its servers
// from a client through the router's and the host's kernels.
func TestStarVM(t *testing.T) {
	lab := netlab.New(t, "flstar")
	star, err := fleetlab.NewStar(lab)
	require.NoError(t, err)
	client, err := star.Attach("client", "c", 11)
	require.NoError(t, err)
	host, err := star.Attach("host", "h", 21)
	require.NoError(t, err)
	require.NoError(t, host.SetSysctl("net.ipv4.ip_forward", "1"))
	require.NoError(t, star.Router.AddRoute("198.18.31.0/24", fleetlab.SubnetAddr(21, 2).String()))
	vm := fleetlab.FleetVMs()[0]
	vmNS, err := lab.Namespace(vm.Name)
	require.NoError(t, err)
	require.NoError(t, fleetlab.WireVM(lab, host, vmNS, vm, fleetlab.FleetGateway))
	srv, err := fleetlab.ServeVM(vmNS, vm.Name, vm.Addr, 8080, 7007)
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })

	hops, err := fleetlab.NextHops(star.Router, netip.MustParsePrefix("198.18.31.0/24"))
	require.NoError(t, err)
	require.Equal(t, []netip.Addr{fleetlab.SubnetAddr(21, 2)}, hops)
	hops, err = fleetlab.NextHops(star.Router, netip.MustParsePrefix("198.18.100.1/32"))
	require.NoError(t, err)
	require.Empty(t, hops)

	hc := fleetlab.HTTPClient(client, 10*time.Second)
	url := "http://" + netip.AddrPortFrom(vm.Addr, 8080).String() + "/"
	body, err := fleetlab.Get(hc, url)
	require.NoError(t, err)
	require.Equal(t, vm.Name, body)
	body, err = fleetlab.Get(hc, url+"?q=tok")
	require.NoError(t, err)
	require.Equal(t, vm.Name+" tok", body)
	answer, err := fleetlab.UDPEcho(client, netip.AddrPortFrom(vm.Addr, 7007), "hi", 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, vm.Name+": hi", answer)
	st, err := fleetlab.LinkStats(client, "up")
	require.NoError(t, err)
	require.Positive(t, st.TxPackets)

	require.NoError(t, fleetlab.BlackholeVM(vmNS))
	_, err = fleetlab.Get(fleetlab.HTTPClient(client, 500*time.Millisecond), url)
	require.Error(t, err, "a blackholed VM does not answer")
	require.NoError(t, fleetlab.RestoreVM(vmNS, fleetlab.FleetGateway))
	body, err = fleetlab.Get(hc, url)
	require.NoError(t, err, "the VM answers again")
	require.Equal(t, vm.Name, body)
}

// TestBuildFleet builds the fleet and reaches every VM's HTTP server from
// the client directly (DIP:8080), the path the Muxes' probes take.
func TestBuildFleet(t *testing.T) {
	lab := netlab.New(t, "flfleet")
	vms := fleetlab.FleetVMs()
	f, err := fleetlab.BuildFleet(lab, 2, vms)
	require.NoError(t, err)
	require.Len(t, f.Clients, 2)
	require.Len(t, f.Muxes, fleetlab.FleetMuxes)
	require.Len(t, f.Hosts, fleetlab.FleetHosts)
	require.Len(t, f.VMs, len(vms))
	for _, vm := range vms {
		srv, err := fleetlab.ServeVM(f.VMs[vm.Name], vm.Name, vm.Addr, 8080, 0)
		require.NoError(t, err)
		t.Cleanup(func() { srv.Close() })
	}
	for k, c := range f.Clients {
		hc := fleetlab.HTTPClient(c, 10*time.Second)
		for _, vm := range vms {
			body, err := fleetlab.Get(hc, fmt.Sprintf("http://%s/?q=c%d", netip.AddrPortFrom(vm.Addr, 8080), k+1))
			require.NoError(t, err, "client%d → %s", k+1, vm.Name)
			require.Equal(t, fmt.Sprintf("%s c%d", vm.Name, k+1), body)
		}
	}
}
