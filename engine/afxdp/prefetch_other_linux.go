//go:build !amd64 && !arm64

package afxdp

import "unsafe"

// prefetchFrame does nothing on architectures without the prefetch
// instruction written for it (prefetch_asm_linux.go): the frame is read
// when the parser reads it.
func prefetchFrame(unsafe.Pointer) {}
