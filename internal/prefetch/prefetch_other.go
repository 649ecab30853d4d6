//go:build !amd64 && !arm64

package prefetch

import (
	"sync/atomic"
	"unsafe"
)

// Lines4 brings the four cache lines from p in with loads (an atomic load
// is one the compiler keeps). On amd64 and arm64 it is four prefetch
// instructions.
func Lines4(p unsafe.Pointer) {
	for i := uintptr(0); i < 4; i++ {
		(*atomic.Uint32)(unsafe.Add(p, i*64)).Load()
	}
}
