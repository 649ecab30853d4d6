//go:build !linux

package flow

import "unsafe"

// ctHugePages is a no-op where transparent huge pages are not asked for
// with madvise.
func ctHugePages(unsafe.Pointer, uintptr) {}
