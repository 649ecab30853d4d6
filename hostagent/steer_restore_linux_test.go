//go:build linux

package hostagent

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// upVeth creates name <-> name+"p", one queue each, up.
func upVeth(t *testing.T, name string) {
	t.Helper()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, NumTxQueues: 1, NumRxQueues: 1},
		PeerName: name + "p", PeerNumTxQueues: 1, PeerNumRxQueues: 1}
	require.NoError(t, netlink.LinkAdd(v))
	t.Cleanup(func() { _ = netlink.LinkDel(v) })
	for _, n := range []string{name, name + "p"} {
		l, err := netlink.LinkByName(n)
		require.NoError(t, err)
		require.NoError(t, netlink.LinkSetUp(l))
	}
}

// restoreDoc is a host with two VM ports, hrsa (VM a) and hrsb (VM b);
// VIP web is served by both on port, and VM b serves extra VIPs more, each
// on its own port (one source steering rule each).
func restoreDoc(version, port, extra int) *control.Document {
	var b strings.Builder
	fmt.Fprintf(&b, `version: %d
infra_prefixes: [198.18.1.0/24]
mux_prefixes: [198.18.1.2/32]
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    backends:
      - {name: a, address: 198.18.4.1, port: %d, mac: "02:00:00:00:04:01", host: 198.18.3.2}
      - {name: b, address: 198.18.4.2, port: %d, mac: "02:00:00:00:04:02", host: 198.18.3.2}
`, version, port, port)
	for i := range extra {
		fmt.Fprintf(&b, `  - name: x%d
    address: 198.18.100.2
    protocol: tcp
    port: %d
    vni: 100
    backends:
      - {name: b, address: 198.18.4.2, port: %d, mac: "02:00:00:00:04:02", host: 198.18.3.2}
`, i, 1+i, 20000+i)
	}
	b.WriteString(`hosts:
  - name: host-1
    address: 198.18.3.2
    vms:
      - {vni: 100, address: 198.18.4.1, mac: "02:00:00:00:04:01", interface: hrsa}
      - {vni: 100, address: 198.18.4.2, mac: "02:00:00:00:04:02", interface: hrsb}
`)
	d, err := control.Parse([]byte(b.String()))
	if err != nil {
		panic(err)
	}
	return d
}

// TestLiveSteerFailureKeepsRunningRules: a version that keeps the data
// path's structure but whose steering rules one VM port cannot take (more
// source rules than its program holds) is refused — and every VM port
// keeps the running version's rules. The ports are synced in order, so
// the first one had already taken the refused version's rules: the
// running version's replies from VM a on its port were no longer steered
// to the data path (they left untranslated), while the rules and NAT view
// stayed the running version's.
func TestLiveSteerFailureKeepsRunningRules(t *testing.T) {
	netlab.EnterNetns(t)
	for _, n := range []string{"hrsup", "hrsa", "hrsb"} {
		upVeth(t, n)
	}
	tests := []struct {
		name  string
		extra int // VIPs of VM b in version 2
	}{
		{"second port over its program's rules", 4100},
	}
	for _, tt := range tests {
		a, err := New(Config{Uplink: "hrsup", ConfigPath: "unused", Host: "host-1",
			Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		require.NoError(t, a.apply(restoreDoc(1, 8080, 0)))
		resolver, err := nexthop.NewResolver(nexthop.Config{Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		t.Cleanup(func() { resolver.Close() })
		dp, err := a.start(resolver)
		require.NoError(t, err)
		t.Cleanup(func() { a.stop(dp) }) // before the namespace goes
		configs := func() []steer.Config {
			var cs []steer.Config
			for _, l := range dp.live.Links() {
				cs = append(cs, l.Program.Config())
			}
			return cs
		}
		running := configs()

		err = a.apply(restoreDoc(2, 9090, tt.extra))
		require.ErrorIs(t, err, steer.ErrMapFull, tt.name)
		require.EqualValues(t, 1, a.Plan().Version, "%s: the running version stays", tt.name)
		require.Equal(t, running, configs(), "%s: steering rules of a refused version", tt.name)

	}
}
