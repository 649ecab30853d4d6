package flow

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/benchutil"
)

// TestConnTableHugePages: the buckets of a large table lie in memory
// advised for transparent huge pages (VmFlags "hg" in /proc/self/smaps).
// (Not the converse for a small table: the Go heap may place it where a
// freed large table was advised before.)
func TestConnTableHugePages(t *testing.T) {
	if !benchutil.THP() {
		t.Skip("this kernel has no transparent huge pages")
	}
	ct := newCT(t, ConnTableConfig{Capacity: 1 << 20})
	for _, b := range []uintptr{
		uintptr(unsafe.Pointer(&ct.v4.b[len(ct.v4.b)/2])),
		uintptr(unsafe.Pointer(&ct.v6.b[len(ct.v6.b)/2])),
	} {
		flags, ok, err := benchutil.VMFlags(b)
		require.NoError(t, err)
		require.True(t, ok, "no mapping holds the table")
		require.Contains(t, flags, "hg", "VmFlags: %v", flags)
	}
}
