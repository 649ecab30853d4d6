//go:build amd64 || arm64

package prefetch

import "unsafe"

// Pairs prefetches the two cache lines from each address of addrs
// (128-byte blocks, 64-byte aligned), for a whole batch in one call, so
// that a batch's prefetches cost no call each. The addresses must point
// into memory the caller keeps alive.
//
//go:noescape
func Pairs(addrs []uintptr)

// Three prefetches the cache lines at a, b and c (the connection table:
// a key's two buckets, the first one's second line).
//
//go:noescape
func Three(a, b, c unsafe.Pointer)

// Frame prefetches the cache line at p, a received frame's first bytes,
// the line in front of it, where an encapsulating stage writes its outer
// headers, and the line after it, where a VXLAN frame's inner headers
// start. p-64 and p+64 need not be mapped: a prefetch never faults.
//
//go:noescape
func Frame(p unsafe.Pointer)
