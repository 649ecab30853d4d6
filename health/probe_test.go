package health

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Real sockets on loopback only. Deadlines here are generous hang guards
// (a probe that should succeed gets seconds); a test never asserts how
// long something took.

const probeGuard = 10 * time.Second

func guardCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), probeGuard)
	t.Cleanup(cancel)
	return ctx
}

// shortCtx is for probes that are meant to time out.
func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

func listenTCP(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln
}

func addrOf(t *testing.T, a net.Addr) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(a.String())
	require.NoError(t, err)
	return ap
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) netip.AddrPort {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ap := addrOf(t, ln.Addr())
	ln.Close()
	return ap
}

func TestProbeTCP(t *testing.T) {
	ln := listenTCP(t, "127.0.0.1:0")
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	var p NetProber
	require.NoError(t, p.Probe(guardCtx(t), addrOf(t, ln.Addr()), Spec{Type: ProbeTCP}.WithDefaults()))

	// The probe's connection is reset at once: the server reads a reset,
	// not data and not a hang.
	c := <-accepted
	defer c.Close()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(probeGuard)))
	_, err := c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, syscall.ECONNRESET)
}

func TestProbeTCPRefused(t *testing.T) {
	var p NetProber
	err := p.Probe(guardCtx(t), closedPort(t), Spec{Type: ProbeTCP}.WithDefaults())
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)
	assert.NotErrorIs(t, err, ErrTimeout)
}

func TestProbeTCPTimeout(t *testing.T) {
	var dialed atomic.Int32
	p := NetProber{DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
		dialed.Add(1)
		assert.Equal(t, "tcp", network)
		assert.Equal(t, "198.18.0.9:80", address)
		<-ctx.Done() // a DIP that never answers the SYN
		return nil, ctx.Err()
	}}
	err := p.Probe(shortCtx(t), netip.MustParseAddrPort("198.18.0.9:80"), Spec{Type: ProbeTCP}.WithDefaults())
	assert.ErrorIs(t, err, ErrTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.EqualValues(t, 1, dialed.Load())
}

func TestProbeSpecPortOverrides(t *testing.T) {
	ln := listenTCP(t, "127.0.0.1:0")
	real := addrOf(t, ln.Addr())
	var p NetProber
	s := Spec{Type: ProbeTCP, Port: real.Port()}.WithDefaults()
	require.NoError(t, p.Probe(guardCtx(t), netip.AddrPortFrom(real.Addr(), 1), s))
}

func TestProbeSource(t *testing.T) {
	// Any 127/8 address is local on Linux, so binding 127.0.0.2 as the
	// probe source is visible to a server on 127.0.0.1.
	ln := listenTCP(t, "127.0.0.1:0")
	peers := make(chan netip.Addr, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		peers <- addrOf(t, c.RemoteAddr()).Addr()
		c.Close()
	}()
	p := NetProber{Source: netip.MustParseAddr("127.0.0.2")}
	err := p.ProbeTCP(guardCtx(t), addrOf(t, ln.Addr()))
	if errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Skip("cannot bind 127.0.0.2 on this host")
	}
	require.NoError(t, err)
	assert.Equal(t, netip.MustParseAddr("127.0.0.2"), <-peers)

	// HTTP probes bind the source too.
	var remote atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		remote.Store(r.RemoteAddr)
	}))
	defer srv.Close()
	require.NoError(t, p.Probe(guardCtx(t), addrOf(t, srv.Listener.Addr()), Spec{Type: ProbeHTTP}.WithDefaults()))
	host, _, _ := net.SplitHostPort(remote.Load().(string))
	assert.Equal(t, "127.0.0.2", host)
}

func TestProbeSourceOtherFamilyIgnored(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	// An IPv4 source cannot be bound for an IPv6 target; it is not used.
	p := NetProber{Source: netip.MustParseAddr("127.0.0.1")}
	require.NoError(t, p.ProbeTCP(guardCtx(t), addrOf(t, ln.Addr())))
}

