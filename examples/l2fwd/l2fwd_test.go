//go:build linux

package main

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// TestL2fwd runs the l2fwd binary in a device namespace between a sender
// and a receiver: UDP datagrams the sender addresses to the receiver
// arrive only through l2fwd, and they arrive intact.
func TestL2fwd(t *testing.T) {
	lab := netlab.New(t, "l2fwd")
	bin := filepath.Join(t.TempDir(), "l2fwd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	gen, err := lab.Namespace("gen")
	require.NoError(t, err)
	dut, err := lab.Namespace("dut")
	require.NoError(t, err)
	sink, err := lab.Namespace("sink")
	require.NoError(t, err)
	_, _, err = lab.Veth(gen, "g0", dut, "d0")
	require.NoError(t, err)
	_, s0, err := lab.Veth(dut, "d1", sink, "s0")
	require.NoError(t, err)
	require.NoError(t, gen.AddAddr("g0", "198.18.0.1/24"))
	require.NoError(t, sink.AddAddr("s0", "198.18.0.2/24"))
	// l2fwd moves frames between two interfaces and touches no byte: a
	// partial checksum from the sender would reach the sink unfinished.
	// It is a forwarding baseline, not a load-balancer role (those
	// complete partial checksums, engine.PartialChecksums), so the sender
	// computes full checksums.
	require.NoError(t, gen.DisableChecksumOffload("g0"))
	// The sender cannot ARP through a one-way forwarder: pin the
	// receiver's MAC.
	g0, err := gen.Link("g0")
	require.NoError(t, err)
	require.NoError(t, gen.Netlink().NeighAdd(&netlink.Neigh{LinkIndex: g0.Attrs().Index,
		Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP("198.18.0.2"), HardwareAddr: s0.MAC}))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs fleetlab.LockedBuffer
	cmd := dut.Command(ctx, bin, "-in", "d0", "-out", "d1", "-dst-mac", s0.MAC.String(), "-stats", "0")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	defer func() { cancel(); _ = cmd.Wait() }()

	// Wait until the steering program is on d0 (hang guard only).
	deadline := time.Now().Add(30 * time.Second)
	for {
		d0, err := dut.Link("d0")
		require.NoError(t, err)
		if x := d0.Attrs().Xdp; x != nil && x.Attached {
			break
		}
		require.True(t, time.Now().Before(deadline), "l2fwd did not attach: %s", logs.String())
		time.Sleep(20 * time.Millisecond)
	}

	rx, err := sink.ListenPacket(ctx, "udp4", "198.18.0.2:9000")
	require.NoError(t, err)
	defer rx.Close()
	tx, err := gen.Dial(ctx, "udp4", "198.18.0.2:9000")
	require.NoError(t, err)
	defer tx.Close()

	const n = 1000
	got := make(chan int)
	go func() {
		buf := make([]byte, 2048)
		count := 0
		for {
			_ = rx.SetReadDeadline(time.Now().Add(2 * time.Second))
			k, _, err := rx.ReadFrom(buf)
			if err != nil {
				got <- count
				return
			}
			if string(buf[:k]) == "xdplb l2fwd payload" {
				count++
			}
		}
	}()
	for i := 0; i < n; i++ {
		_, err := tx.Write([]byte("xdplb l2fwd payload"))
		require.NoError(t, err)
		if i%50 == 49 {
			time.Sleep(time.Millisecond) // pace: this is a correctness test, not a rate test
		}
	}
	received := <-got
	// Copy-mode AF_XDP at this pace loses nothing in practice; allow 1%
	// for a veth ring overrun on a loaded machine.
	require.GreaterOrEqual(t, received, n*99/100, "l2fwd output:\n%s", logs.String())

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "l2fwd exits cleanly on SIGTERM: %s", logs.String())
	require.Contains(t, logs.String(), "forwarded", "l2fwd prints its totals on exit")
	d0, err := dut.Link("d0")
	require.NoError(t, err)
	require.False(t, d0.Attrs().Xdp != nil && d0.Attrs().Xdp.Attached, "l2fwd leaves no XDP program behind")
}
