package engine

import (
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// MaxBatch is the largest number of packets in a Batch.
const MaxBatch = 64

// DefaultHeadroom is the room ports leave in front of a received frame, so
// that encapsulation (VXLAN over IPv6 needs 14+40+8+8 = 70 bytes) never has
// to move the frame. AF_XDP adds its own XDP_PACKET_HEADROOM on top.
const DefaultHeadroom = 128

// Verdict is what happens to a packet at the end of the pipeline.
type Verdict uint8

const (
	// VerdictTX sends the packet on Packet.OutPort. It is the zero value: a
	// received packet is forwarded unless a stage says otherwise.
	VerdictTX Verdict = iota
	// VerdictDrop discards the packet; Packet.Reason says why.
	VerdictDrop
	// VerdictEmit sends the packet on OutPort at once: the stage that set
	// it (Batch.Emit) finished the packet — an ICMP reply, say — and the
	// later stages do not see it.
	VerdictEmit
)

// Packet flags, set by the parser and by stages (FlagICMPError, FlagNewFlow,
// FlagOutbound).
const (
	FlagIPv4         uint16 = 1 << iota // L3 is IPv4
	FlagIPv6                            // L3 is IPv6
	FlagFragment                        // L3 header says the packet is a fragment
	FlagNonFirstFrag                    // a fragment without the L4 header (no ports)
	FlagL4                              // L4Off points at a validated TCP/UDP/ICMP header
	FlagICMPError                       // an ICMP error whose Key is the quoted flow, reversed (balance.ICMP)
	FlagNewFlow                         // the packet placed a new flow (balance: a connection-table miss)
	FlagOutbound                        // a packet of a source-NATed outbound connection, translated (nat.SNAT)
)

// Packet is one frame and the metadata the stages share about it. The engine
// owns Packet values and reuses them batch after batch: a stage must not keep
// a pointer to a Packet or its bytes after it returns.
type Packet struct {
	buf []byte // the whole buffer the frame lives in
	off int    // start of the frame in buf
	n   int    // frame length

	owner Port   // the port whose buffer this is
	frame uint64 // the owner's handle for the buffer (e.g. a UMEM address)
	sent  bool   // a port took the frame (transmitted zero-copy)

	// InPort is the index of the port the packet arrived on; OutPort the
	// index of the port it leaves on (defaults to InPort).
	InPort, OutPort uint16
	Verdict         Verdict
	Reason          DropReason

	// Set by the parser (Parse). Offsets are relative to Data().
	Flags     uint16
	EtherType uint16 // after any VLAN tags
	L3Off     uint16
	L4Off     uint16 // valid when Flags&FlagL4 != 0
	L4Proto   uint8
	// TCPFlags is the TCP header's flags byte (header.TCPFlagFin …
	// TCPFlagCwr) of a packet with FlagL4 and L4Proto TCP, as parsed;
	// 0 otherwise. StateClass reads it.
	TCPFlags uint8
	Key      flow.Key // the flow key (VNI as given to Parse)

	// Hash is the flow hash a stage computed (used e.g. as the VXLAN source
	// port for ECMP entropy).
	Hash uint64
	// Rule and Backend record the balancing decision for later stages.
	// Before it, Rule may hold a stage's guess that the balancing stage
	// checks before taking (the Mux's uplink VNI stage leaves the rule it
	// found: flow.Snapshot.LookupHint).
	Rule    *flow.Rule
	Backend int32
}

// Data returns the frame bytes. The slice aliases the port's buffer.
func (p *Packet) Data() []byte { return p.buf[p.off : p.off+p.n : len(p.buf)] }

// Len returns the frame length.
func (p *Packet) Len() int { return p.n }

// Headroom returns how many bytes Prepend can still add in front.
func (p *Packet) Headroom() int { return p.off }

// Tailroom returns how many bytes the frame can grow at its end.
func (p *Packet) Tailroom() int { return len(p.buf) - p.off - p.n }

// Prepend grows the frame by n bytes at the front and returns the new
// frame; its first n bytes are for the caller to fill. It returns nil,
// false when the headroom is too small. Offsets set by the parser are not
// adjusted: they describe the frame as parsed.
func (p *Packet) Prepend(n int) ([]byte, bool) {
	if n < 0 || n > p.off {
		return nil, false
	}
	p.off -= n
	p.n += n
	return p.Data(), true
}

// Reframe moves the frame's start by d bytes — back into the headroom
// when d is negative, as Prepend(-d) does, forward when it is positive
// (as TrimFront(d) does, or further, to anywhere in the buffer) — sets
// its length to n, and returns the new frame. It returns nil, false and
// changes nothing when the frame would leave the buffer. It is
// Prepend or TrimFront and SetLen in one step, with one check, for a
// stage that rewrites a frame's front in place (the Mux's fast path
// swaps the inner frame's VLAN tags for its tunnel headers). Offsets set
// by the parser are not adjusted.
func (p *Packet) Reframe(d, n int) ([]byte, bool) {
	off := p.off + d
	if off < 0 || n < 0 || n > len(p.buf)-off {
		return nil, false
	}
	p.off, p.n = off, n
	return p.buf[off : off+n : len(p.buf)], true
}

// TrimFront removes n bytes from the front of the frame (decapsulation).
func (p *Packet) TrimFront(n int) bool {
	if n < 0 || n > p.n {
		return false
	}
	p.off += n
	p.n -= n
	return true
}

// SetLen sets the frame length, within the buffer.
func (p *Packet) SetLen(n int) bool {
	if n < 0 || p.off+n > len(p.buf) {
		return false
	}
	p.n = n
	return true
}

// Owner returns the port whose buffer holds the frame, and its handle.
func (p *Packet) Owner() (Port, uint64) { return p.owner, p.frame }

// SetBuffer points the packet at a frame of n bytes starting at off in buf,
// owned by port with the given handle, and resets all metadata. Port
// implementations call it from Receive; inPort is the receiving port's index.
func (p *Packet) SetBuffer(owner Port, frame uint64, buf []byte, off, n int, inPort uint16) {
	// Field by field: a composite literal assigned through the pointer is
	// built on the stack and copied (a store-forwarding stall, and a
	// write-barrier move), which profiles showed at 16% of a pipeline.
	p.buf, p.off, p.n = buf, off, n
	p.owner, p.frame, p.sent = owner, frame, false
	p.InPort, p.OutPort = inPort, inPort
	p.Verdict, p.Reason = VerdictTX, 0
	p.Flags, p.EtherType, p.L3Off, p.L4Off, p.L4Proto, p.TCPFlags = 0, 0, 0, 0, 0, 0
	p.Key = flow.Key{}
	p.Hash, p.Rule, p.Backend = 0, nil, -1
}

// MarkSent records that a port took the frame itself (zero-copy transmit),
// so the worker must not release it. Ports call it from Transmit.
func (p *Packet) MarkSent() { p.sent = true }

// Sent reports whether a port took the frame.
func (p *Packet) Sent() bool { return p.sent }

// L3 returns the frame from the L3 header on.
func (p *Packet) L3() []byte { return p.Data()[p.L3Off:] }

// L4 returns the frame from the L4 header on (valid when Flags has FlagL4),
// Ethernet padding and any trailer included; L4Segment stops where the IP
// datagram ends.
func (p *Packet) L4() []byte { return p.Data()[p.L4Off:] }

// L4Segment returns the transport segment: from the L4 header to the end
// of the IP datagram its IP header declares, without Ethernet padding or
// trailing bytes. Valid when Flags has FlagL4 (Parse checked the lengths);
// nil when the headers no longer fit the frame.
func (p *Packet) L4Segment() []byte {
	data := p.Data()
	l3 := int(p.L3Off)
	var end int
	switch {
	case p.Flags&FlagIPv4 != 0 && l3+header.IPv4MinSize <= len(data):
		end = l3 + int(header.IPv4(data[l3:]).TotalLength())
	case p.Flags&FlagIPv6 != 0 && l3+header.IPv6Size <= len(data):
		end = l3 + header.IPv6Size + int(header.IPv6(data[l3:]).PayloadLength())
	default:
		return nil
	}
	if int(p.L4Off) > end || end > len(data) {
		return nil
	}
	return data[p.L4Off:end:end]
}

// StateClass returns the connection-table class p suggests for its flow:
// for TCP, untrusted for a SYN without ACK, closing for FIN or RST,
// established otherwise; any other protocol (or a packet without a parsed
// L4 header) is flow.ClassUDP. See flow.StateClass.Advance.
func (p *Packet) StateClass() flow.StateClass {
	if p.L4Proto != flow.ProtoTCP || p.Flags&FlagL4 == 0 {
		return flow.ClassUDP
	}
	f := p.TCPFlags
	switch {
	case f&(header.TCPFlagFin|header.TCPFlagRst) != 0:
		return flow.ClassClosing
	case f&header.TCPFlagSyn != 0 && f&header.TCPFlagAck == 0:
		return flow.ClassUntrusted
	}
	return flow.ClassEstablished
}