// httpServer starts an httptest server with h and counts its connections.
func httpServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func TestProbeHTTP(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var redirectedTo atomic.Bool

	handler := func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.Write([]byte("ok\n"))
		case "/status":
			code, _ := strconv.Atoi(r.URL.Query().Get("code"))
			w.WriteHeader(code)
		case "/hang":
			select { // never answers until the client gives up
			case <-r.Context().Done():
			case <-release:
			}
		case "/close":
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
		case "/redirect":
			http.Redirect(w, r, "/target", http.StatusFound)
		case "/target":
			redirectedTo.Store(true)
		case "/endless":
			buf := make([]byte, 32<<10)
			for {
				if _, err := w.Write(buf); err != nil {
					return
				}
			}
		case "/short":
			w.Header().Set("Content-Length", "100")
			w.Write([]byte("0123456789"))
		case "/stall":
			w.Header().Set("Content-Length", "100")
			w.Write([]byte("0123456789"))
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-release:
			}
		default:
			http.NotFound(w, r)
		}
	}
	srv, _ := httpServer(t, handler)
	addr := addrOf(t, srv.Listener.Addr())

	spec := func(path string, f ...func(*Spec)) Spec {
		s := Spec{Type: ProbeHTTP, Path: path}.WithDefaults()
		for _, f := range f {
			f(&s)
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		spec    Spec
		short   bool  // the probe is expected to time out
		wantErr error // nil: success
		msg     string
	}{
		{name: "200", spec: spec("/ok")},
		{name: "expected non-200", spec: spec("/status?code=503", func(s *Spec) { s.ExpectStatus = 503 })},
		{name: "500", spec: spec("/status?code=500"), wantErr: ErrUnexpectedStatus, msg: "unexpected HTTP status 500 (want 200)"},
		{name: "404", spec: spec("/nope"), wantErr: ErrUnexpectedStatus, msg: "404"},
		{name: "HEAD", spec: spec("/ok", func(s *Spec) { s.Method = "HEAD" })},
		{name: "hang", spec: spec("/hang"), short: true, wantErr: ErrTimeout},
		{name: "body stalls past the deadline", spec: spec("/stall"), short: true, wantErr: ErrTimeout},
		{name: "closes without answering", spec: spec("/close"), wantErr: io.EOF},
		{name: "redirect not followed", spec: spec("/redirect"), wantErr: ErrUnexpectedStatus, msg: "302"},
		{name: "redirect expected", spec: spec("/redirect", func(s *Spec) { s.ExpectStatus = 302 })},
		{name: "endless body read only in part", spec: spec("/endless")},
		{name: "body cut short", spec: spec("/short"), wantErr: io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.spec.Validate())
			ctx := guardCtx(t)
			if tc.short {
				ctx = shortCtx(t)
			}
			var p NetProber
			err := p.Probe(ctx, addr, tc.spec)
			if tc.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.wantErr)
			if tc.wantErr != ErrTimeout {
				assert.NotErrorIs(t, err, ErrTimeout, "a prompt failure is not a timeout")
			}
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
	assert.False(t, redirectedTo.Load(), "redirect was followed")
}

func TestProbeHTTPRequest(t *testing.T) {
	type seen struct {
		method, uri, host, ua string
		close                 bool
		body                  int64
	}
	got := make(chan seen, 4)
	srv, conns := httpServer(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got <- seen{r.Method, r.RequestURI, r.Host, r.UserAgent(), r.Close, n}
		w.WriteHeader(http.StatusNoContent)
	})
	addr := addrOf(t, srv.Listener.Addr())
	s := Spec{Type: ProbeHTTP, Path: "/healthz?deep=1", Method: "POST", ExpectStatus: 204}.WithDefaults()

	var p NetProber
	require.NoError(t, p.Probe(guardCtx(t), addr, s))
	assert.Equal(t, seen{"POST", "/healthz?deep=1", addr.String(), "xdplb-health/1", true, 0}, <-got)

	s.Host = "web.example"
	require.NoError(t, p.Probe(guardCtx(t), addr, s))
	assert.Equal(t, "web.example", (<-got).host)

	// No keep-alive: every probe is a new connection.
	assert.EqualValues(t, 2, conns.Load())
}

func TestProbeHTTPRefusedAndDialHook(t *testing.T) {
	var p NetProber
	err := p.Probe(guardCtx(t), closedPort(t), Spec{Type: ProbeHTTP}.WithDefaults())
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)

	// The hook carries HTTP probes too, e.g. into a namespace.
	srv, _ := httpServer(t, func(w http.ResponseWriter, r *http.Request) {})
	var mu sync.Mutex
	var dialed []string
	hp := NetProber{DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, network+" "+address)
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}}
	addr := addrOf(t, srv.Listener.Addr())
	require.NoError(t, hp.Probe(guardCtx(t), addr, Spec{Type: ProbeHTTP}.WithDefaults()))
	require.NoError(t, hp.Probe(guardCtx(t), addr, Spec{Type: ProbeTCP}.WithDefaults()))
	assert.Equal(t, []string{"tcp " + addr.String(), "tcp " + addr.String()}, dialed)
}

func TestProbeInvalidType(t *testing.T) {
	var p NetProber
	assert.ErrorIs(t, p.Probe(guardCtx(t), netip.MustParseAddrPort("127.0.0.1:1"), Spec{}), ErrInvalidSpec)
}
