package node

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

// TestSide: Stop cancels every side goroutine and waits for it; a failure
// is logged with the node's prefix, a cancellation is not.
func TestSide(t *testing.T) {
	var out fleetlab.LockedBuffer
	s := NewSide(slog.New(slog.NewTextHandler(&out, nil)), "mux")
	var done atomic.Int32
	s.Go("waiter", func(ctx context.Context) error { <-ctx.Done(); done.Add(1); return ctx.Err() })
	s.Go("failer", func(context.Context) error { done.Add(1); return errors.New("boom") })
	s.Stop()
	s.Stop()
	require.EqualValues(t, 2, done.Load())
	require.Contains(t, out.String(), `msg="mux: failer stopped" err=boom`)
	require.NotContains(t, out.String(), "waiter")
}

// TestSweep: the ager gets capacity/100+1 slots a round and the loop ends
// with its context.
func TestSweep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan int, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- Sweep(ctx, 12345, func(b int) {
			select {
			case got <- b:
			default:
			}
		})
	}()
	select {
	case b := <-got:
		require.Equal(t, 124, b)
	case <-time.After(10 * time.Second): // a hang guard, not a timing assertion
		t.Fatal("no sweep")
	}
	cancel()
	require.NoError(t, <-errc)
}
