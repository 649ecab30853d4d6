package health

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ProbeType says how a DIP is probed. The zero ProbeType is unset and
// invalid in a Spec.
type ProbeType uint8

const (
	// ProbeTCP succeeds when a TCP handshake with the DIP completes within
	// the timeout; the connection is then reset at once.
	ProbeTCP ProbeType = iota + 1
	// ProbeHTTP succeeds when an HTTP/1.1 request to the DIP returns the
	// expected status within the timeout.
	ProbeHTTP
)

// ErrProbeType is returned by ParseProbeType for an unknown spelling.
var ErrProbeType = errors.New(`health: unknown probe type (want "tcp" or "http")`)

// ParseProbeType parses the configuration spelling of a ProbeType: "tcp" or
// "http" (case-insensitive). There is no default: the empty string is an
// error.
func ParseProbeType(s string) (ProbeType, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return ProbeTCP, nil
	case "http":
		return ProbeHTTP, nil
	}
	return 0, ErrProbeType
}

// String returns the configuration spelling of t ("tcp", "http").
func (t ProbeType) String() string {
	switch t {
	case ProbeTCP:
		return "tcp"
	case ProbeHTTP:
		return "http"
	}
	return fmt.Sprintf("ProbeType(%d)", uint8(t))
}

// IsValid reports whether t is ProbeTCP or ProbeHTTP.
func (t ProbeType) IsValid() bool { return t == ProbeTCP || t == ProbeHTTP }

// MarshalText implements encoding.TextMarshaler.
func (t ProbeType) MarshalText() ([]byte, error) {
	if !t.IsValid() {
		return nil, ErrProbeType
	}
	return []byte(t.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler (for YAML/JSON config).
func (t *ProbeType) UnmarshalText(b []byte) error {
	v, err := ParseProbeType(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

// Defaults filled in by Spec.WithDefaults, and the limits Spec.Validate
// enforces.
const (
	DefaultInterval     = 2 * time.Second
	DefaultTimeout      = time.Second // or Interval/2 when that is shorter
	DefaultRise         = 2
	DefaultFall         = 3
	DefaultPath         = "/"
	DefaultMethod       = http.MethodGet
	DefaultExpectStatus = http.StatusOK

	// MinInterval and MaxInterval bound the probe interval Validate
	// accepts.
	MinInterval = 10 * time.Millisecond
	MaxInterval = time.Hour
	// MaxTimeout is the longest probe timeout Validate accepts. A timeout
	// may exceed the interval: the next probe of a target starts Interval
	// after the previous one ended, so probes of one target never overlap.
	MaxTimeout = time.Hour
	// MaxThreshold is the largest Rise or Fall Validate accepts.
	MaxThreshold = 100

	// IntervalJitter is the relative jitter applied to every interval: the
	// wait between two probes of a target is drawn uniformly from
	// [Interval×(1−IntervalJitter), Interval×(1+IntervalJitter)), so that
	// the probes of many targets do not synchronise.
	IntervalJitter = 0.1

	// ProbeSlack is the scheduling allowance per probe cycle that DownBound
	// and UpBound include: how late a timer may fire, and how long after
	// its deadline a timed-out probe may take to return. It is a budget the
	// bounds are stated against, not something a busy machine can promise;
	// under the injectable test clock it is zero.
	ProbeSlack = 25 * time.Millisecond
)

// ErrInvalidSpec is wrapped by every error Spec.Validate returns.
var ErrInvalidSpec = errors.New("health: invalid probe")

// Spec says how to probe the DIPs of one VIP. It is a plain comparable
// value: fill it (usually from the desired-state document), call
// WithDefaults, then Validate.
//
// The fields marked "http only" must be left zero for a TCP probe.
type Spec struct {
	// Type is ProbeTCP or ProbeHTTP. Required.
	Type ProbeType
	// Port overrides the port probed; 0 means the target's own port.
	Port uint16
	// Path is the request target, starting with "/" (http only; default "/").
	Path string
	// Method is the request method (http only; default GET).
	Method string
	// ExpectStatus is the status code that counts as healthy; any other
	// status is a failure. Redirects are not followed (http only; default 200).
	ExpectStatus int
	// Host is the Host header sent (http only; default the probed
	// address, ip:port). Not part of the shared document yet.
	Host string
	// Interval is the nominal time from the end of one probe to the start
	// of the next (jittered by ±IntervalJitter). Default 2s.
	Interval time.Duration
	// Timeout bounds a whole probe: connect, request, response and body.
	// It may be longer than Interval (up to MaxTimeout): the next probe
	// starts Interval after this one ended, so probes of one target never
	// overlap, and a dead target is marked down Timeout×Fall +
	// Interval×(Fall−1) after its first failing probe started (interval
	// 2s, timeout 5s, fall 3: 19s). Default 1s, or Interval/2 if shorter.
	Timeout time.Duration
	// Rise is how many consecutive successes bring a Down target Up.
	// Default 2.
	Rise int
	// Fall is how many consecutive failures bring an Up target Down.
	// Default 3.
	Fall int
}

// WithDefaults returns s with every unset (zero) field given its default.
// The http-only fields are filled only when Type is ProbeHTTP; Type and
// Port have no default.
func (s Spec) WithDefaults() Spec {
	if s.Interval == 0 {
		s.Interval = DefaultInterval
	}
	if s.Timeout == 0 {
		s.Timeout = min(DefaultTimeout, s.Interval/2)
	}
	if s.Rise == 0 {
		s.Rise = DefaultRise
	}
	if s.Fall == 0 {
		s.Fall = DefaultFall
	}
	if s.Type == ProbeHTTP {
		if s.Path == "" {
			s.Path = DefaultPath
		}
		if s.Method == "" {
			s.Method = DefaultMethod
		}
		if s.ExpectStatus == 0 {
			s.ExpectStatus = DefaultExpectStatus
		}
	}
	return s
}

// Validate reports every problem with s (errors.Join of them, each wrapping
// ErrInvalidSpec and naming the field by its configuration spelling), or
// nil. It does not apply defaults: call WithDefaults first.
func (s Spec) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidSpec}, args...)...))
	}
	if !s.Type.IsValid() {
		bad(`type %d is not "tcp" or "http"`, uint8(s.Type))
	}
	switch {
	case s.Interval < MinInterval:
		bad("interval %v is below the minimum %v", s.Interval, MinInterval)
	case s.Interval > MaxInterval:
		bad("interval %v is above the maximum %v", s.Interval, MaxInterval)
	}
	switch {
	case s.Timeout <= 0:
		bad("timeout %v must be positive", s.Timeout)
	case s.Timeout > MaxTimeout:
		bad("timeout %v is above the maximum %v", s.Timeout, MaxTimeout)
	}
	if s.Rise < 1 || s.Rise > MaxThreshold {
		bad("rise %d must be in 1..%d", s.Rise, MaxThreshold)
	}
	if s.Fall < 1 || s.Fall > MaxThreshold {
		bad("fall %d must be in 1..%d", s.Fall, MaxThreshold)
	}
	if s.Type == ProbeHTTP {
		if err := checkPath(s.Path); err != nil {
			bad("path %q: %v", s.Path, err)
		}
		if !isToken(s.Method) {
			bad("method %q is not an HTTP method token", s.Method)
		}
		if s.ExpectStatus < 200 || s.ExpectStatus > 599 {
			bad("expect_status %d must be in 200..599", s.ExpectStatus)
		}
		if strings.ContainsFunc(s.Host, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			bad("host %q contains spaces or control characters", s.Host)
		}
	} else if s.Type == ProbeTCP {
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"path", s.Path != ""},
			{"method", s.Method != ""},
			{"expect_status", s.ExpectStatus != 0},
			{"host", s.Host != ""},
		} {
			if f.set {
				bad("%s is only for http probes", f.name)
			}
		}
	}
	return errors.Join(errs...)
}

func checkPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return errors.New(`must start with "/"`)
	}
	if strings.ContainsFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return errors.New("contains spaces or control characters")
	}
	if _, err := url.ParseRequestURI(p); err != nil {
		return err
	}
	return nil
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// maxWait is the longest jittered wait between two probes.
func (s Spec) maxWait() time.Duration {
	return s.Interval + time.Duration(math.Ceil(float64(s.Interval)*IntervalJitter))
}

// cycleBound is the longest one probe cycle can take: the jittered wait,
// then a probe that runs to its timeout, plus ProbeSlack.
func (s Spec) cycleBound() time.Duration {
	return s.maxWait() + s.Timeout + ProbeSlack
}

// DownBound is the longest a Checker takes to mark a target Down after the
// DIP stops answering, for a valid Spec:
//
//	DownBound = (Timeout + ProbeSlack) + Fall × (Interval×(1+IntervalJitter) + Timeout + ProbeSlack)
//
// Worst case, the DIP dies while a probe is in flight that still succeeds
// (its answer was already on the way) and returns only at its timeout: that
// is the first term. Then Fall failed probes are needed, each after a
// jittered wait of at most Interval×(1+IntervalJitter) and each running to
// its timeout. The design's nominal figure, Timeout×Fall + Interval×(Fall−1),
// counts from the start of the first failing probe without jitter; this
// bound adds the wait before that probe, the in-flight probe, the jitter
// and the slack. For the defaults (2s, 1s, fall 3) it is 10.7s against a
// nominal 7s. A target in state Unknown is decided by its first probe,
// which starts within Interval of the target being added.
func (s Spec) DownBound() time.Duration {
	return s.Timeout + ProbeSlack + time.Duration(s.Fall)*s.cycleBound()
}

// UpBound is the longest a Checker takes to mark a Down target Up after
// the DIP starts answering, for a valid Spec:
//
//	UpBound = (Timeout + ProbeSlack) + Rise × (Interval×(1+IntervalJitter) + Timeout + ProbeSlack)
//
// The probe in flight when the DIP recovers may still fail at its timeout;
// then Rise successful probes are needed, each after a jittered wait and
// each taking at most the timeout. The nominal figure, from the start of
// the first successful probe, is Interval×(Rise−1) plus the Rise probes'
// round-trip times.
func (s Spec) UpBound() time.Duration {
	return s.Timeout + ProbeSlack + time.Duration(s.Rise)*s.cycleBound()
}

// LogValue implements slog.LogValuer: the spec as a group of its set fields.
func (s Spec) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("type", s.Type.String()),
		slog.Duration("interval", s.Interval),
		slog.Duration("timeout", s.Timeout),
		slog.Int("rise", s.Rise),
		slog.Int("fall", s.Fall),
	}
	if s.Port != 0 {
		attrs = append(attrs, slog.Int("port", int(s.Port)))
	}
	if s.Type == ProbeHTTP {
		attrs = append(attrs,
			slog.String("method", s.Method),
			slog.String("path", s.Path),
			slog.Int("expect_status", s.ExpectStatus))
		if s.Host != "" {
			attrs = append(attrs, slog.String("host", s.Host))
		}
	}
	return slog.GroupValue(attrs...)
}
