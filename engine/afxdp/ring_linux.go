//go:build linux

package afxdp

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is one of a socket's four single-producer single-consumer rings,
// mapped from the kernel. One side owns the producer index, the other the
// consumer index; each side reads the other's index with an atomic load
// (acquire) and publishes its own with an atomic store (release), so
// descriptor writes are visible before the index that covers them.
//
// Both sides keep cached copies. A producer caches the consumer index plus
// the ring size, so cachedCons-cachedProd is the free slot count with no
// arithmetic on the wrap; it refreshes the cache only when the cached count
// is too small for the batch at hand. A consumer refreshes its cached
// producer the same way. The shared indices are therefore touched about
// once per batch, not once per descriptor.
type ring[T uint64 | unix.XDPDesc] struct {
	prod, cons *atomic.Uint32
	flags      *atomic.Uint32
	descs      []T
	mask       uint32

	cachedProd, cachedCons uint32

	mem []byte // the mapping, for munmap
}

// mapRing maps ring pgoff of fd with n entries laid out as off says.
func mapRing[T uint64 | unix.XDPDesc](fd int, pgoff int64, n int, off *unix.XDPRingOffset, producer bool) (ring[T], error) {
	var zero T
	size := int(off.Desc) + n*int(unsafe.Sizeof(zero))
	mem, err := unix.Mmap(fd, pgoff, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return ring[T]{}, err
	}
	r := newRing[T](mem, n, off, producer)
	r.mem = mem
	return r, nil
}

// newRing lays a ring of n entries over mem as off says; producer tells
// which side of the ring this process is.
func newRing[T uint64 | unix.XDPDesc](mem []byte, n int, off *unix.XDPRingOffset, producer bool) ring[T] {
	base := unsafe.Pointer(&mem[0])
	r := ring[T]{
		prod:  (*atomic.Uint32)(unsafe.Add(base, off.Producer)),
		cons:  (*atomic.Uint32)(unsafe.Add(base, off.Consumer)),
		flags: (*atomic.Uint32)(unsafe.Add(base, off.Flags)),
		descs: unsafe.Slice((*T)(unsafe.Add(base, off.Desc)), n),
		mask:  uint32(n - 1),
	}
	r.cachedProd = r.prod.Load()
	r.cachedCons = r.cons.Load()
	if producer {
		r.cachedCons += uint32(n)
	}
	return r
}

// unmap releases the mapping.
func (r *ring[T]) unmap() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
	}
	*r = ring[T]{}
}

// freeSlots returns how many slots a producer may fill (at least want if
// the ring has them), reloading the consumer index only when the cached
// count is short.
func (r *ring[T]) freeSlots(want uint32) uint32 {
	if free := r.cachedCons - r.cachedProd; free >= want {
		return free
	}
	r.cachedCons = r.cons.Load() + uint32(len(r.descs))
	return r.cachedCons - r.cachedProd
}

// put writes the i-th descriptor after the cached producer index.
func (r *ring[T]) put(i uint32, d T) { r.descs[(r.cachedProd+i)&r.mask] = d }

// produce advances the cached producer index by n; submit publishes it.
func (r *ring[T]) produce(n uint32) { r.cachedProd += n }

// submit publishes the cached producer index to the kernel.
func (r *ring[T]) submit() { r.prod.Store(r.cachedProd) }

// unconsumed reports whether the kernel has not yet consumed everything
// this producer published.
func (r *ring[T]) unconsumed() bool { return r.cons.Load() != r.cachedProd }

// available returns how many entries a consumer may read, at most want,
// reloading the producer index only when the cached count is short.
func (r *ring[T]) available(want uint32) uint32 {
	n := r.cachedProd - r.cachedCons
	if n < want {
		r.cachedProd = r.prod.Load()
		n = r.cachedProd - r.cachedCons
	}
	return min(n, want)
}

// at returns a pointer to the i-th entry after the cached consumer index.
func (r *ring[T]) at(i uint32) *T { return &r.descs[(r.cachedCons+i)&r.mask] }

// release gives n consumed entries back to the kernel.
func (r *ring[T]) release(n uint32) {
	r.cachedCons += n
	r.cons.Store(r.cachedCons)
}

// needWakeup reports whether the kernel asked to be woken up
// (XDP_RING_NEED_WAKEUP).
func (r *ring[T]) needWakeup() bool { return r.flags.Load()&unix.XDP_RING_NEED_WAKEUP != 0 }
