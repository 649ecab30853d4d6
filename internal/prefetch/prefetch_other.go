//go:build !amd64 && !arm64

package prefetch

import (
	"sync/atomic"
	"unsafe"
)

// TwoPairs brings the two cache lines from a and the two from b in with
// loads (an atomic load is one the compiler keeps). On amd64 and arm64 it
// is four prefetch instructions.
func TwoPairs(a, b unsafe.Pointer) {
	(*atomic.Uint32)(a).Load()
	(*atomic.Uint32)(unsafe.Add(a, 64)).Load()
	(*atomic.Uint32)(b).Load()
	(*atomic.Uint32)(unsafe.Add(b, 64)).Load()
}

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
