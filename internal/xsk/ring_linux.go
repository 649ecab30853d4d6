//go:build linux

package xsk

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Desc is what a ring holds: UMEM addresses (fill and completion rings) or
// descriptors (RX and TX rings).
type Desc interface{ uint64 | unix.XDPDesc }

// Ring is one of a socket's four single-producer single-consumer rings,
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
type Ring[T Desc] struct {
	prod, cons *atomic.Uint32
	flags      *atomic.Uint32
	descs      []T
	mask       uint32

	cachedProd, cachedCons uint32

	mem []byte // the mapping, for munmap
}

// MapRing maps ring pgoff of fd with n entries laid out as off says.
func MapRing[T Desc](fd int, pgoff int64, n int, off *unix.XDPRingOffset, producer bool) (Ring[T], error) {
	var zero T
	size := int(off.Desc) + n*int(unsafe.Sizeof(zero))
	mem, err := unix.Mmap(fd, pgoff, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return Ring[T]{}, err
	}
	r := NewRing[T](mem, n, off, producer)
	r.mem = mem
	return r, nil
}

// NewRing lays a ring of n entries over mem as off says; producer tells
// which side of the ring this process is. Tests lay rings over Go memory
// to play the kernel's side.
func NewRing[T Desc](mem []byte, n int, off *unix.XDPRingOffset, producer bool) Ring[T] {
	base := unsafe.Pointer(&mem[0])
	r := Ring[T]{
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

// Size is the number of entries.
func (r *Ring[T]) Size() uint32 { return r.mask + 1 }

// Unmap releases the mapping (of a ring made by MapRing).
func (r *Ring[T]) Unmap() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
	}
	*r = Ring[T]{}
}

// FreeSlots returns how many slots a producer may fill (at least want if
// the ring has them), reloading the consumer index only when the cached
// count is short.
func (r *Ring[T]) FreeSlots(want uint32) uint32 {
	if free := r.cachedCons - r.cachedProd; free >= want {
		return free
	}
	r.cachedCons = r.cons.Load() + uint32(len(r.descs))
	return r.cachedCons - r.cachedProd
}

// Put writes the i-th descriptor after the cached producer index.
func (r *Ring[T]) Put(i uint32, d T) { r.descs[(r.cachedProd+i)&r.mask] = d }

// Produce advances the cached producer index by n; Submit publishes it.
func (r *Ring[T]) Produce(n uint32) { r.cachedProd += n }

// Submit publishes the cached producer index to the kernel.
func (r *Ring[T]) Submit() { r.prod.Store(r.cachedProd) }

// Unconsumed reports whether the kernel has not yet consumed everything
// this producer published.
func (r *Ring[T]) Unconsumed() bool { return r.cons.Load() != r.cachedProd }

// Available returns how many entries a consumer may read, at most want,
// reloading the producer index only when the cached count is short.
func (r *Ring[T]) Available(want uint32) uint32 {
	n := r.cachedProd - r.cachedCons
	if n < want {
		r.cachedProd = r.prod.Load()
		n = r.cachedProd - r.cachedCons
	}
	return min(n, want)
}

// At returns a pointer to the i-th entry after the cached consumer index.
func (r *Ring[T]) At(i uint32) *T { return &r.descs[(r.cachedCons+i)&r.mask] }

// Release gives n consumed entries back to the kernel.
func (r *Ring[T]) Release(n uint32) {
	r.cachedCons += n
	r.cons.Store(r.cachedCons)
}

// NeedWakeup reports whether the kernel asked to be woken up
// (XDP_RING_NEED_WAKEUP).
func (r *Ring[T]) NeedWakeup() bool { return r.flags.Load()&unix.XDP_RING_NEED_WAKEUP != 0 }

// GoRingMem lays out a ring of n entries of size esz in Go memory the way
// the kernel does (indices and flags on their own cache lines), both
// indices at start, and returns it with the offsets for NewRing: for
// tests that play the kernel's side of a ring.
func GoRingMem(n, esz int, start uint32) ([]byte, *unix.XDPRingOffset) {
	off := &unix.XDPRingOffset{Producer: 0, Consumer: 64, Flags: 128, Desc: 192}
	words := make([]uint64, (192+n*esz)/8+1)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	*(*uint32)(unsafe.Pointer(&mem[0])) = start
	*(*uint32)(unsafe.Pointer(&mem[64])) = start
	return mem, off
}
