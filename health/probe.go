package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
)

// Errors a probe may wrap.
var (
	// ErrTimeout: the probe did not finish within the Spec's Timeout.
	ErrTimeout = errors.New("health: probe timed out")
	// ErrUnexpectedStatus: an HTTP probe got a status other than
	// ExpectStatus.
	ErrUnexpectedStatus = errors.New("health: unexpected HTTP status")
)

// A Prober runs one probe of addr as spec says and returns nil on success.
// A Checker passes addr with spec.Port already applied. ctx carries the
// probe's deadline (spec.Timeout) and the target's key (TargetKey), and is
// cancelled when the target is removed or the Checker stops; a Prober must
// return promptly then. The Checker calls Probe from one goroutine per
// target, so a Prober must be safe for concurrent use across targets.
type Prober interface {
	Probe(ctx context.Context, addr netip.AddrPort, spec Spec) error
}

// ProberFunc adapts a function to Prober.
type ProberFunc func(ctx context.Context, addr netip.AddrPort, spec Spec) error

// Probe calls f.
func (f ProberFunc) Probe(ctx context.Context, addr netip.AddrPort, spec Spec) error {
	return f(ctx, addr, spec)
}

// maxDrain is how much of an HTTP response body a probe reads before it
// closes the connection.
const maxDrain = 64 << 10

// userAgent is sent by HTTP probes.
const userAgent = "xdplb-health/1"

// NetProber probes over real sockets: TCP connect and HTTP/1.1. Its zero
// value probes from the address the kernel's routing picks. It is safe for
// concurrent use; it must not be copied after first use.
type NetProber struct {
	// Source, when valid, is bound as the local address of probes to
	// targets of the same address family (the design sends probes from
	// infrastructure addresses, which hosts never NAT). Probes to targets
	// of the other family use the kernel's choice. Ignored when
	// DialContext is set.
	Source netip.Addr
	// DialContext, when set, opens every probe connection (network "tcp",
	// address a literal "ip:port"), for example inside a network namespace
	// (netlab's NS.Dial). It must honour ctx's deadline. ctx is the
	// probe's, so TargetKey(ctx) names the target being probed.
	DialContext func(ctx context.Context, network, address string) (net.Conn, error)

	once   sync.Once
	client *http.Client
}

// Probe runs a TCP or HTTP probe according to spec.Type. addr's port is
// replaced by spec.Port when that is set. Errors after ctx's deadline wrap
// ErrTimeout.
func (p *NetProber) Probe(ctx context.Context, addr netip.AddrPort, spec Spec) error {
	if spec.Port != 0 {
		addr = netip.AddrPortFrom(addr.Addr(), spec.Port)
	}
	var err error
	switch spec.Type {
	case ProbeTCP:
		err = p.ProbeTCP(ctx, addr)
	case ProbeHTTP:
		err = p.ProbeHTTP(ctx, addr, spec)
	default:
		return fmt.Errorf("%w: type %v", ErrInvalidSpec, spec.Type)
	}
	return timeoutError(ctx, err)
}

// ProbeTCP succeeds when a TCP handshake with addr completes before ctx
// ends. The connection is closed at once with a reset (SO_LINGER 0), so
// probing leaves no TIME_WAIT sockets on the prober; the DIP's application
// sees a connection that is reset, and sends nothing.
func (p *NetProber) ProbeTCP(ctx context.Context, addr netip.AddrPort) error {
	c, err := p.dial(ctx, "tcp", addr.String())
	if err != nil {
		return err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
	return nil
}

// ProbeHTTP sends spec.Method http://addr/spec.Path with "Connection:
// close" and spec.Host (or addr) as Host, and succeeds when the status is
// spec.ExpectStatus. ctx's deadline covers the whole exchange: connect,
// request, response headers and the body, of which up to 64 KiB are read
// before the connection is closed (no keep-alive, no redirects, no proxy
// from the environment); a body cut short is a failure. spec should have
// passed Validate.
func (p *NetProber) ProbeHTTP(ctx context.Context, addr netip.AddrPort, spec Spec) error {
	p.once.Do(p.init)
	req, err := http.NewRequestWithContext(ctx, spec.Method, "http://"+addr.String()+spec.Path, nil)
	if err != nil {
		return err
	}
	req.Close = true
	if spec.Host != "" {
		req.Host = spec.Host
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	// The body is read (up to maxDrain, then the connection is simply
	// closed) so that the whole exchange is inside the deadline and a
	// well-behaved server finishes its response before the close.
	_, rerr := io.CopyN(io.Discard, resp.Body, maxDrain)
	_ = resp.Body.Close()
	if resp.StatusCode != spec.ExpectStatus {
		return fmt.Errorf("%w %d (want %d)", ErrUnexpectedStatus, resp.StatusCode, spec.ExpectStatus)
	}
	if rerr != nil && rerr != io.EOF {
		return fmt.Errorf("health: reading response body: %w", rerr)
	}
	return nil
}

func (p *NetProber) init() {
	tr := &http.Transport{
		Proxy:                  nil, // never the environment's proxy
		DialContext:            p.dial,
		DisableKeepAlives:      true,
		DisableCompression:     true,
		MaxResponseHeaderBytes: 16 << 10,
		ForceAttemptHTTP2:      false,
	}
	p.client = &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

func (p *NetProber) dial(ctx context.Context, network, address string) (net.Conn, error) {
	if p.DialContext != nil {
		return p.DialContext(ctx, network, address)
	}
	var d net.Dialer
	if p.Source.IsValid() {
		if ap, err := netip.ParseAddrPort(address); err == nil && ap.Addr().Unmap().Is4() == p.Source.Unmap().Is4() {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(p.Source, 0))
		}
	}
	return d.DialContext(ctx, network, address)
}

// timeoutError wraps err with ErrTimeout when ctx's deadline has passed.
func timeoutError(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, ErrTimeout) {
		return err
	}
	if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return err
}
