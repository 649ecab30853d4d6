package rawip

import (
	"errors"
	"sync/atomic"
)

// ErrNotSupported is returned by Open on systems without raw IP sockets.
var ErrNotSupported = errors.New("rawip: raw IP sockets need Linux")

// Stats counts what a Port did.
type Stats struct {
	Sent      uint64 // packets the kernel accepted
	Errors    uint64 // packets the kernel refused (no route, too big, no buffer…)
	Malformed uint64 // frames that were not IPv4 or IPv6 (dropped)
}

type counters struct {
	sent, errors, malformed atomic.Uint64
}

func (c *counters) stats() Stats {
	return Stats{Sent: c.sent.Load(), Errors: c.errors.Load(), Malformed: c.malformed.Load()}
}
