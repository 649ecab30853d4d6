// Package node holds what the Mux and the Host Agent share around their
// data paths: the side goroutines a node runs for as long as it lives
// (resolver, health checker, ager, document watcher), the connection
// table's sweep loop, and the process plumbing of their example binaries
// (SIGHUP reloads, the Prometheus endpoint, dropping capabilities once the
// data path runs).
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Side runs a node's side goroutines: each gets a context cancelled by
// Stop, and an error other than context.Canceled is logged as
// "<prefix>: <name> stopped".
type Side struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	log    *slog.Logger
	prefix string
}

// NewSide returns a Side logging to log with the node's prefix ("mux").
func NewSide(log *slog.Logger, prefix string) *Side {
	ctx, cancel := context.WithCancel(context.Background())
	return &Side{ctx: ctx, cancel: cancel, log: log, prefix: prefix}
}

// Go starts fn in a side goroutine.
func (s *Side) Go(name string, fn func(context.Context) error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := fn(s.ctx); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Error(s.prefix+": "+name+" stopped", "err", err)
		}
	}()
}

// Stop cancels the side goroutines and waits for them. It may be called
// more than once.
func (s *Side) Stop() {
	s.cancel()
	s.wg.Wait()
}

// SweepEvery is how often Sweep ages a connection table.
const SweepEvery = 100 * time.Millisecond

// Sweep ages a connection table until ctx is done: every SweepEvery it
// calls age(budget) with budget = capacity/100 + 1 slots, so the whole
// table is swept about every 10 s. It returns nil when ctx is done.
func Sweep(ctx context.Context, capacity int, age func(budget int)) error {
	budget := capacity/100 + 1
	t := time.NewTicker(SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			age(budget)
		}
	}
}

// ReloadOnHUP calls reload on every SIGHUP, logging it, until the process
// ends.
func ReloadOnHUP(log *slog.Logger, prefix string, reload func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			log.Info(prefix + ": SIGHUP: reloading the document")
			reload()
		}
	}()
}

// Timeouts of the metrics server: a client has ReadTimeout to send its
// request and WriteTimeout to take the answer; a keep-alive connection
// idle for IdleTimeout is closed, so idle clients cannot hold connections
// (and goroutines) for ever. Variables so that a test can shorten them.
var (
	MetricsReadTimeout  = 10 * time.Second
	MetricsWriteTimeout = 30 * time.Second
	MetricsIdleTimeout  = 60 * time.Second
)

// ServeMetrics serves c, the Go runtime's and the process's collectors
// at addr (/metrics and every other path) in the background, and returns
// the function that closes the server. An empty addr serves nothing. The
// listener is opened before ServeMetrics returns, in the calling thread's
// network namespace; a failure to open it is logged and serves nothing.
// The server has read, write and idle timeouts (MetricsReadTimeout,
// MetricsWriteTimeout, MetricsIdleTimeout).
func ServeMetrics(log *slog.Logger, prefix, addr string, c ...prometheus.Collector) (closeFn func()) {
	if addr == "" {
		return func() {}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c...)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv := &http.Server{Addr: addr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: MetricsReadTimeout,
		WriteTimeout: MetricsWriteTimeout, IdleTimeout: MetricsIdleTimeout}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error(prefix+": metrics endpoint", "err", err)
		return func() {}
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(prefix+": metrics endpoint", "err", err)
		}
	}()
	return func() { _ = srv.Close() }
}

// DropAfterSetup returns the function a binary gives its node as
// OnForwarding: it drops every capability but keep (MuxCaps,
// HostAgentCaps) on every thread (DropCapabilities) and logs what it
// kept. keepAll skips the drop. A binary built with cgo cannot drop them
// (ErrCgo): it logs a warning and runs on with its capabilities.
func DropAfterSetup(log *slog.Logger, prefix string, keepAll bool, keep []uintptr) func() error {
	return func() error {
		if keepAll {
			log.Warn(prefix + ": keeping every capability (-keep-caps)")
			return nil
		}
		err := DropCapabilities(keep...)
		switch {
		case errors.Is(err, ErrCgo):
			log.Warn(prefix+": capabilities not dropped", "err", err)
			return nil
		case err != nil:
			return fmt.Errorf("drop capabilities: %w", err)
		}
		log.Info(prefix+": capabilities dropped", "kept", CapNames(keep))
		return nil
	}
}
