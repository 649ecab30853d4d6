//go:build amd64 || arm64

package prefetch

import "unsafe"

// Lines4 prefetches the four cache lines from p: p, p+64, p+128 and
// p+192 (a 256-byte block, 64-byte aligned for four lines).
//
//go:noescape
func Lines4(p unsafe.Pointer)
