package mux

import (
	"testing"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/internal/lab/benchutil"
)

// BenchmarkMuxNewFlows is BenchmarkMuxPipeline for flows the Mux has not
// seen: every packet is a flow's first — a connection-table miss, a Maglev
// pick and an insert — as in examples/pktrate's 1M-flow rows, where 1M
// flows fill the table of a Mux that has just started. Each pass replays
// 1M flows once into a fresh table sized as for 1M flows
// (mode=fill: free slots, no eviction), or a table sized for 200k that
// the flows keep full (mode=evict: each insert evicts the longest idle
// entry of its two buckets). The peer is muxPeer with the same tables'
// sizes. Run it with -cpu 1.
//
//	go test -run '^$' -bench MuxNewFlows -cpu 1 -benchtime 2000000x ./mux/
func BenchmarkMuxNewFlows(b *testing.B) {
	const flows = 1000000
	doc := benchDocument(b)
	frames := muxBenchTraffic(flows)
	for _, mode := range []struct {
		name  string
		table int
	}{{"fill", flows}, {"evict", flows / 5}} {
		for _, impl := range []string{"xdplb", "gopacket"} {
			b.Run("mode="+mode.name+"/impl="+impl, func(b *testing.B) {
				stages := func() []engine.Stage {
					if impl == "xdplb" {
						return ourMuxStages(b, doc, muxConnTable(b, mode.table))
					}
					return []engine.Stage{newMuxPeer(b, doc, mode.table)}
				}
				var r *muxRig
				fresh := func() {
					r = newMuxRig(b, false, stages()...)
					r.port.Replay(frames)
					if mode.name == "evict" {
						r.run(flows) // full
					}
				}
				b.StopTimer()
				fresh()
				b.ReportAllocs()
				var cpuNs int64
				n := 0
				for n < b.N {
					if mode.name == "fill" && n > 0 {
						fresh() // every pass from an empty table
					}
					var cpu benchutil.CPUTimer
					b.StartTimer()
					cpu.Start()
					n += r.run(min(flows, b.N-n))
					cpuNs += cpu.Stop()
					b.StopTimer()
				}
				if cpuNs > 0 {
					b.ReportMetric(float64(cpuNs)/float64(n), "cpu-ns/pkt")
				}
				if s := r.stats(); s.Dropped() != 0 {
					b.Fatalf("drops: %v", s.DropsByName())
				}
			})
		}
	}
}
