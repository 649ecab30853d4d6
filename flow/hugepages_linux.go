package flow

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ctHugePageSize is the transparent huge page size ctHugePages asks for
// (x86-64 and arm64 with 4 KiB base pages).
const ctHugePageSize = 2 << 20

// ctHugePages asks the kernel to back the whole 2 MiB pages inside
// [p, p+size) with transparent huge pages (madvise MADV_HUGEPAGE), which
// systems whose THP mode is "madvise" (a common default) do only when
// asked. A connection table of a million flows spans tens of megabytes
// that lookups touch at random: with 4 KiB pages nearly every lookup
// also misses the TLB and walks the page tables. It is advice: an error
// (no THP in the kernel) changes nothing but speed.
func ctHugePages(p unsafe.Pointer, size uintptr) {
	start := (uintptr(p) + ctHugePageSize - 1) &^ (ctHugePageSize - 1)
	end := (uintptr(p) + size) &^ (ctHugePageSize - 1)
	if end <= start {
		return
	}
	_ = unix.Madvise(unsafe.Slice((*byte)(unsafe.Add(p, start-uintptr(p))), end-start), unix.MADV_HUGEPAGE)
}
