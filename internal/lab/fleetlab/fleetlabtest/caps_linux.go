package fleetlabtest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/xdplb/xdplb/internal/node"
)

// RequireThreadCaps fails the test unless every thread of process pid
// holds exactly want as its permitted, effective and bounding capability
// sets (/proc/PID/task/*/status: capabilities are per thread), and
// returns how many threads it checked. A thread that exits meanwhile is
// skipped.
func RequireThreadCaps(tb testing.TB, pid int, want uint64) int {
	tb.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	if len(tasks) < 2 {
		tb.Fatalf("process %d has %d threads; a Go process has several", pid, len(tasks))
	}
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			tb.Fatal(err)
		}
		c, err := node.ParseCaps(b)
		if err != nil {
			tb.Fatal(err)
		}
		for _, k := range []string{"CapPrm", "CapEff", "CapBnd"} {
			if c[k] != want {
				tb.Fatalf("%s: %s %016x, want %016x", task, k, c[k], want)
			}
		}
	}
	return len(tasks)
}
