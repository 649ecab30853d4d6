package e2e

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
)

// TestHostAgentControlPlane (issue 10, items 6 and 7): once forwarding,
// the Host Agent holds only CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF,
// CAP_PERFMON and CAP_IPC_LOCK on every thread (TestHostAgentEndToEnd
// rebuilds its data path with them); a VM port deleted under it stops its data
// path, which it logs before exiting non-zero (its supervisor restarts
// it). The wait for the exit is a hang guard (15 s); the workers check
// their sockets every 200 ms.
func TestHostAgentControlPlane(t *testing.T) {
	l := newHALab(t)
	agent := l.start("hostagent", l.host, "hostagent", "-uplink", "up", "-host", "host-1",
		"-metrics", netip.AddrPortFrom(netip.MustParseAddr(haHost), haHostMet).String(), "-conns", "65536")
	waitFor(t, "the Host Agent's data path", 30*time.Second, func() bool {
		m, err := scrapeErr(l.host, haHost, haHostMet)
		return err == nil && m["xdplb_datapath_up"] == 1
	})
	waitFor(t, "capabilities dropped", 10*time.Second, func() bool {
		return strings.Contains(agent.Output(), "capabilities dropped")
	})

	want := uint64(1)<<unix.CAP_NET_ADMIN | 1<<unix.CAP_NET_RAW | 1<<unix.CAP_BPF | 1<<unix.CAP_PERFMON | 1<<unix.CAP_IPC_LOCK
	n := fleetlabtest.RequireThreadCaps(t, agent.PID(), want)
	t.Logf("%d threads, each with CapPrm = CapEff = CapBnd = %016x", n, want)

	link, err := l.host.Netlink().LinkByName(haVMs[0].Port)
	require.NoError(t, err)
	require.NoError(t, l.host.Netlink().LinkDel(link))
	t0 := time.Now()
	select {
	case <-agent.Done():
	case <-time.After(15 * time.Second):
		t.Fatalf("the agent still runs 15s after its VM port was deleted:\n%s", agent.Output())
	}
	t.Logf("measured: VM port deleted → agent exited: %v", time.Since(t0).Round(time.Millisecond))
	var exit *exec.ExitError
	require.ErrorAs(t, agent.Err(), &exit)
	require.Equal(t, 1, exit.ExitCode(), "the agent exits with status 1")
	out := agent.Output()
	require.Contains(t, out, "data path failed")
	require.Contains(t, out, "afxdp: port down")
}
