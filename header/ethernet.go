package header

import "encoding/binary"

// MAC is an IEEE 802 MAC-48 address, comparable and copyable.
type MAC [6]byte

// String formats m as six colon-separated lower-case hex octets
// ("02:00:5e:10:00:01"). It allocates; it is for logs, not the data path.
func (m MAC) String() string {
	const hexdigits = "0123456789abcdef"
	var buf [17]byte
	for i, b := range m {
		if i > 0 {
			buf[3*i-1] = ':'
		}
		buf[3*i] = hexdigits[b>>4]
		buf[3*i+1] = hexdigits[b&0xf]
	}
	return string(buf[:])
}

// IsBroadcast reports whether m is ff:ff:ff:ff:ff:ff.
func (m MAC) IsBroadcast() bool { return m == MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} }

// IsMulticast reports whether the group bit of m is set (broadcast
// included).
func (m MAC) IsMulticast() bool { return m[0]&1 != 0 }

// EtherType values.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeARP  = 0x0806
	EtherTypeVLAN = 0x8100 // IEEE 802.1Q customer tag
	EtherTypeIPv6 = 0x86DD
	EtherTypeQinQ = 0x88A8 // IEEE 802.1ad service tag
)

// Ethernet II header sizes.
const (
	EthernetSize = 14 // destination, source, EtherType
	VLANTagSize  = 4  // TCI and the next EtherType
)

const (
	ethDst  = 0
	ethSrc  = 6
	ethType = 12
)

// Ethernet is a view of an Ethernet II header: the first EthernetSize bytes
// of a frame. Accessors assume len(e) >= EthernetSize (ParseEthernet
// succeeded) and panic otherwise.
type Ethernet []byte

// Dst returns the destination MAC address.
func (e Ethernet) Dst() MAC { return MAC(e[ethDst : ethDst+6]) }

// Src returns the source MAC address.
func (e Ethernet) Src() MAC { return MAC(e[ethSrc : ethSrc+6]) }

// SetDst sets the destination MAC address.
func (e Ethernet) SetDst(m MAC) { copy(e[ethDst:ethDst+6], m[:]) }

// SetSrc sets the source MAC address.
func (e Ethernet) SetSrc(m MAC) { copy(e[ethSrc:ethSrc+6], m[:]) }

// Type returns the EtherType field at offset 12 (the TPID 0x8100 or 0x88A8
// when the frame is tagged; ParseEthernet skips tags).
func (e Ethernet) Type() uint16 { return binary.BigEndian.Uint16(e[ethType:]) }

// SetType sets the EtherType field at offset 12.
func (e Ethernet) SetType(t uint16) { binary.BigEndian.PutUint16(e[ethType:], t) }

// Encode writes a 14-byte untagged Ethernet header.
func (e Ethernet) Encode(dst, src MAC, etherType uint16) {
	_ = e[EthernetSize-1]
	copy(e[ethDst:], dst[:])
	copy(e[ethSrc:], src[:])
	binary.BigEndian.PutUint16(e[ethType:], etherType)
}

// VLANTag is a view of an 802.1Q/802.1ad tag as it follows a TPID: the
// 16-bit TCI then the inner EtherType. In a frame the first tag is at
// offset 14. Accessors assume len(v) >= VLANTagSize.
type VLANTag []byte

// TCI returns the tag control information (PCP, DEI, VID).
func (v VLANTag) TCI() uint16 { return binary.BigEndian.Uint16(v[0:]) }

// VID returns the 12-bit VLAN identifier.
func (v VLANTag) VID() uint16 { return v.TCI() & 0x0fff }

// PCP returns the 3-bit priority code point.
func (v VLANTag) PCP() uint8 { return v[0] >> 5 }

// Type returns the EtherType that follows the tag.
func (v VLANTag) Type() uint16 { return binary.BigEndian.Uint16(v[2:]) }

// maxVLANTags is how many 802.1Q/802.1ad tags ParseEthernet skips.
const maxVLANTags = 2

// ParseEthernet reads the Ethernet header at the start of frame b, skips up
// to two 802.1Q (0x8100) or 802.1ad (0x88A8) tags in any order, and returns
// the EtherType of what follows and its offset in b (14, 18 or 22). It
// returns ErrTruncated when b ends inside the header or a tag, and
// ErrExtension when a third tag follows. It does not look at the L3 bytes.
// It never panics and never allocates.
func ParseEthernet(b []byte) (etherType uint16, l3Off int, err error) {
	if len(b) < EthernetSize {
		return 0, 0, ErrTruncated
	}
	etherType = binary.BigEndian.Uint16(b[ethType:])
	l3Off = EthernetSize
	for tags := 0; etherType == EtherTypeVLAN || etherType == EtherTypeQinQ; tags++ {
		if tags == maxVLANTags {
			return 0, 0, ErrExtension
		}
		if len(b) < l3Off+VLANTagSize {
			return 0, 0, ErrTruncated
		}
		etherType = binary.BigEndian.Uint16(b[l3Off+2:])
		l3Off += VLANTagSize
	}
	return etherType, l3Off, nil
}
