package benchutil

import "testing"

// TestCPUTimer: a busy loop uses CPU time, and the timer says so.
func TestCPUTimer(t *testing.T) {
	var tm CPUTimer
	tm.Start()
	x := 0
	for i := 0; i < 50_000_000; i++ {
		x += i ^ x>>3
	}
	ns := tm.Stop()
	if ns == -1 {
		t.Skip("CLOCK_THREAD_CPUTIME_ID is not available here")
	}
	if ns <= 0 {
		t.Fatalf("a busy loop used %d ns of CPU (x=%d)", ns, x)
	}
}
