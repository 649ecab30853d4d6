// Package benchutil has what xdplb's benchmarks share: the CPU time the
// calling thread has used, so that a benchmark can report CPU time per
// packet next to wall time. On a machine shared with other work the wall
// time of a single-threaded benchmark counts the time its thread waited
// for a core; its thread's CPU time does not.
//
// On Linux, VMFlags reads how the memory at an address is mapped (advised
// for huge pages or not), for tests of memory the data path touches at
// random.
package benchutil

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// ThreadCPU returns the CPU time the calling OS thread has used, in
// nanoseconds (CLOCK_THREAD_CPUTIME_ID), or -1 where it is not available.
// Lock the goroutine to its thread (LockThread) around what is measured.
func ThreadCPU() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return -1
	}
	return ts.Nano()
}

// CPUTimer measures the calling thread's CPU time between Start and Stop;
// it locks the goroutine to its thread in between.
type CPUTimer struct {
	start int64
}

// Start locks the goroutine to its thread and starts the timer.
func (t *CPUTimer) Start() {
	runtime.LockOSThread()
	t.start = ThreadCPU()
}

// Stop returns the CPU time since Start in nanoseconds (-1 where not
// available) and unlocks the goroutine.
func (t *CPUTimer) Stop() int64 {
	end := ThreadCPU()
	runtime.UnlockOSThread()
	if end < 0 || t.start < 0 {
		return -1
	}
	return end - t.start
}
