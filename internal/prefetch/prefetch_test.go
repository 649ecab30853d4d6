package prefetch

import (
	"testing"
	"unsafe"
)

// TestPrefetch runs the prefetches over a block: a prefetch changes no memory and
// does not fault on live memory.
func TestPrefetch(t *testing.T) {
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = byte(i)
	}
	for off := 0; off+256 <= len(buf); off += 64 {
		Three(unsafe.Pointer(&buf[off]), unsafe.Pointer(&buf[off+64]), unsafe.Pointer(&buf[off+128]))
		Frame(unsafe.Pointer(&buf[off+64]))
		Pairs([]uintptr{uintptr(unsafe.Pointer(&buf[off])), uintptr(unsafe.Pointer(&buf[off+128]))})
	}
	Pairs(nil)
	for i := range buf {
		if buf[i] != byte(i) {
			t.Fatalf("byte %d changed", i)
		}
	}
}
