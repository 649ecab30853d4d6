package mux

import (
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// scaleDocument builds (in code: parsing 100k backends would dominate) a
// document of vips VIPs with per backends each, every VIP probed or none.
// VIP i is 198.18.i/16-ish TCP port 80; backend j of VIP i is named
// "b<j>" at 198.19.x.y, on one of 256 hosts.
func scaleDocument(vips, per int, probed bool) *control.Document {
	doc := &control.Document{Version: 1, VIPs: make([]control.VIP, vips)}
	var spec *health.Spec
	if probed {
		s := health.Spec{Type: health.ProbeTCP}.WithDefaults()
		spec = &s
	}
	n := 0
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		*v = control.VIP{
			Name:     fmt.Sprintf("vip%d", i),
			Address:  netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}),
			Protocol: flow.ProtoTCP,
			Port:     80,
			VNI:      uint32(i>>16) + 1,
			Probe:    spec,
			Backends: make([]control.Backend, per),
		}
		for j := range v.Backends {
			v.Backends[j] = control.Backend{
				Name:    fmt.Sprintf("b%d", j),
				Address: netip.AddrFrom4([4]byte{198, 19, byte(n >> 8), byte(n)}),
				MAC:     [6]byte{2, 0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)},
				Host:    netip.AddrFrom4([4]byte{198, 18, 255, byte(n)}),
				Weight:  1,
			}
			n++
		}
	}
	return doc
}

// allUp returns a fake checker in which every target of doc is Up.
func allUp(doc *control.Document) *fakeChecker {
	chk := &fakeChecker{states: map[string]health.State{}}
	for _, t := range targets(doc) {
		chk.states[t.Key] = health.Up
	}
	return chk
}

// BenchmarkFirstApply measures a Mux's first Apply of a document of 10k
// VIPs × 10 unprobed backends (every Maglev table is built): time per
// apply, bytes allocated, and MiB-retained, the heap the running
// configuration keeps (snapshot, health targets) after a GC.
func BenchmarkFirstApply(b *testing.B) {
	for _, sz := range []struct{ vips, per int }{{10_000, 10}} {
		b.Run(fmt.Sprintf("vips=%d/backends=%d", sz.vips, sz.per), func(b *testing.B) {
			doc := scaleDocument(sz.vips, sz.per, false)
			b.ReportAllocs()
			var ms0, ms1 runtime.MemStats
			var retained uint64
			for b.Loop() {
				b.StopTimer()
				runtime.GC()
				runtime.ReadMemStats(&ms0)
				chk := &fakeChecker{states: map[string]health.State{}}
				c, err := NewController(ControllerConfig{Rules: flow.NewRules(), Checker: chk, Logger: quietLog})
				require.NoError(b, err)
				b.StartTimer()
				require.NoError(b, c.Apply(doc))
				b.StopTimer()
				runtime.GC()
				runtime.ReadMemStats(&ms1)
				retained = max(retained, ms1.HeapAlloc-min(ms0.HeapAlloc, ms1.HeapAlloc))
				runtime.KeepAlive(c)
				b.StartTimer()
			}
			b.ReportMetric(float64(retained)/(1<<20), "MiB-retained")
		})
	}
}

// BenchmarkHealthEvent measures health verdicts reaching the data path on
// a Mux with 10k and 100k probed backends (10 per VIP, all Up): one event
// at a time (ns/op is per event), and batches of 100 events on 100
// different VIPs delivered together, as the checker hands over what piled
// up while the previous batch was applied (ns/op is per batch, ns/event
// per event).
func BenchmarkHealthEvent(b *testing.B) {
	for _, backends := range []int{10_000, 100_000} {
		doc := scaleDocument(backends/10, 10, true)
		chk := allUp(doc)
		c, err := NewController(ControllerConfig{Rules: flow.NewRules(), Checker: chk, Logger: quietLog})
		require.NoError(b, err)
		require.NoError(b, c.Apply(doc))
		ts := targets(doc)
		for _, batch := range []int{1, 100} {
			b.Run(fmt.Sprintf("backends=%d/batch=%d", backends, batch), func(b *testing.B) {
				b.ReportAllocs()
				evs := make([]health.Event, batch)
				next, flips := 0, 0
				for b.Loop() {
					// Flip one backend of each of batch VIPs spread over
					// the document, alternating down and up.
					st := health.Down
					if flips++; flips%2 == 0 {
						st = health.Up
					}
					for k := range evs {
						t := &ts[(next*10+k*len(ts)/batch)%len(ts)]
						chk.set(t.Key, st)
						evs[k] = health.Event{Key: t.Key, New: st}
					}
					if st == health.Up {
						next++
					}
					applyEvents(c, evs)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/event")
			})
		}
	}
}

// applyEvents hands evs to c the way the Mux's checker does: together
// (before coalescing it handed them over one at a time).
func applyEvents(c *Controller, evs []health.Event) { c.HealthChanged(evs...) }

var quietLog = slog.New(slog.DiscardHandler)
