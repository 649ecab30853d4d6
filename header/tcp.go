package header

import "encoding/binary"

// TCPMinSize is the size of a TCP header without options.
const TCPMinSize = 20

// Offsets of the TCP header fields (RFC 9293).
const (
	tcpSrcPort    = 0
	tcpDstPort    = 2
	tcpSeqNum     = 4
	tcpAckNum     = 8
	tcpDataOffset = 12
	tcpFlags      = 13
	tcpWindow     = 14
	tcpChecksum   = 16
	tcpUrgent     = 18
)

// TCP flag bits as returned by TCP.Flags.
const (
	TCPFlagFin uint8 = 1 << iota
	TCPFlagSyn
	TCPFlagRst
	TCPFlagPsh
	TCPFlagAck
	TCPFlagUrg
	TCPFlagEce
	TCPFlagCwr
)

// TCP is a view of a TCP segment, header first; slice it to the IP payload.
// After Check returns nil every accessor stays within bounds.
type TCP []byte

// Check validates the framing: len(t) >= 20 else ErrTruncated; data offset
// >= 20 bytes else ErrHeaderLength; data offset <= len(t) else
// ErrTruncated. The checksum is not verified. It never panics.
func (t TCP) Check() error {
	if len(t) < TCPMinSize {
		return ErrTruncated
	}
	do := int(t[tcpDataOffset]>>4) * 4
	if do < TCPMinSize {
		return ErrHeaderLength
	}
	if do > len(t) {
		return ErrTruncated
	}
	return nil
}

// SrcPort returns the source port.
func (t TCP) SrcPort() uint16 { return binary.BigEndian.Uint16(t[tcpSrcPort:]) }

// DstPort returns the destination port.
func (t TCP) DstPort() uint16 { return binary.BigEndian.Uint16(t[tcpDstPort:]) }

// SetSrcPort sets the source port; the checksum is not updated.
func (t TCP) SetSrcPort(p uint16) { binary.BigEndian.PutUint16(t[tcpSrcPort:], p) }

// SetDstPort sets the destination port; the checksum is not updated.
func (t TCP) SetDstPort(p uint16) { binary.BigEndian.PutUint16(t[tcpDstPort:], p) }

// SeqNum returns the sequence number.
func (t TCP) SeqNum() uint32 { return binary.BigEndian.Uint32(t[tcpSeqNum:]) }

// AckNum returns the acknowledgement number.
func (t TCP) AckNum() uint32 { return binary.BigEndian.Uint32(t[tcpAckNum:]) }

// SetSeqNum sets the sequence number; the checksum is not updated.
func (t TCP) SetSeqNum(v uint32) { binary.BigEndian.PutUint32(t[tcpSeqNum:], v) }

// SetAckNum sets the acknowledgement number; the checksum is not updated.
func (t TCP) SetAckNum(v uint32) { binary.BigEndian.PutUint32(t[tcpAckNum:], v) }

// DataOffset returns the header length in bytes, options included.
func (t TCP) DataOffset() int { return int(t[tcpDataOffset]>>4) * 4 }

// SetDataOffset sets the header length in bytes (a multiple of 4 from 20
// to 60), keeping the reserved bits; the checksum is not updated.
func (t TCP) SetDataOffset(n int) { t[tcpDataOffset] = byte(n/4)<<4 | t[tcpDataOffset]&0x0f }

// Flags returns the eight flag bits (TCPFlag*).
func (t TCP) Flags() uint8 { return t[tcpFlags] }

// SetFlags sets the eight flag bits; the checksum is not updated.
func (t TCP) SetFlags(f uint8) { t[tcpFlags] = f }

// Window returns the receive window field.
func (t TCP) Window() uint16 { return binary.BigEndian.Uint16(t[tcpWindow:]) }

// SetWindow sets the receive window field; the checksum is not updated.
func (t TCP) SetWindow(v uint16) { binary.BigEndian.PutUint16(t[tcpWindow:], v) }

// Checksum returns the stored checksum.
func (t TCP) Checksum() uint16 { return binary.BigEndian.Uint16(t[tcpChecksum:]) }

// SetChecksum stores the checksum.
func (t TCP) SetChecksum(v uint16) { binary.BigEndian.PutUint16(t[tcpChecksum:], v) }

// UrgentPointer returns the urgent pointer field.
func (t TCP) UrgentPointer() uint16 { return binary.BigEndian.Uint16(t[tcpUrgent:]) }

// Options returns the option bytes in place.
func (t TCP) Options() []byte { return t[TCPMinSize:t.DataOffset()] }

// Payload returns the data after the header, t[DataOffset():], in place.
func (t TCP) Payload() []byte { return t[t.DataOffset():] }

// CalculateChecksum returns the checksum to store for the whole of t
// (header and data), skipping the checksum field. pseudo is
// PseudoHeaderChecksum(ProtoTCP, src, dst, uint16(len(t))).
func (t TCP) CalculateChecksum(pseudo uint16) uint16 {
	return ^Checksum(t[tcpChecksum+2:], Checksum(t[:tcpChecksum], pseudo))
}

// IsChecksumValid reports whether the stored checksum verifies over t with
// the given pseudo-header sum.
func (t TCP) IsChecksumValid(pseudo uint16) bool { return Checksum(t, pseudo) == 0xffff }

// UpdateChecksumPseudoHeaderAddress updates the checksum for an address in
// the pseudo-header changing from old to new (4 or 16 bytes each).
func (t TCP) UpdateChecksumPseudoHeaderAddress(old, new []byte) {
	t.SetChecksum(ChecksumUpdate(t.Checksum(), old, new))
}

// SetSrcPortWithChecksumUpdate sets the source port and updates the
// checksum incrementally (RFC 1624).
func (t TCP) SetSrcPortWithChecksumUpdate(p uint16) { t.setPortWithChecksumUpdate(tcpSrcPort, p) }

// SetDstPortWithChecksumUpdate sets the destination port and updates the
// checksum incrementally (RFC 1624).
func (t TCP) SetDstPortWithChecksumUpdate(p uint16) { t.setPortWithChecksumUpdate(tcpDstPort, p) }

func (t TCP) setPortWithChecksumUpdate(off int, p uint16) {
	old := binary.BigEndian.Uint16(t[off:])
	binary.BigEndian.PutUint16(t[off:], p)
	t.SetChecksum(ChecksumUpdate16(t.Checksum(), old, p))
}
