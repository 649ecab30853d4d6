package health

import (
	"net/http"
	"testing"
	"time"
)

// FuzzSpec feeds arbitrary probe sections through WithDefaults and
// Validate: neither may panic, and a Spec that validates must be usable:
// its HTTP request builds, its timeout fits in its interval, and its
// bounds cover the design's nominal detection time.
func FuzzSpec(f *testing.F) {
	f.Add(uint8(ProbeHTTP), uint16(8080), "/healthz", "GET", 200, int64(time.Second), int64(500*time.Millisecond), 2, 3, "")
	f.Add(uint8(ProbeTCP), uint16(0), "", "", 0, int64(0), int64(0), 0, 0, "")
	f.Add(uint8(ProbeHTTP), uint16(1), "/a?b=c#d", "HEAD", 204, int64(MinInterval), int64(1), 1, MaxThreshold, "web.example")
	f.Add(uint8(ProbeHTTP), uint16(1), "//x", "M-SEARCH", 599, int64(time.Hour), int64(time.Minute), 100, 1, "h:1")
	f.Add(uint8(ProbeHTTP), uint16(1), "/%zz", "GET", 200, int64(0), int64(0), 0, 0, "")
	f.Add(uint8(3), uint16(1), "/ x", "G T", 42, int64(-1), int64(-1), -1, 1000, "a b")
	f.Fuzz(func(t *testing.T, typ uint8, port uint16, path, method string, status int,
		interval, timeout int64, rise, fall int, host string) {
		s := Spec{Type: ProbeType(typ), Port: port, Path: path, Method: method, ExpectStatus: status,
			Host: host, Interval: time.Duration(interval), Timeout: time.Duration(timeout), Rise: rise, Fall: fall}
		d := s.WithDefaults()
		if d.WithDefaults() != d {
			t.Fatalf("WithDefaults not idempotent: %+v", d)
		}
		if err := d.Validate(); err != nil {
			return
		}
		if d.Timeout <= 0 || d.Timeout >= d.Interval || d.Rise < 1 || d.Fall < 1 {
			t.Fatalf("valid spec out of range: %+v", d)
		}
		nominal := d.Timeout*time.Duration(d.Fall) + d.Interval*time.Duration(d.Fall-1)
		if d.DownBound() <= nominal || d.UpBound() <= d.Interval*time.Duration(d.Rise-1) {
			t.Fatalf("bounds %v/%v below nominal for %+v", d.DownBound(), d.UpBound(), d)
		}
		if d.Type == ProbeHTTP {
			req, err := http.NewRequest(d.Method, "http://198.18.0.1:80"+d.Path, nil)
			if err != nil {
				t.Fatalf("valid spec %+v: request: %v", d, err)
			}
			if req.URL.Host != "198.18.0.1:80" {
				t.Fatalf("path %q changed the request's host to %q", d.Path, req.URL.Host)
			}
		}
	})
}
