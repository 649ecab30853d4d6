package fleet_test

import (
	"context"
	"flag"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/xdplb/xdplb/fleet"
)

// The fleet BenchmarkFleetScale simulates; see benchmarks/README.md.
var (
	scaleHosts    = flag.Int("scale.hosts", 1000, "BenchmarkFleetScale: Host Agents")
	scaleDIPs     = flag.Int("scale.dips", 10, "BenchmarkFleetScale: probed DIPs per host")
	scaleVIPs     = flag.Int("scale.vips", 100, "BenchmarkFleetScale: VIPs (one VNI each) the DIPs serve")
	scaleMuxes    = flag.Int("scale.muxes", 16, "BenchmarkFleetScale: Muxes")
	scaleApplies  = flag.Int("scale.applies", 20, "BenchmarkFleetScale: versions applied")
	scaleFailures = flag.Int("scale.failures", 50, "BenchmarkFleetScale: DIP failures (each then recovers)")
	scaleIdle     = flag.Duration("scale.idle", 15*time.Second, "BenchmarkFleetScale: idle time measured for etcd's steady load")
	scaleChange   = flag.Bool("scale.change", false, "BenchmarkFleetScale: each version changes a backend's weight, not only the version")
	scaleAddVIP   = flag.Bool("scale.addvip", false, "BenchmarkFleetScale: each version adds a VIP (every host's client filters gain its address)")
	// A node's Tracker parses with a control.Parser, which keeps its last
	// text's parsed parts (~20 bytes per byte): for a Host Agent's view
	// (~6.5 KB here: its 10 VIPs and every VIP's address) ~130 KB, 1,000
	// of them ~130 MB in the simulation's one heap, which its GC marks on
	// every cycle: a version-only change went from 190/508 ms to
	// 256/777 ms (p50/p99) with them, a cost no node of a real fleet,
	// with a heap of its own, has. Since a host whose view a version left
	// as it was does not parse (Tracker.Advance, Tracker.Amend), even a
	// VIP added makes only its backends' hosts parse: by default the
	// simulated Host Agents parse whole (control.Parse).
	scaleHostParts = flag.Bool("scale.hostparts", false, "BenchmarkFleetScale: the Host Agents parse with a control.Parser each, as a node does (kept parts: ~130 MB in this one process)")
)

// scaleResult is what runScale measures.
type scaleResult struct {
	// applied: fleet.Apply called → every node's apply done; live: →
	// every node's status key shows the version (what xdplbctl status
	// reads).
	applied, live []time.Duration
	// muxes, hosts: fleet.Apply called → every Mux's (Host Agent's)
	// apply done: which role the apply waits for.
	muxes, hosts []time.Duration
	// down: a host publishes a DIP down → every Mux's published rules
	// have it down; up: back up, likewise.
	down, up                    []time.Duration
	applyLoad, healthLoad, idle rates
}

// runScale applies versions from v on, then fails and restores DIPs, one
// at a time, each waited for, measuring each; then idles.
func runScale(tb testing.TB, s *sim, v uint64, applies, failures int, idle time.Duration) scaleResult {
	var r scaleResult
	l0 := readLoad(tb)
	for i := range applies {
		ver := v + uint64(i)
		t0 := s.apply(ver)
		r.applied = append(r.applied, s.rec.wait(tb, versionKey(ver), s.nodes(), s.limit).Sub(t0))
		r.live = append(r.live, s.rec.wait(tb, liveKey(ver), 1, s.limit).Sub(t0))
		r.muxes = append(r.muxes, s.rec.wait(tb, roleVersionKey(fleet.RoleMux, ver), s.shape.Muxes, s.limit).Sub(t0))
		r.hosts = append(r.hosts, s.rec.wait(tb, roleVersionKey(fleet.RoleHostAgent, ver), s.shape.Hosts, s.limit).Sub(t0))
		s.progress("version %d: applied by all in %v (Muxes %v, Host Agents %v), live in %v", ver, r.applied[i].Round(time.Millisecond),
			r.muxes[i].Round(time.Millisecond), r.hosts[i].Round(time.Millisecond), r.live[i].Round(time.Millisecond))
	}
	l1 := readLoad(tb)
	for i := range failures {
		j := (i*7919 + 13) % s.shape.dips() // spread over hosts and VIPs
		t0, key := s.setDIP(j, false, i)
		r.down = append(r.down, s.rec.wait(tb, key, s.shape.Muxes, s.limit).Sub(t0))
		t0, key = s.setDIP(j, true, i)
		r.up = append(r.up, s.rec.wait(tb, key, s.shape.Muxes, s.limit).Sub(t0))
		s.progress("DIP %d: down in every Mux's rules in %v, up again in %v", j, r.down[i].Round(time.Millisecond), r.up[i].Round(time.Millisecond))
	}
	l2 := readLoad(tb)
	time.Sleep(idle)
	l3 := readLoad(tb)
	r.applyLoad, r.healthLoad, r.idle = l1.rates(l0), l2.rates(l1), l3.rates(l2)
	return r
}

// quantile is the q-quantile of ds (nearest rank: with 20 samples, p99
// is the largest).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	return s[max(0, int(math.Ceil(q*float64(len(s))))-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// TestFleetScaleSmall runs the scale simulation small (30 hosts, 300
// DIPs, 2 Muxes) and asserts what it measures happened, never how fast:
// every node reached every version and reported it, every Mux's rules
// followed every DIP's failure and recovery, the fleet's status shows it
// all, and the Muxes shared one parse per version they parsed: none for
// a version that changes only the version (they advance without an
// apply), one for a version that changes a backend (which they apply).
func TestFleetScaleSmall(t *testing.T) {
	for _, change := range []bool{false, true} {
		t.Run(fmt.Sprintf("change=%v", change), func(t *testing.T) {
			shape := scaleShape{Hosts: 30, DIPsPerHost: 10, VIPs: 5, Muxes: 2, Change: change}
			s := startSim(t, shape, time.Minute)
			const applies, failures = 2, 4
			r := runScale(t, s, 2, applies, failures, 0)
			if len(r.applied) != applies || len(r.live) != applies || len(r.down) != failures || len(r.up) != failures {
				t.Fatalf("measured %d applies, %d live, %d downs, %d ups", len(r.applied), len(r.live), len(r.down), len(r.up))
			}
			parsed, applied := uint64(1), uint64(1)
			if change {
				parsed, applied = 1+applies, 1+applies
			}
			for _, m := range s.muxes {
				if got := m.src.Status().Version; got != 1+applies {
					t.Errorf("%s runs version %d, want %d", m.name, got, 1+applies)
				}
				if got := m.ctl.Version(); got != applied {
					t.Errorf("%s's controller applied version %d, want %d", m.name, got, applied)
				}
			}
			for _, h := range s.hosts {
				if got := h.src.Status().Version; got != 1+applies {
					t.Errorf("%s runs version %d, want %d", h.name, got, 1+applies)
				}
			}
			if got := s.parse.parses.Load(); got != int64(parsed) {
				t.Errorf("%d parses for %d versions, want %d", got, 1+applies, parsed)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			f, err := fleet.ReadStatus(ctx, s.admin, "")
			if err != nil {
				t.Fatal(err)
			}
			live := f.Live(1 + applies)
			if live[fleet.RoleMux] != [2]int{2, 2} || live[fleet.RoleHostAgent] != [2]int{shape.Hosts, shape.Hosts} {
				t.Errorf("live: %v", live)
			}
			up := 0
			for _, v := range f.Health {
				if v.Up {
					up++
				}
			}
			if len(f.Health) != shape.dips() || up != shape.dips() {
				t.Errorf("%d verdicts published, %d up; want %d, all up", len(f.Health), up, shape.dips())
			}
		})
	}
}

// BenchmarkFleetScale simulates a fleet around one real etcd member (see
// sim) — by default 1,000 Host Agents with 10 probed DIPs each (10,000
// DIPs in 100 VIPs) and 16 Muxes — and reports: apply-p50/p99-ms (from
// fleet.Apply to every node's apply done; apply-muxes-*, apply-hosts-*:
// to every Mux's, every Host Agent's), live-p50/p99-ms (to every
// node's status showing it), down-p50/p99-ms (from a host publishing a
// DIP down to every Mux's published rules having it down), up-p50/p99-ms,
// and etcd's load from its own counters in each phase: key writes/s
// (puts + deletes), raft proposals/s, watch events sent/s, lease
// renewals/s. The flags -scale.* change the fleet. It runs once whatever
// b.N; skipped with -short.
//
//	go test -run '^$' -bench FleetScale -benchtime 1x -timeout 60m ./fleet/
func BenchmarkFleetScale(b *testing.B) {
	if testing.Short() {
		b.Skip("the fleet simulation takes minutes")
	}
	shape := scaleShape{Hosts: *scaleHosts, DIPsPerHost: *scaleDIPs, VIPs: *scaleVIPs, Muxes: *scaleMuxes, Change: *scaleChange, AddVIP: *scaleAddVIP}
	b.Logf("fleet: %d Host Agents (%d per etcd client), %d DIPs in %d VIPs, %d Muxes; document %d bytes",
		shape.Hosts, hostsPerClient, shape.dips(), shape.VIPs, shape.Muxes, len(scaleDoc(shape, 1)))
	t0 := time.Now()
	s := startSim(b, shape, 5*time.Minute)
	b.Logf("started in %v", time.Since(t0).Round(time.Millisecond))
	b.Logf("settled in %v", s.settle(b, time.Minute).Round(time.Millisecond))
	b.ResetTimer()
	r := runScale(b, s, 2, *scaleApplies, *scaleFailures, *scaleIdle)
	b.StopTimer()
	for _, m := range []struct {
		name string
		ds   []time.Duration
	}{{"apply", r.applied}, {"apply-muxes", r.muxes}, {"apply-hosts", r.hosts}, {"live", r.live}, {"down", r.down}, {"up", r.up}} {
		b.ReportMetric(ms(quantile(m.ds, 0.5)), m.name+"-p50-ms")
		b.ReportMetric(ms(quantile(m.ds, 0.99)), m.name+"-p99-ms")
	}
	for _, l := range []struct {
		phase string
		r     rates
	}{{"apply", r.applyLoad}, {"health", r.healthLoad}, {"idle", r.idle}} {
		b.Logf("etcd during %s: %v", l.phase, l.r)
		b.ReportMetric(l.r.KeyWrites, l.phase+"-writes/s")
		b.ReportMetric(l.r.Events, l.phase+"-events/s")
	}
	b.Logf("parses of the document: %d (shared by the Muxes; a version that changes only the version is not parsed)", s.parse.parses.Load())
	b.Logf("samples: apply %v", fmtDurations(r.applied))
	b.Logf("samples: down %v", fmtDurations(r.down))
}

func fmtDurations(ds []time.Duration) string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond).String()
	}
	return fmt.Sprint(out)
}
