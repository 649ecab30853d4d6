package fleetlab

import (
	"context"
	"fmt"
	"time"
)

// PollInterval is how often Poll evaluates its condition.
const PollInterval = 10 * time.Millisecond

// Poll evaluates cond every PollInterval until it holds, and returns nil
// then. It gives up with an error naming what it waited for after limit
// (a guard against hangs, not a timing check), and with ctx's error when
// ctx is done first.
func Poll(ctx context.Context, what string, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up waiting for %s after %v", what, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(PollInterval):
		}
	}
	return nil
}
