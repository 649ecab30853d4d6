package fleet_test

import (
	"runtime"
	"testing"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/mux"
)

// BenchmarkMuxVersion measures what a Mux does with each version of
// BenchmarkFleetScale's document (-scale.change: 10,000 DIPs in 100 VIPs,
// 1,000 hosts, 1.5 MB; one backend's weight changes per version), one
// version after the other: parse=whole, control.Parse (what a Mux did
// before the Parser); parse=parts, a control.Parser that parsed the
// version before (what a Mux's Tracker does; MiB-kept: the heap its
// kept parts take); apply, mux.Controller.Apply
// with ExternalHealth (the hosts report health).
//
//	go test -run '^$' -bench MuxVersion -benchtime 20x ./fleet/
func BenchmarkMuxVersion(b *testing.B) {
	shape := scaleShape{Hosts: 1000, DIPsPerHost: 10, VIPs: 100, Muxes: 16, Change: true}
	texts := [][]byte{scaleDoc(shape, 1), scaleDoc(shape, 2)}
	b.Run("parse=whole", func(b *testing.B) { alternate(b, texts, 0, control.Parse) })
	b.Run("parse=parts", func(b *testing.B) {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		p := control.NewParser()
		if _, err := p.Parse("", texts[0]); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		kept := float64(m1.HeapAlloc-min(m0.HeapAlloc, m1.HeapAlloc)) / (1 << 20) // the parts' trees the Parser keeps
		first := p.Stats()
		alternate(b, texts, 1, func(t []byte) (*control.Document, error) { return p.Parse("", t) })
		st := p.Stats()
		b.ReportMetric(float64(st.Parsed-first.Parsed)/float64(st.Parts-first.Parts), "parts-decoded/op")
		b.ReportMetric(kept, "MiB-kept")
		runtime.KeepAlive(p)
	})
	b.Run("apply", benchMuxApply)
}

type nopChecker struct{}

func (nopChecker) Set([]health.Target) error         { return nil }
func (nopChecker) State(string) (health.State, bool) { return health.Unknown, false }

func benchMuxApply(b *testing.B) {
	shape := scaleShape{Hosts: 1000, DIPsPerHost: 10, VIPs: 100, Muxes: 16, Change: true}
	docs := make([]*control.Document, 4)
	for i := range docs {
		d, err := control.Parse(scaleDoc(shape, uint64(i+1)))
		if err != nil {
			b.Fatal(err)
		}
		docs[i] = d
	}
	ctl, err := mux.NewController(mux.ControllerConfig{Rules: flow.NewRules(), Checker: nopChecker{}, ExternalHealth: true})
	if err != nil {
		b.Fatal(err)
	}
	if err := ctl.Apply(docs[0]); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 1
	for b.Loop() {
		if err := ctl.Apply(docs[i%4]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkHostVersion measures what a Host Agent does with its view of
// each version of BenchmarkFleetScale's document when a VIP is added
// elsewhere (-scale.addvip: the change every host's client filters see,
// its view's VIP addresses), one version after the other: parse=whole,
// control.Parse; parse=parts, a control.Parser that parsed the view
// before; amend, what a Host Agent's Source does since its view is left
// as it was (control.ReadVIPAddresses of the addresses every view
// shares, the running document copied with them: Tracker.Amend). In the
// simulation 1,000 Host Agents do this on the same two cores; in a
// fleet each on its own.
//
//	go test -run '^$' -bench HostVersion -benchtime 2000x ./fleet/
func BenchmarkHostVersion(b *testing.B) {
	shape := scaleShape{Hosts: 1000, DIPsPerHost: 10, VIPs: 100, Muxes: 16, AddVIP: true}
	var texts [][]byte
	for v := uint64(2); v <= 3; v++ {
		d, err := control.Parse(scaleDoc(shape, v))
		if err != nil {
			b.Fatal(err)
		}
		view, err := fleet.HostView(d, hostName(5))
		if err != nil {
			b.Fatal(err)
		}
		t, err := view.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		texts = append(texts, t)
	}
	b.Run("parse=whole", func(b *testing.B) { alternate(b, texts, 0, control.Parse) })
	b.Run("parse=parts", func(b *testing.B) {
		p := control.NewParser()
		if _, err := p.Parse("", texts[0]); err != nil {
			b.Fatal(err)
		}
		alternate(b, texts, 1, func(t []byte) (*control.Document, error) { return p.Parse("", t) })
	})
	b.Run("amend", func(b *testing.B) {
		run, err := control.Parse(texts[0])
		if err != nil {
			b.Fatal(err)
		}
		addrs := make([][]byte, 2)
		for i, t := range texts {
			d, err := control.Parse(t)
			if err != nil {
				b.Fatal(err)
			}
			if addrs[i], err = control.MarshalVIPAddresses(d.VIPAddresses); err != nil {
				b.Fatal(err)
			}
		}
		alternate(b, addrs, 1, func(t []byte) (*control.Document, error) {
			a, ok := control.ReadVIPAddresses(t)
			if !ok {
				b.Fatal("ReadVIPAddresses refused the addresses")
			}
			d := *run
			d.VIPAddresses = a
			return &d, nil
		})
	})
}

// alternate parses texts[i%2] from i = first on, b.N times.
func alternate(b *testing.B, texts [][]byte, first int, parse func([]byte) (*control.Document, error)) {
	b.SetBytes(int64(len(texts[1])))
	b.ReportAllocs()
	for i := first; b.Loop(); i++ {
		if _, err := parse(texts[i%2]); err != nil {
			b.Fatal(err)
		}
	}
}
