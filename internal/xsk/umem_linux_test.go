//go:build linux

package xsk

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/internal/lab/benchutil"
)

// TestMapUMEM checks the UMEM's mapping: the size asked for, zeroed and
// writable; from one huge page up, starting on a huge-page boundary in a
// mapping advised for transparent huge pages (the "hg" VmFlag in
// /proc/self/smaps, which is there whatever THP mode the system runs:
// whether the kernel then backs it with huge pages is the system's
// business); smaller UMEMs as they are.
func TestMapUMEM(t *testing.T) {
	for _, tc := range []struct {
		size int
		huge bool
	}{
		{64 << 10, false},
		{2 << 20, true},
		{8 << 20, true},
		// Since Linux 6.7 the kernel itself aligns anonymous mappings
		// whose length is a multiple of 2 MiB, so the cases above pass
		// without mapUMEM's alignment; this one does not.
		{8<<20 + 4096, true},
	} {
		t.Run(fmt.Sprint(tc.size), func(t *testing.T) {
			mapping, umem, err := mapUMEM(tc.size)
			require.NoError(t, err)
			defer func() { require.NoError(t, unix.Munmap(mapping)) }()
			require.Len(t, umem, tc.size)
			require.Equal(t, tc.size, cap(umem))
			a := uintptr(unsafe.Pointer(&umem[0]))
			m := uintptr(unsafe.Pointer(&mapping[0]))
			require.True(t, a >= m && a+uintptr(tc.size) <= m+uintptr(len(mapping)), "the UMEM lies in its mapping")
			require.Zero(t, umem[0]|umem[tc.size-1])
			umem[0], umem[tc.size-1] = 1, 2
			flags, ok, err := benchutil.VMFlags(a)
			require.NoError(t, err)
			require.True(t, ok, "no mapping holds the UMEM")
			switch {
			case !tc.huge:
				require.NotContains(t, flags, "hg")
			case benchutil.THP():
				require.Contains(t, flags, "hg", "UMEM not advised for huge pages: VmFlags %v", flags)
				fallthrough
			default:
				require.Zero(t, a%hugePageSize, "UMEM at %#x: not on a huge-page boundary", a)
			}
		})
	}
}
