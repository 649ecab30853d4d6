//go:build amd64 || arm64

package flow

import "unsafe"

// ctPrefetch3 asks the CPU to bring the cache lines at a, b and c into
// every level of its cache (PREFETCHT0 on amd64, PRFM PLDL1KEEP on arm64)
// and returns at once: unlike a load, a prefetch does not hold the
// instruction window until its line arrives, so the misses of a whole
// batch of connection-table queries are in flight together. The
// addresses are only hints; they must point into live memory.
//
//go:noescape
func ctPrefetch3(a, b, c unsafe.Pointer)
