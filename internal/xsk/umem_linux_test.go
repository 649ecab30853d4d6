//go:build linux

package xsk

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
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
			flags := vmFlags(t, a)
			if tc.huge {
				require.Zero(t, a%hugePageSize, "UMEM at %#x: not on a huge-page boundary", a)
				require.Contains(t, flags, "hg", "UMEM not advised for huge pages: VmFlags %v", flags)
			} else {
				require.NotContains(t, flags, "hg")
			}
		})
	}
}

// vmFlags returns the VmFlags of the mapping of this process that holds
// address a, from /proc/self/smaps.
func vmFlags(t *testing.T, a uintptr) []string {
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) >= 5 && !strings.HasSuffix(f[0], ":") {
			// A mapping's first line: "lo-hi perms offset dev inode [path]".
			var lo, hi uintptr
			if _, err := fmt.Sscanf(f[0], "%x-%x", &lo, &hi); err == nil {
				in = a >= lo && a < hi
			}
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.Fields(strings.TrimPrefix(line, "VmFlags:"))
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("no mapping holds %#x", a)
	return nil
}
