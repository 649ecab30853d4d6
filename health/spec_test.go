package health

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWithDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Spec
		want Spec
	}{
		{
			name: "tcp",
			in:   Spec{Type: ProbeTCP},
			want: Spec{Type: ProbeTCP, Interval: 2 * time.Second, Timeout: time.Second, Rise: 2, Fall: 3},
		},
		{
			name: "http",
			in:   Spec{Type: ProbeHTTP},
			want: Spec{Type: ProbeHTTP, Path: "/", Method: "GET", ExpectStatus: 200,
				Interval: 2 * time.Second, Timeout: time.Second, Rise: 2, Fall: 3},
		},
		{
			name: "short interval halves the default timeout",
			in:   Spec{Type: ProbeTCP, Interval: 500 * time.Millisecond},
			want: Spec{Type: ProbeTCP, Interval: 500 * time.Millisecond, Timeout: 250 * time.Millisecond, Rise: 2, Fall: 3},
		},
		{
			name: "long interval keeps 1s timeout",
			in:   Spec{Type: ProbeTCP, Interval: 10 * time.Second},
			want: Spec{Type: ProbeTCP, Interval: 10 * time.Second, Timeout: time.Second, Rise: 2, Fall: 3},
		},
		{
			name: "set fields kept",
			in: Spec{Type: ProbeHTTP, Port: 8080, Path: "/healthz", Method: "HEAD", ExpectStatus: 204,
				Host: "web", Interval: time.Second, Timeout: 500 * time.Millisecond, Rise: 1, Fall: 5},
			want: Spec{Type: ProbeHTTP, Port: 8080, Path: "/healthz", Method: "HEAD", ExpectStatus: 204,
				Host: "web", Interval: time.Second, Timeout: 500 * time.Millisecond, Rise: 1, Fall: 5},
		},
		{
			name: "unset type gets no http fields",
			in:   Spec{},
			want: Spec{Interval: 2 * time.Second, Timeout: time.Second, Rise: 2, Fall: 3},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.WithDefaults()
			assert.Equal(t, tc.want, got)
			assert.Equal(t, got, got.WithDefaults(), "idempotent")
		})
	}
}

func TestValidate(t *testing.T) {
	tcp := Spec{Type: ProbeTCP}.WithDefaults()
	http := Spec{Type: ProbeHTTP}.WithDefaults()
	with := func(s Spec, f func(*Spec)) Spec { f(&s); return s }
	for _, tc := range []struct {
		name string
		spec Spec
		want []string // substrings, one per expected error; none = valid
	}{
		{name: "tcp defaults", spec: tcp},
		{name: "http defaults", spec: http},
		{name: "http full", spec: with(http, func(s *Spec) {
			s.Port, s.Path, s.Method, s.ExpectStatus, s.Host = 8080, "/healthz?deep=1", "HEAD", 204, "web.example:8080"
		})},
		{name: "minimum interval", spec: with(tcp, func(s *Spec) { s.Interval, s.Timeout = MinInterval, MinInterval-1 })},
		{name: "thresholds 1 and max", spec: with(tcp, func(s *Spec) { s.Rise, s.Fall = 1, MaxThreshold })},

		{name: "no type", spec: Spec{}.WithDefaults(), want: []string{`type 0 is not "tcp" or "http"`}},
		{name: "bad type", spec: with(tcp, func(s *Spec) { s.Type = 9 }), want: []string{"type 9"}},
		// Probes of a target never overlap (the next starts Interval after
		// the previous ended), so a timeout may reach or pass the interval.
		{name: "timeout equals interval", spec: with(tcp, func(s *Spec) { s.Timeout = s.Interval })},
		{name: "timeout above interval", spec: with(tcp, func(s *Spec) { s.Timeout = 5 * time.Second })},
		{name: "maximum timeout", spec: with(tcp, func(s *Spec) { s.Timeout = MaxTimeout })},
		{name: "timeout too long", spec: with(tcp, func(s *Spec) { s.Timeout = MaxTimeout + 1 }),
			want: []string{"timeout 1h0m0.000000001s is above the maximum 1h0m0s"}},
		{name: "negative timeout", spec: with(tcp, func(s *Spec) { s.Timeout = -1 }),
			want: []string{"timeout -1ns must be positive"}},
		{name: "interval too short", spec: with(tcp, func(s *Spec) { s.Interval, s.Timeout = time.Millisecond, time.Microsecond }),
			want: []string{"interval 1ms is below the minimum 10ms"}},
		{name: "interval too long", spec: with(tcp, func(s *Spec) { s.Interval = 2 * time.Hour }),
			want: []string{"interval 2h0m0s is above the maximum 1h0m0s"}},
		{name: "maximum interval", spec: with(tcp, func(s *Spec) { s.Interval, s.Timeout, s.Fall = MaxInterval, MaxInterval-1, MaxThreshold })},
		{name: "rise 0", spec: with(tcp, func(s *Spec) { s.Rise = 0 }), want: []string{"rise 0 must be in 1..100"}},
		{name: "fall negative", spec: with(tcp, func(s *Spec) { s.Fall = -2 }), want: []string{"fall -2 must be in 1..100"}},
		{name: "fall too big", spec: with(tcp, func(s *Spec) { s.Fall = MaxThreshold + 1 }), want: []string{"fall 101"}},
		{name: "path relative", spec: with(http, func(s *Spec) { s.Path = "healthz" }), want: []string{`path "healthz": must start with "/"`}},
		{name: "path with space", spec: with(http, func(s *Spec) { s.Path = "/a b" }), want: []string{"spaces or control"}},
		{name: "empty path", spec: with(http, func(s *Spec) { s.Path = "" }), want: []string{`path ""`}},
		{name: "method", spec: with(http, func(s *Spec) { s.Method = "GE T" }), want: []string{`method "GE T" is not an HTTP method token`}},
		{name: "status low", spec: with(http, func(s *Spec) { s.ExpectStatus = 101 }), want: []string{"expect_status 101 must be in 200..599"}},
		{name: "status high", spec: with(http, func(s *Spec) { s.ExpectStatus = 600 }), want: []string{"expect_status 600"}},
		{name: "host", spec: with(http, func(s *Spec) { s.Host = "a\nb" }), want: []string{"host"}},
		{name: "http fields on tcp", spec: with(tcp, func(s *Spec) { s.Path, s.Method, s.ExpectStatus, s.Host = "/", "GET", 200, "h" }),
			want: []string{"path is only for http probes", "method is only for http probes",
				"expect_status is only for http probes", "host is only for http probes"}},
		{name: "several at once", spec: with(http, func(s *Spec) { s.Rise, s.Fall, s.Timeout = 0, 0, -time.Second }),
			want: []string{"timeout -1s must be positive", "rise 0", "fall 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Validate()
			if len(tc.want) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidSpec)
			lines := strings.Split(err.Error(), "\n")
			require.Len(t, lines, len(tc.want), "one line per problem: %q", err)
			for i, w := range tc.want {
				assert.Contains(t, lines[i], w)
				assert.True(t, strings.HasPrefix(lines[i], "health: invalid probe: "), lines[i])
			}
		})
	}
}

