//go:build linux

package afxdp_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
)

// TestReflect sends UDP datagrams from the peer namespace through the veth
// to an AF_XDP port, whose worker reflects them (MACs, addresses and ports
// swapped); the peer's own UDP socket must get every one back intact, which
// also proves the checksums right. Every chunk must be back afterwards.
func TestReflect(t *testing.T) {
	tests := []struct {
		name   string
		cfg    afxdp.Config
		window int // datagrams in flight; at most the RX ring size, or the kernel drops
	}{
		{"own", afxdp.Config{}, 256},
		{"own/copy", afxdp.Config{Mode: afxdp.BindCopy}, 256},
		{"own/no-need-wakeup", afxdp.Config{DisableNeedWakeup: true}, 256},
		{"own/small-rings", afxdp.Config{NumFrames: 256, FillRingSize: 64, CompletionRingSize: 64, RXRingSize: 64, TXRingSize: 64}, 32},
		{"own/frame4096/headroom512", afxdp.Config{FrameSize: 4096, Headroom: 512}, 256},
		{"asavie", afxdp.Config{Ring: afxdp.RingAsavie}, 256},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, 1)
			prog := redirectAll(t, r.lbLink, 1)
			port := openPort(t, r.lbLink, tc.cfg)
			require.False(t, port.ZeroCopy(), "veth has no zero-copy AF_XDP")
			require.NoError(t, prog.Register(0, port.FD()))
			if tc.cfg.Ring == afxdp.RingOwn && !tc.cfg.DisableNeedWakeup {
				require.True(t, port.NeedWakeup())
			}

			w, err := engine.NewWorker(engine.WorkerConfig{
				Ports:  []engine.Port{port},
				Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(headroomCheck(port), reflect)}},
			})
			require.NoError(t, err)
			stop := runWorker(t, w)

			// Stats is safe to read while the worker runs.
			statsDone := make(chan struct{})
			statsStop := make(chan struct{})
			go func() {
				defer close(statsDone)
				for {
					select {
					case <-statsStop:
						return
					default:
					}
					if _, err := port.Stats(); err != nil {
						return
					}
				}
			}()
			defer func() { close(statsStop); <-statsDone }()

			conn, err := r.peer.ListenPacket(context.Background(), "udp4", peerAddr+":0")
			require.NoError(t, err)
			defer conn.Close()
			const n = 3000
			got := echoTraffic(t, conn, netip.MustParseAddrPort(lbAddr+":9000"), n, tc.window, 200)
			st, err := port.Stats()
			require.NoError(t, err)
			require.Equal(t, n, got, "datagrams echoed; port stats %+v", st)

			stop()
			drain(port)
			requireNoLeak(t, port)
			st, err = port.Stats()
			require.NoError(t, err)
			require.GreaterOrEqual(t, st.RXFrames, uint64(n))
			require.Equal(t, uint64(n), st.TXFrames)
			require.Equal(t, st.TXFrames, st.Completed)
			require.Zero(t, st.TXCopied)
			require.Zero(t, st.Kernel.RXInvalidDescs)
			require.Zero(t, st.Kernel.TXInvalidDescs)
			var es engine.Stats
			w.Counters().Snapshot(&es)
			require.Zero(t, es.Drops[engine.DropTXFull])
			require.Zero(t, es.Drops[dropShortHeadroom])
			t.Logf("%s: %+v", port.Name(), st)
		})
	}
}

var dropShortHeadroom = engine.RegisterDropReason("afxdp_test_short_headroom")

// headroomCheck drops packets with less headroom than the port promises.
func headroomCheck(p *afxdp.Port) engine.Stage {
	min := p.Config().Headroom
	return engine.StageFunc(func(b *engine.Batch) {
		for _, pk := range b.Packets() {
			if pk.Headroom() < min {
				b.Drop(pk, dropShortHeadroom)
			}
		}
	})
}

// TestBindModes: veth supports native XDP but not AF_XDP zero-copy, so a
// forced zero-copy bind fails there (or, should a kernel add it, reports
// zero-copy), and copy mode always works. A queue can be bound again right
// after its socket closed (the kernel frees it asynchronously).
func TestBindModes(t *testing.T) {
	r := newRig(t, 1)
	for i := 0; i < 3; i++ {
		p := openPort(t, r.lbLink, afxdp.Config{Mode: afxdp.BindCopy})
		require.False(t, p.ZeroCopy())
		require.NoError(t, p.Close())
	}

	var zc *afxdp.Port
	err := r.lb.Do(func() (err error) {
		zc, err = afxdp.Open(afxdp.Config{Interface: r.lbLink.Name, Mode: afxdp.BindZeroCopy})
		return err
	})
	if err == nil {
		defer zc.Close()
		require.True(t, zc.ZeroCopy())
		t.Log("this kernel's veth supports AF_XDP zero-copy")
		return
	}
	t.Logf("zero-copy on veth: %v", err)
	require.ErrorIs(t, err, unix.EOPNOTSUPP)
}

// TestCloseAndStats: Close is idempotent, Stats reports a closed port.
func TestCloseAndStats(t *testing.T) {
	for _, rc := range rings {
		t.Run(rc.name, func(t *testing.T) {
			r := newRig(t, 1)
			p := openPort(t, r.lbLink, afxdp.Config{Ring: rc.ring})
			st, err := p.Stats()
			require.NoError(t, err)
			require.Zero(t, st.Kernel)
			require.NoError(t, p.Close())
			require.NoError(t, p.Close())
			_, err = p.Stats()
			require.ErrorIs(t, err, afxdp.ErrClosed)
			require.ErrorIs(t, p.Wait(1), afxdp.ErrClosed)
		})
	}
}

// TestCloseFreesQueue: a closed port, whichever its ring code, leaves its
// queue free: a new socket binds to it (the kernel releases the old one
// asynchronously; RingOwn's Open retries while the queue is busy, about a
// second).
func TestCloseFreesQueue(t *testing.T) {
	for _, rc := range rings {
		t.Run(rc.name, func(t *testing.T) {
			r := newRig(t, 1)
			p := openPort(t, r.lbLink, afxdp.Config{Ring: rc.ring})
			require.NoError(t, p.Close())
			p = openPort(t, r.lbLink, afxdp.Config{})
			require.NoError(t, p.Close())
		})
	}
}
