//go:build linux

package afxdp_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
)

// TestPortDownWhenInterfaceDeleted deletes the interface under a running
// worker: the port's Check reports ErrPortDown and the worker stops with
// it, for both ring implementations and for a worker with two inputs
// (which never waits in poll). The deadline is a hang guard: the worker
// checks its ports every engine.DefaultCheckEvery.
func TestPortDownWhenInterfaceDeleted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ring   afxdp.Ring
		inputs int
	}{{"own", afxdp.RingOwn, 1}, {"own/two-inputs", afxdp.RingOwn, 2}, {"asavie", afxdp.RingAsavie, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, 1)
			prog := redirectAll(t, r.lbLink, 1)
			port := openPort(t, r.lbLink, afxdp.Config{Ring: tc.ring})
			require.NoError(t, prog.Register(0, port.FD()))
			require.NoError(t, port.Check(), "a working port")
			ports := []engine.Port{port}
			ins := []engine.Input{{Port: 0, Pipeline: engine.NewPipeline()}}
			if tc.inputs == 2 {
				mem, err := engine.NewMemPort(engine.MemPortConfig{Name: "mem"})
				require.NoError(t, err)
				ports = append(ports, mem)
				ins = append(ins, engine.Input{Port: 1, Pipeline: engine.NewPipeline()})
			}
			w, err := engine.NewWorker(engine.WorkerConfig{Ports: ports, Inputs: ins})
			require.NoError(t, err)
			done := make(chan error, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { done <- w.Run(ctx) }()

			link, err := r.lb.Netlink().LinkByName(r.lbLink.Name)
			require.NoError(t, err)
			require.NoError(t, r.lb.Netlink().LinkDel(link))
			select {
			case err := <-done:
				require.ErrorIs(t, err, afxdp.ErrPortDown)
				t.Logf("worker stopped: %v", err)
			case <-time.After(10 * time.Second):
				cancel()
				<-done
				t.Fatal("the worker kept polling a port whose interface is gone")
			}
			require.ErrorIs(t, port.Check(), afxdp.ErrPortDown, "the failure is final")
		})
	}
}

// TestTransmitAfterInterfaceDeleted transmits on a port whose interface
// is gone, for both ring implementations: the send fails (the kernel
// answers ENETDOWN), which must not panic — github.com/asavie/xdp's
// Transmit panics on any sendto error but EINTR, EAGAIN and EBUSY, and
// a worker forwarding a packet as the interface went away crashed the
// process (TestPortDownWhenInterfaceDeleted did, now and then, on a
// router solicitation the kernel sent as the veth came up). The frames
// are taken (on the TX ring, which nothing will ever drain) and the port
// reports itself down.
func TestTransmitAfterInterfaceDeleted(t *testing.T) {
	for _, ring := range []afxdp.Ring{afxdp.RingOwn, afxdp.RingAsavie} {
		t.Run(ring.String(), func(t *testing.T) {
			r := newRig(t, 1)
			port := openPort(t, r.lbLink, afxdp.Config{Ring: ring})
			mem, err := engine.NewMemPort(engine.MemPortConfig{Name: "mem"})
			require.NoError(t, err)
			f := udpFrame(t, r.peerLink.MAC, r.lbLink.MAC, netip.MustParseAddrPort(lbAddr+":9000"),
				netip.MustParseAddrPort(peerAddr+":9001"), payload(1, 100))

			link, err := r.lb.Netlink().LinkByName(r.lbLink.Name)
			require.NoError(t, err)
			require.NoError(t, r.lb.Netlink().LinkDel(link))

			var b engine.Batch
			pool := make([]engine.Packet, engine.MaxBatch)
			mem.Inject(f, f, f)
			require.Equal(t, 3, mem.Receive(&b, pool, 1))
			var k int
			require.NotPanics(t, func() { k = port.Transmit(b.Packets()) })
			mem.Release(b.Packets())
			require.Equal(t, 3, k, "the frames are on the TX ring")
			require.NotPanics(t, func() { _ = port.Flush() })
			require.ErrorIs(t, port.Check(), afxdp.ErrPortDown)
		})
	}
}
