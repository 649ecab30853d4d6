//go:build linux

package mux

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// TestRunWithoutDataPathWithdraws: a Mux whose data path cannot open (a
// foreign XDP program on its uplink) returns the error from Run — and
// announces nothing any more: the BGP speaker the first document started
// (announcing the VIP it can serve) is shut down, as on every other way
// out of Run. It used to stay up, announcing the VIP of a Mux that no
// longer runs.
func TestRunWithoutDataPathWithdraws(t *testing.T) {
	netlab.EnterNetns(t)
	const up = "mxrun0"
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: up, NumTxQueues: 1, NumRxQueues: 1},
		PeerName: up + "p", PeerNumTxQueues: 1, PeerNumRxQueues: 1}
	require.NoError(t, netlink.LinkAdd(v))
	t.Cleanup(func() { _ = netlink.LinkDel(v) })
	link, err := netlink.LinkByName(up)
	require.NoError(t, err)
	require.NoError(t, netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("198.18.0.2"), Mask: net.CIDRMask(24, 32)}}))
	for _, n := range []string{up, up + "p"} {
		l, err := netlink.LinkByName(n)
		require.NoError(t, err)
		require.NoError(t, netlink.LinkSetUp(l))
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "xdp_other", Type: ebpf.XDP, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()}})
	require.NoError(t, err)
	t.Cleanup(func() { prog.Close() })
	require.NoError(t, netlink.LinkSetXdpFdWithFlags(link, prog.FD(), nl.XDP_FLAGS_DRV_MODE))

	path := filepath.Join(t.TempDir(), "mux.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`version: 1
bgp:
  asn: 65010
  router_id: 198.18.0.2
  listen_port: 0
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    backends:
      - {name: a, address: 198.18.4.1, mac: "02:00:00:00:04:01", host: 198.18.3.2}
`), 0o600))
	m, err := New(Config{Interface: up, ConfigPath: path, Logger: quietLog})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // hang guard
	defer cancel()
	err = m.Run(ctx)
	require.ErrorIs(t, err, steer.ErrForeignProgram)
	require.NotEmpty(t, m.ctl.Announced(), "the first document's VIP was announced")
	m.mu.Lock()
	a := m.announcer
	m.mu.Unlock()
	require.NotNil(t, a, "the first document started the BGP speaker")
	require.Empty(t, a.Announced(), "a Mux whose Run returned still announces its VIPs")
	require.Nil(t, a.PeerStates(), "the speaker is shut down")
}
