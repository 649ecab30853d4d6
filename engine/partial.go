package engine

import (
	"sync/atomic"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// PartialChecksums is the stage that completes the partial TCP and UDP
// checksums of frames sent from the same machine, so that they leave the
// data path with checksums their receiver accepts.
//
// Senders on a veth or a tap (containers, VMs over virtio-net, any process
// on the machine) offload the transport checksum: the frame carries only
// the pseudo-header sum, and the receiving kernel trusts its own skb flag,
// which an XDP program and an AF_XDP socket never see. Forwarded,
// encapsulated or translated by a data plane, such a frame reaches a
// kernel that verifies the checksum and drops it (TcpInCsumErrors). This
// stage finds those frames with header.CompletePartialChecksum — the
// checksum field equals the folded pseudo-header sum while the whole
// checksum does not verify — and completes them in one pass over the
// segment, before any stage rewrites addresses or ports. Every other frame
// is left as it is: a wrong checksum is never repaired, and the
// incremental rewrites of later stages keep it wrong. Frames from real
// NICs carry complete checksums; for them the stage costs one
// pseudo-header sum per TCP/UDP packet.
//
// It runs after Parse (or a stage that parsed the inner frame, such as
// VXLAN decapsulation) and needs FlagL4; fragments are skipped (a sender
// completes the checksum before it fragments). Completed frames are counted
// (Completed), per worker, summed on read. It allocates nothing.
//
// One PartialChecksums per input (port) gives per-port counts; it is safe
// for concurrent use by the workers of one Engine.
type PartialChecksums struct {
	counts PerWorker[partialCount]
	other  atomic.Uint64 // batches made outside a worker (no index)
}

type partialCount struct {
	n atomic.Uint64
	_ [56]byte // a cache line of its own
}

// NewPartialChecksums returns the stage.
func NewPartialChecksums() *PartialChecksums { return &PartialChecksums{} }

// Process implements Stage.
func (s *PartialChecksums) Process(b *Batch) {
	var n uint64
	for _, p := range b.Packets() {
		if p.Flags&(FlagL4|FlagFragment) != FlagL4 || p.L4Proto != flow.ProtoTCP && p.L4Proto != flow.ProtoUDP {
			continue
		}
		if completePartial(p) {
			n++
		}
	}
	if n == 0 {
		return
	}
	if c := s.counts.Get(b.Worker); c != nil {
		c.n.Add(n)
	} else {
		s.other.Add(n)
	}
}

// completePartial completes p's checksum if it is partial.
func completePartial(p *Packet) bool {
	seg := p.L4Segment()
	if seg == nil {
		return false
	}
	l3 := p.L3()
	var src, dst []byte
	if p.Flags&FlagIPv4 != 0 {
		ip := header.IPv4(l3)
		src, dst = ip[12:16], ip[16:20]
	} else {
		src, dst = l3[8:24], l3[24:40]
	}
	return header.CompletePartialChecksum(p.L4Proto, src, dst, seg) == header.PartialCompleted
}

// Completed returns how many frames the stage completed, over all workers.
func (s *PartialChecksums) Completed() uint64 {
	t := s.other.Load()
	s.counts.Range(func(_ int, c *partialCount) bool {
		t += c.n.Load()
		return true
	})
	return t
}
