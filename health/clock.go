package health

import (
	"context"
	"time"
)

// clock is the Checker's source of time: the real one, or a fake in tests
// so that schedules and detection bounds are checked in exact fake time.
type clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once after d.
	NewTimer(d time.Duration) timer
	// WithTimeout returns a context that ends after d with cause
	// context.DeadlineExceeded.
	WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc)
}

type timer interface {
	C() <-chan time.Time
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

func (realClock) WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, d)
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }
