package engine

// Port is a device the engine receives frames from and transmits frames
// on: an AF_XDP socket, or MemPort in tests and benchmarks.
//
// Frame ownership: a received frame lives in a buffer the receiving port
// owns (Packet.Owner). When a Transmit takes a frame it owns, it may send it
// without copying and calls Packet.MarkSent; a frame owned by another port
// is copied into the transmitting port's own buffer, and the original stays
// with its owner. After transmission the worker hands every packet that was
// not MarkSent — dropped, refused or copied — back to its owner's Release.
//
// A Port's methods are called by one worker goroutine at a time, except
// Close and Stats.
type Port interface {
	// Name identifies the port in logs and metrics.
	Name() string
	// Receive appends up to b.Cap() received packets to b, using the
	// packets in pool for metadata (pool has at least b.Cap() entries), and
	// returns how many it appended. It does not block: no frame, no packet.
	Receive(b *Batch, pool []Packet, inPort uint16) int
	// Transmit queues pkts for sending and returns how many it took. It
	// may reorder pkts so that the refused ones come last; the worker
	// drops those with the reason the port put in Packet.Reason, or
	// tx_full when it put none.
	Transmit(pkts []*Packet) int
	// Release gives back frames this port owns that will not be sent.
	Release(pkts []*Packet)
	// Flush pushes out queued transmissions and reclaims completed ones.
	// The worker calls it once per loop iteration.
	Flush() error
	// Close releases the port's resources.
	Close() error
}

// Waiter is implemented by ports that can block until frames arrive; an
// idle worker calls Wait on its first input port's Waiter, if any.
type Waiter interface {
	// Wait blocks up to timeoutMs milliseconds for received frames.
	Wait(timeoutMs int) error
}

// Checker is implemented by ports that can tell whether they still work
// (an AF_XDP socket whose interface was deleted does not). Check is called
// from a goroutine of its own, never the worker's, every
// WorkerConfig.CheckEvery; an error stops the worker (Worker.Run returns
// it) and is final: a port that failed stays failed.
type Checker interface {
	Check() error
}
