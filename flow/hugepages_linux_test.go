package flow

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestConnTableHugePages: the buckets of a large table lie in memory
// advised for transparent huge pages (VmFlags "hg" in /proc/self/smaps).
// (Not the converse for a small table: the Go heap may place it where a
// freed large table was advised before.)
func TestConnTableHugePages(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 1 << 20})
	for _, b := range []uintptr{
		uintptr(unsafe.Pointer(&ct.v4.b[len(ct.v4.b)/2])),
		uintptr(unsafe.Pointer(&ct.v6.b[len(ct.v6.b)/2])),
	} {
		flags, ok := vmFlags(t, b)
		require.True(t, ok, "no mapping holds the table")
		require.Contains(t, strings.Fields(flags), "hg", "VmFlags: %s", flags)
	}
}

// vmFlags returns the VmFlags of the mapping that holds address a.
func vmFlags(t *testing.T, a uintptr) (string, bool) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 {
			in = lo <= a && a < hi
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmFlags:")), true
		}
	}
	require.NoError(t, sc.Err())
	return "", false
}
