//go:build linux

package afxdp_test

import (
	"context"
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
