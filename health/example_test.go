package health_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/xdplb/xdplb/health"
)

// A Checker probing one backend of a VIP over HTTP. The backend here is an
// httptest server on loopback; OnChange reports the backend Up after its
// first probe passes.
func Example() {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
		}
	}))
	defer backend.Close()
	dip := netip.MustParseAddrPort(backend.Listener.Addr().String())

	events := make(chan health.Event, 16)
	checker, err := health.NewChecker(health.CheckerConfig{
		OnChange: func(ev health.Event) { events <- ev },
		Rand:     func() float64 { return 0 }, // first probe at once (no spread)
	})
	if err != nil {
		panic(err)
	}
	spec := health.Spec{Type: health.ProbeHTTP, Path: "/healthz", Interval: 5 * time.Second}.WithDefaults()
	if err := checker.Set([]health.Target{{Key: "web/vm-a", Addr: dip, Spec: spec}}); err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- checker.Run(ctx) }()

	ev := <-events
	fmt.Printf("%s: %v -> %v (%s)\n", ev.Key, ev.Old, ev.New, ev.Reason)
	stop()
	<-done

	st, _ := checker.Status("web/vm-a")
	fmt.Println("healthy:", st.State.Healthy(), "failures:", st.Failures)
	// Output:
	// web/vm-a: unknown -> up (first probe succeeded)
	// healthy: true failures: 0
}

// The probe section of a VIP with only a type gets the defaults, and its
// detection bounds follow from them.
func ExampleSpec_DownBound() {
	s := health.Spec{Type: health.ProbeTCP}.WithDefaults()
	fmt.Println("interval", s.Interval, "timeout", s.Timeout, "rise", s.Rise, "fall", s.Fall)
	fmt.Println("down within", s.DownBound(), "up within", s.UpBound())

	fast := health.Spec{Type: health.ProbeHTTP, Interval: 500 * time.Millisecond, Fall: 2}.WithDefaults()
	fmt.Println("timeout", fast.Timeout, "down within", fast.DownBound())
	// Output:
	// interval 2s timeout 1s rise 2 fall 3
	// down within 10.7s up within 7.475s
	// timeout 250ms down within 1.925s
}

func ExampleSpec_Validate() {
	s := health.Spec{Type: health.ProbeHTTP, Interval: time.Second, Timeout: -2 * time.Second, Fall: -1}.WithDefaults()
	fmt.Println(s.Validate())
	// A timeout longer than the interval is fine: probes never overlap.
	fmt.Println(health.Spec{Type: health.ProbeTCP, Interval: 2 * time.Second, Timeout: 5 * time.Second}.WithDefaults().Validate())
	// Output:
	// health: invalid probe: timeout -2s must be positive
	// health: invalid probe: fall -1 must be in 1..100
	// <nil>
}

// NetProber runs single probes without a Checker, e.g. for a CLI check.
func ExampleNetProber_Probe() {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer backend.Close()
	dip := netip.MustParseAddrPort(backend.Listener.Addr().String())

	var p health.NetProber
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fmt.Println(p.Probe(ctx, dip, health.Spec{Type: health.ProbeTCP}.WithDefaults()))
	fmt.Println(p.Probe(ctx, dip, health.Spec{Type: health.ProbeHTTP}.WithDefaults()))
	// Output:
	// <nil>
	// health: unexpected HTTP status 503 (want 200)
}
