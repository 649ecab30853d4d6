package mux

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// snapshotDoc is version %d: the VIP in VNI %d with backends of that
// version. Every version moves the VIP to the other VNI and the other
// backends, so that a stage reading one version and the next stage
// another cannot go unnoticed: the rule lookup by (VNI, VIP) fails (no
// rule), or the rule is not the batch's.
const snapshotDoc = `
version: %d
hash_seed: 7
vips:
  - name: web
    address: 198.19.255.1
    protocol: tcp
    port: 80
    vni: %d
    backends:
      - {name: b%d, address: 198.18.200.%d, mac: "02:00:00:00:01:01", host: 198.18.254.1}
`

// TestOneVersionPerBatch reloads the Mux's document as fast as it can
// while a worker runs its pipeline (Mux.pipeline, with the worker loading
// the Controller's snapshot once per batch, as Run wires it): every packet
// of every batch carries a rule of the batch's snapshot, in the VNI that
// snapshot gives the VIP, and none is dropped for want of a rule. The
// snapshots replaced are released: a finalizer on each counts them.
func TestOneVersionPerBatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	require.NoError(t, os.WriteFile(path, []byte("version: 0\n"), 0o644))
	m, err := New(Config{Interface: "uplink0", ConfigPath: path, SourceV4: benchMuxSrc,
		SourceV6: netip.MustParseAddr("2001:db8:254::1"), Conns: flow.ConnTableConfig{Capacity: 4096},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	doc := func(v int) *control.Document {
		vni, be := 100, 1
		if v%2 == 0 {
			vni, be = 200, 2
		}
		d, err := control.Parse([]byte(fmt.Sprintf(snapshotDoc, v, vni, be, be)))
		require.NoError(t, err)
		return d
	}
	require.NoError(t, m.ctl.Apply(doc(1)))

	var batches, pkts, wrong atomic.Int64
	var firstWrong atomic.Value
	check := engine.StageFunc(func(b *engine.Batch) {
		ms, _ := b.Snapshot.(*muxSnapshot)
		batches.Add(1)
		for _, p := range b.Packets() {
			pkts.Add(1)
			switch {
			case ms == nil:
				wrong.Add(1)
				firstWrong.CompareAndSwap(nil, "a batch without a snapshot")
			case p.Rule == nil || ms.rules.Rule(p.Rule.ID) != p.Rule:
				wrong.Add(1)
				firstWrong.CompareAndSwap(nil, fmt.Sprintf("a packet whose rule is not of the batch's version %d", ms.rules.Version))
			case p.Key.VNI != p.Rule.VIP.VNI:
				wrong.Add(1)
				firstWrong.CompareAndSwap(nil, fmt.Sprintf("VNI %d in version %d, whose VIP is in VNI %d", p.Key.VNI, ms.rules.Version, p.Rule.VIP.VNI))
			}
		}
	})
	pl, err := m.pipeline(7, benchUplink, partialHops, 1)
	require.NoError(t, err)
	port, err := engine.NewMemPort(engine.MemPortConfig{Name: "uplink"})
	require.NoError(t, err)
	kernel, err := engine.NewMemPort(engine.MemPortConfig{Name: "kernel"})
	require.NoError(t, err)
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{port, kernel}, Snapshot: m.ctl.Snapshot,
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(pl, check)}}})
	require.NoError(t, err)
	var frames [][]byte
	for i := range 256 {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP,
			SrcIP: net.IPv4(198, 18, 0, byte(i)).To4(), DstIP: net.IPv4(198, 19, 255, 1).To4()}
		tcp := &layers.TCP{SrcPort: layers.TCPPort(40000 + i), DstPort: 80, ACK: true, Window: 1000}
		_ = tcp.SetNetworkLayerForChecksum(ip)
		frames = append(frames, seedFrame(t, ip, tcp, gopacket.Payload("x")))
	}
	port.Replay(frames)

	var released atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for v := 2; ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := m.ctl.Apply(doc(v)); err != nil {
				t.Errorf("apply %d: %v", v, err)
				return
			}
			runtime.SetFinalizer(m.ctl.snapshot.Load(), func(*muxSnapshot) { released.Add(1) })
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	for batches.Load() < 20000 && time.Now().Before(deadline) {
		w.Poll()
	}
	close(stop)
	wg.Wait()
	var st engine.Stats
	w.Counters().Snapshot(&st)
	t.Logf("%d batches, %d packets through %d versions; drops %v", batches.Load(), pkts.Load(), m.ctl.snapshot.Load().rules.Version, st.DropsByName())
	require.Zero(t, wrong.Load(), "first: %v", firstWrong.Load())
	require.Zero(t, st.Dropped(), "drops: %v", st.DropsByName())
	require.Greater(t, m.ctl.snapshot.Load().rules.Version, uint64(10), "too few reloads to show anything")

	// The replaced snapshots (and the rules and tables they hold) are
	// garbage once no batch holds them.
	for range 20 {
		runtime.GC()
		if released.Load() > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.Positive(t, released.Load(), "no replaced snapshot was ever released")
}
