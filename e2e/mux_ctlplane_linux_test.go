package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
	"github.com/xdplb/xdplb/internal/node"
)

// ctlplaneMD5 is the TCP-MD5 password of mux1's session in
// TestMuxControlPlane.
const ctlplaneMD5 = "xdplb test md5"

// TestMuxControlPlane runs examples/mux under BIRD with the control plane
// locked down (issue 10, items 6 and 7) and checks:
//
//  1. The session to BIRD comes up with a TCP-MD5 password and GTSM on
//     both ends (BIRD: password, ttl security on), through the Mux's
//     listener (the peer is passive), and the VIP is announced.
//  2. BGP listens only on the configured address (ss), not on 0.0.0.0 or
//     [::].
//  3. Once forwarding, the process and every one of its threads hold
//     exactly CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF and CAP_NET_BIND_SERVICE,
//     permitted, effective and bounding (/proc/PID/status,
//     /proc/PID/task/*/status).
//  4. Deleting the data interface under the running Mux withdraws the
//     VIP (seen in the router's kernel table through BIRD) and the Mux
//     exits non-zero, saying why. The BGP session runs over another
//     interface, so only the Mux's own withdrawal can remove the route.
//     Bound: the workers check their sockets every 200 ms
//     (engine.DefaultCheckEvery), the withdrawal is one UPDATE; the test
//     waits up to 30 s (a hang guard) and logs the time it took.
func TestMuxControlPlane(t *testing.T) {
	bird := e2eBIRDConfig()
	bird.Peers = bird.Peers[:1]
	bird.Peers[0].Password, bird.Peers[0].TTLSecurity = ctlplaneMD5, true
	l := newE2ELabWith(t, bird)
	m := e2eMuxes[0]
	ns := l.muxNS[0]

	// The data interface: a veth pair inside the Mux's namespace, apart
	// from the uplink "up" that carries BGP.
	_, _, err := l.lab.Veth(ns, "data", ns, "datapeer")
	require.NoError(t, err)
	require.NoError(t, ns.AddAddr("data", "198.18.9.1/30"))

	doc := e2eDocument(0)
	doc.BGP.ListenAddresses = []netip.Addr{m.addr}
	doc.BGP.Peers[0].Password, doc.BGP.Peers[0].TTLSecurity = ctlplaneMD5, 1
	// Passive: the session must come in through the listener, where the
	// key and the TTL check are set on the listening socket (which is
	// why examples/mux listens without multipath TCP).
	doc.BGP.Peers[0].Passive = true
	conf := filepath.Join(l.dir, "mux1.yaml")
	fleetlabtest.WriteDocument(t, conf, doc)
	metricsAt := netip.AddrPortFrom(m.addr, e2eMetrics)
	p := fleetlabtest.Start(t, ns, m.name, l.bin, "-interface", "data", "-config", conf,
		"-metrics", metricsAt.String(), "-conns", "65536")

	vip := netip.MustParsePrefix(e2eVIPUDP + "/32")
	t.Run("1_MD5AndGTSMSession", func(t *testing.T) {
		l.waitNextHops(vip, m.addr)
		out, err := l.birdc("show protocols all " + m.name)
		require.NoError(t, err, out)
		require.Contains(t, out, "Established")
	})
	if t.Failed() {
		return
	}

	t.Run("2_ListenOnlyWhereConfigured", func(t *testing.T) {
		out, err := ns.Command(t.Context(), "ss", "-Hltn", "sport = :179").CombinedOutput()
		require.NoError(t, err, "%s", out)
		var listeners []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(line); len(f) >= 4 {
				listeners = append(listeners, f[3])
			}
		}
		t.Logf("ss -ltn sport = :179 in %s: %v", m.name, listeners)
		require.Equal(t, []string{m.addr.String() + ":179"}, listeners)
	})

	t.Run("3_ReducedCapabilities", func(t *testing.T) {
		fleetlabtest.WaitFor(t, "capabilities dropped", 10*time.Second, func() bool {
			return strings.Contains(p.Output(), "capabilities dropped")
		})
		want := uint64(1)<<unix.CAP_NET_ADMIN | 1<<unix.CAP_NET_RAW | 1<<unix.CAP_BPF | 1<<unix.CAP_NET_BIND_SERVICE
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
		require.NoError(t, err)
		caps, err := node.ParseCaps(status)
		require.NoError(t, err)
		t.Logf("/proc/%d/status: CapPrm %016x CapEff %016x CapBnd %016x CapInh %016x CapAmb %016x",
			p.PID(), caps["CapPrm"], caps["CapEff"], caps["CapBnd"], caps["CapInh"], caps["CapAmb"])
		for _, k := range []string{"CapPrm", "CapEff", "CapBnd"} {
			require.Equal(t, want, caps[k], k)
		}
		require.Zero(t, caps["CapInh"])
		require.Zero(t, caps["CapAmb"])
		n := fleetlabtest.RequireThreadCaps(t, p.PID(), want)
		t.Logf("%d threads, each with CapPrm = CapEff = CapBnd = %016x", n, want)
	})

	t.Run("4_InterfaceDeletedWithdrawsVIP", func(t *testing.T) {
		ms, err := fleetlab.Scrape(ns, metricsAt)
		require.NoError(t, err)
		require.EqualValues(t, 1, ms["xdplb_datapath_up"])

		link, err := ns.Netlink().LinkByName("data")
		require.NoError(t, err)
		t0 := time.Now()
		require.NoError(t, ns.Netlink().LinkDel(link))
		gone := l.waitNextHops(vip)
		t.Logf("measured: data interface deleted → VIP route gone at the router: %v (bound: 200ms check + one UPDATE; hang guard 30s)",
			gone.Sub(t0).Round(time.Millisecond))
		select {
		case <-p.Done():
		case <-time.After(15 * time.Second):
			t.Fatalf("the Mux still runs 15s after its data interface was deleted:\n%s", p.Output())
		}
		var exit *exec.ExitError
		require.ErrorAs(t, p.Err(), &exit)
		require.Equal(t, 1, exit.ExitCode(), "the Mux exits with status 1")
		out := p.Output()
		require.Contains(t, out, "data path failed")
		require.Contains(t, out, "afxdp: port down")
		require.Contains(t, out, "every VIP withdrawn")
	})
}

var _ = control.DefaultListenPort
