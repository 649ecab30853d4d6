package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// TestLabRuns builds the lab and runs it briefly, as a user would: it
// must exit 0 with every request and every UDP datagram answered, every
// DIP serving, every node completing the partial checksums of senders that
// keep their offloads, and nothing left behind.
func TestLabRuns(t *testing.T) {
	netlab.RequireRoot(t)
	dir := t.TempDir()
	require.NoError(t, fleetlab.GoBuild(dir, "."))
	out, err := exec.Command(filepath.Join(dir, "lab"), "-duration", "2s", "-conns", "8").CombinedOutput()
	t.Logf("lab output:\n%s", out)
	require.NoError(t, err)
	require.Regexp(t, `HTTP: [1-9][0-9]* requests .* 0 errors`, string(out))
	require.Regexp(t, `HTTP over IPv6: [1-9][0-9]* requests to 2001:db8:100::1 .* 0 errors`, string(out))
	// UDP through the VIPs: every datagram answered, by the VIP.
	require.Regexp(t, `(?s)UDP echo: [1-9][0-9]* datagrams sent [^\n]* 0 lost, 0 wrong.*UDP echo: [1-9][0-9]* datagrams sent [^\n]* 0 lost, 0 wrong`, string(out))
	// Clients and VMs keep the kernel's checksum offload: every node
	// completed partial checksums.
	for _, node := range []string{"mux1", "mux2", "host1", "host2"} {
		require.Regexp(t, `(?m)^  `+node+` .* partial checksums completed [1-9][0-9]* `, string(out), node)
	}
	// The Muxes report their fast path's lookups.
	for _, node := range []string{"mux1", "mux2"} {
		require.Regexp(t, `(?m)^  `+node+` .* fast path hit [0-9]+, miss [1-9][0-9]* `, string(out), node)
	}
	// host3, without a Host Agent, gets finished checksums from the
	// Muxes: its kernel counts no checksum error.
	require.Regexp(t, `host3 kernel VXLAN, no Host Agent, since the start: vxlan100 rx [1-9][0-9]*, TcpInCsumErrors 0, UdpInCsumErrors 0`, string(out))
	for _, vm := range append(slices.Clone(pool), vms6...) {
		m := regexp.MustCompile(vm.Name + ` ` + regexp.QuoteMeta(vm.Addr.String()) + `\s+host\d\s+\d+\s+[\d.]+%\s+(\d+)`).FindStringSubmatch(string(out))
		require.NotNil(t, m, "%s in the report", vm.Name)
		n, _ := strconv.Atoi(m[1])
		require.Positive(t, n, "%s served connections", vm.Name)
	}
	// The fleet ran from the lab's etcd: every node reports version 1.
	require.Contains(t, string(out), "the fleet as etcd shows it (xdplbctl status): version 1: 2/2 Muxes, 2/2 hosts")
	// The Host Agents probed their DIPs through the VM ports, both
	// families, and published them up; the Muxes followed.
	for _, vm := range append(slices.Clone(vms), vms6...) {
		require.Regexp(t, `(?m)^\s+web6?\s+`+vm.Name+`\s+\S+\s+on host\d\s+up$`, string(out), vm.Name)
	}
	// Inbound NAT: each port answered by its one VM, every time.
	require.Regexp(t, `198.18.100.1:50001 -> 198.18.31.1:8080: answers map\[vm11:10\]`, string(out))
	require.Regexp(t, `198.18.100.1:50002 -> 198.18.31.2:8080: answers map\[vm12:10\]`, string(out))
	// Outbound: every VM's connections and datagrams reached the
	// internet from the VIP alone, none failed, the replies crossed the
	// Muxes.
	for _, vm := range vms {
		require.Regexp(t, vm.Name+` `+regexp.QuoteMeta(vm.Addr.String())+`\s+TCP 200/200, UDP 20/20, 0 failed; the internet saw map\[198.18.100.1:220\]`, string(out), vm.Name)
	}
	require.Regexp(t, `replies through the Muxes' range tables: [1-9][0-9]*`, string(out))
	require.Empty(t, netlab.Leftovers(labPrefix), "namespaces left behind")
}
