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

// TestAsavieNoFrame copies frames into a RingAsavie port until no chunk is
// free (nothing is flushed, so nothing comes back; the TX ring has room):
// the rest are refused for lack of a chunk, counted and given the reason
// tx_no_frame as RingOwn does (TestFakeRefusalReasons), not tx_full, but
// for the empty frames among them, which are too big for any port.
func TestAsavieNoFrame(t *testing.T) {
	r := newRig(t, 1)
	// 256 chunks, 64 on the fill ring: 192 to copy into.
	port := openPort(t, r.lbLink, afxdp.Config{Ring: afxdp.RingAsavie, NumFrames: 256,
		FillRingSize: 64, RXRingSize: 64, TXRingSize: 256, CompletionRingSize: 256})
	mem, err := engine.NewMemPort(engine.MemPortConfig{Name: "mem"})
	require.NoError(t, err)
	lbAP := netip.MustParseAddrPort(lbAddr + ":9000")
	peerAP := netip.MustParseAddrPort(peerAddr + ":9001")
	f := udpFrame(t, r.peerLink.MAC, r.lbLink.MAC, lbAP, peerAP, payload(1, 100))
	var b engine.Batch
	pool := make([]engine.Packet, engine.MaxBatch)
	taken := 0
	var refused []engine.DropReason
	for i := 0; i < 4; i++ {
		for j := 0; j < engine.MaxBatch; j++ {
			if i == 3 && j >= engine.MaxBatch-2 {
				mem.Inject([]byte{})
				continue
			}
			mem.Inject(f)
		}
		b.Reset()
		require.Equal(t, engine.MaxBatch, mem.Receive(&b, pool, 1))
		k := port.Transmit(b.Packets())
		taken += k
		for _, pk := range b.Packets()[k:] {
			refused = append(refused, pk.Reason)
		}
		mem.Release(b.Packets())
	}
	require.Equal(t, 192, taken)
	reasons := map[engine.DropReason]int{}
	for _, r := range refused {
		reasons[r]++
	}
	require.Equal(t, map[engine.DropReason]int{afxdp.DropTXNoFrame: engine.MaxBatch - 2, engine.DropTXTooBig: 2}, reasons)
	require.NoError(t, port.Flush())
	st, err := port.Stats()
	require.NoError(t, err)
	require.EqualValues(t, engine.MaxBatch-2, st.TXNoFrame)
	require.EqualValues(t, 2, st.TXTooBig)
	require.Zero(t, st.TXRingFull)
	drain(port)
	requireNoLeak(t, port)
}
