//go:build !amd64 && !arm64

package flow

import (
	"sync/atomic"
	"unsafe"
)

// ctPrefetch3 brings the cache lines at a, b and c in with loads (Go has
// no portable prefetch; an atomic load is one the compiler keeps). On
// amd64 and arm64 it is a prefetch instruction (prefetch_asm.go).
func ctPrefetch3(a, b, c unsafe.Pointer) {
	(*atomic.Uint64)(a).Load()
	(*atomic.Uint64)(b).Load()
	(*atomic.Uint64)(c).Load()
}