func TestProbeTypeText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ProbeType
	}{{"tcp", ProbeTCP}, {"http", ProbeHTTP}, {"HTTP", ProbeHTTP}, {"Tcp", ProbeTCP}} {
		got, err := ParseProbeType(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got)
		b, err := got.MarshalText()
		require.NoError(t, err)
		var back ProbeType
		require.NoError(t, back.UnmarshalText(b))
		assert.Equal(t, got, back)
	}
	for _, bad := range []string{"", "udp", "https", " tcp"} {
		_, err := ParseProbeType(bad)
		assert.ErrorIs(t, err, ErrProbeType, bad)
		var p ProbeType
		assert.ErrorIs(t, p.UnmarshalText([]byte(bad)), ErrProbeType)
	}
	_, err := ProbeType(0).MarshalText()
	assert.ErrorIs(t, err, ErrProbeType)
	assert.Equal(t, "ProbeType(7)", ProbeType(7).String())
}

func TestBounds(t *testing.T) {
	def := Spec{Type: ProbeTCP}.WithDefaults()
	// maxWait 2.2s; cycle = 2.2s + 1s + 25ms = 3.225s.
	assert.Equal(t, 10700*time.Millisecond, def.DownBound(), "1.025s + 3×3.225s")
	assert.Equal(t, 7475*time.Millisecond, def.UpBound(), "1.025s + 2×3.225s")

	s := Spec{Type: ProbeTCP, Interval: time.Second, Timeout: 300 * time.Millisecond, Rise: 1, Fall: 1}
	assert.Equal(t, 1100*time.Millisecond, s.maxWait())
	assert.Equal(t, 325*time.Millisecond+1425*time.Millisecond, s.DownBound())
	assert.Equal(t, s.DownBound(), s.UpBound(), "rise = fall")

	// The bound always covers the design's nominal formula plus a full
	// wait (the time before the first failing probe).
	for _, fall := range []int{1, 2, 3, 10, MaxThreshold} {
		s := Spec{Type: ProbeTCP, Interval: 2 * time.Second, Timeout: time.Second, Rise: 2, Fall: fall}
		nominal := s.Timeout*time.Duration(fall) + s.Interval*time.Duration(fall-1)
		assert.Greater(t, s.DownBound(), nominal+s.Interval, "fall %d", fall)
	}
}

func TestStateText(t *testing.T) {
	for s, want := range map[State]string{Unknown: "unknown", Up: "up", Down: "down"} {
		assert.Equal(t, want, s.String())
		b, err := s.MarshalText()
		require.NoError(t, err)
		assert.Equal(t, want, string(b))
		assert.Equal(t, s == Up, s.Healthy())
	}
	_, err := State(9).MarshalText()
	assert.Error(t, err)
	assert.Equal(t, "State(9)", State(9).String())
}

func TestSpecLogValue(t *testing.T) {
	v := Spec{Type: ProbeHTTP, Port: 81, Host: "h"}.WithDefaults().LogValue()
	got := map[string]string{}
	for _, a := range v.Group() {
		got[a.Key] = a.Value.String()
	}
	assert.Equal(t, map[string]string{"type": "http", "interval": "2s", "timeout": "1s", "rise": "2", "fall": "3",
		"port": "81", "method": "GET", "path": "/", "expect_status": "200", "host": "h"}, got)
}
