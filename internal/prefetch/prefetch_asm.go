//go:build amd64 || arm64

package prefetch

import "unsafe"

// TwoPairs prefetches the two cache lines from a and the two from b
// (two 128-byte blocks, each 64-byte aligned for two lines).
//
//go:noescape
func TwoPairs(a, b unsafe.Pointer)

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
