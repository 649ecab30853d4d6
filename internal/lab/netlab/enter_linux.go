package netlab

import (
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// EnterNetns moves the calling test goroutine, locked to its OS thread,
// into a new unnamed network namespace until the test ends; it skips the
// test, as RequireRoot does, without the privilege. Cleanups run on the
// same goroutine, so everything the test registers is undone inside the
// namespace; closing the last handle at cleanup destroys the namespace
// with its links and their XDP programs, also when the test fails, and
// nothing is ever named in /run/netns. A test using it must not start
// subtests (they would run on other threads, in the original namespace).
func EnterNetns(tb testing.TB) {
	tb.Helper()
	RequireRoot(tb)
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		tb.Fatalf("netlab: current netns: %v", err)
	}
	ns, err := netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		tb.Fatalf("netlab: new netns: %v", err)
	}
	tb.Cleanup(func() {
		ns.Close()
		// If switching back fails the thread stays locked and dies with
		// the goroutine instead of serving others from the wrong netns.
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		orig.Close()
	})
}
