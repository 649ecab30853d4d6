//go:build linux

package afxdp_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
)

// TestTransmitTooBig hands each ring code frames it can never send (longer
// than a chunk, or empty) between frames it can: it takes the good ones,
// and the worker drops the others as tx_too_big, the reason the port
// counts them under, not as tx_full.
func TestTransmitTooBig(t *testing.T) {
	for _, rc := range rings {
		t.Run(rc.name, func(t *testing.T) {
			r := newRig(t, 1)
			port := openPort(t, r.lbLink, afxdp.Config{Ring: rc.ring})
			mem, err := engine.NewMemPort(engine.MemPortConfig{Name: "mem", FrameSize: 4096})
			require.NoError(t, err)
			lbAP := netip.MustParseAddrPort(lbAddr + ":9000")
			peerAP := netip.MustParseAddrPort(peerAddr + ":9001")
			ok := udpFrame(t, r.peerLink.MAC, r.lbLink.MAC, lbAP, peerAP, payload(1, 100))
			big := udpFrame(t, r.peerLink.MAC, r.lbLink.MAC, lbAP, peerAP, payload(2, 3000))
			mem.Inject(ok, big, ok, []byte{}, ok)

			toXDP := engine.StageFunc(func(b *engine.Batch) {
				for _, p := range b.Packets() {
					p.OutPort = 0
				}
			})
			w, err := engine.NewWorker(engine.WorkerConfig{
				Ports:  []engine.Port{port, mem},
				Inputs: []engine.Input{{Port: 1, Pipeline: engine.NewPipeline(toXDP)}},
			})
			require.NoError(t, err)
			require.Equal(t, 5, w.Poll())
			drain(port)

			var es engine.Stats
			w.Counters().Snapshot(&es)
			require.EqualValues(t, 3, es.TX)
			require.Equal(t, map[string]uint64{"tx_too_big": 2}, es.DropsByName())
			st, err := port.Stats()
			require.NoError(t, err)
			require.EqualValues(t, 3, st.TXFrames)
			require.EqualValues(t, 2, st.TXTooBig)
			require.Zero(t, st.TXRingFull)
			require.Equal(t, 4*engine.MaxBatch, mem.FreeFrames())
			requireNoLeak(t, port)
		})
	}
}
