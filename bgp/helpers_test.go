package bgp

import (
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
)

// testLogger returns a logger writing to the test's output until the test
// ends, and nowhere afterwards (GoBGP goroutines may outlive a test by a
// moment). XDPLB_BGP_DEBUG=1 turns on GoBGP's debug logs.
func testLogger(tb testing.TB) *slog.Logger {
	w := &gatedWriter{w: tb.Output()}
	tb.Cleanup(w.close)
	level := slog.LevelInfo
	if os.Getenv("XDPLB_BGP_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type gatedWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (g *gatedWriter) Write(b []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return len(b), nil
	}
	return g.w.Write(b)
}

func (g *gatedWriter) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}
