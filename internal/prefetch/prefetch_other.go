//go:build !amd64 && !arm64

package prefetch

import (
	"sync/atomic"
	"unsafe"
)

// Pairs does nothing here: the addresses are plain integers, which Go
// does not let a load go through (on amd64 and arm64 it is two prefetch
// instructions an address).
func Pairs([]uintptr) {}

// Three brings the cache lines at a, b and c in with loads. On amd64 and
// arm64 it is three prefetch instructions.
func Three(a, b, c unsafe.Pointer) {
	(*atomic.Uint32)(a).Load()
	(*atomic.Uint32)(b).Load()
	(*atomic.Uint32)(c).Load()
}

// Frame does nothing here: a load of the lines around a frame could fault
// where a prefetch would not (the frame may start its mapping), so the
// frame is read when the parser reads it.
func Frame(unsafe.Pointer) {}
