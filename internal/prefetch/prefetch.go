// Package prefetch asks the CPU to bring memory into its caches ahead of
// use, so that the cache misses of a whole batch of lookups are in flight
// together instead of one after another: the data path computes where
// each packet's lookup will go, prefetches it, and only then looks.
//
// Go has no prefetch intrinsic; on amd64 and arm64 the functions are one
// instruction per line (PREFETCHT0, PRFM PLDL1KEEP) in assembly, and
// return at once; elsewhere Three loads a word of each line (its
// addresses must point into live memory), and Frame and Pairs do
// nothing. Used by the connection table (Three), the AF_XDP port at
// receive (Frame) and the Mux's fast path (Pairs).
package prefetch
