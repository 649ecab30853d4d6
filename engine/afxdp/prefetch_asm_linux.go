//go:build amd64 || arm64

package afxdp

import "unsafe"

// prefetchFrame asks the CPU for the cache line at p, a received frame's
// first bytes, the line in front of it, where an encapsulating stage
// writes its outer headers, and the line after it, where a VXLAN frame's
// inner headers start (PREFETCHT0 on amd64, PRFM PLDL1KEEP on arm64),
// and returns at once. Receive calls it for every frame of a
// batch before any stage runs, so the batch's misses on frames the
// kernel (or a NIC) has just written overlap instead of stalling the
// parser one frame at a time. It never faults: the addresses are hints.
//
//go:noescape
func prefetchFrame(p unsafe.Pointer)
