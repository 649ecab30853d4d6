package header

import "encoding/binary"

// VXLAN sizes and the IANA port (RFC 7348).
const (
	VXLANSize = 8
	VXLANPort = 4789
)

// VXLANFlagVNI is the I flag: the VNI field is valid. It is the only flag
// RFC 7348 defines.
const VXLANFlagVNI = 0x08

const (
	vxlanFlags = 0
	vxlanVNI   = 4
)

// VXLAN is a view of a VXLAN header followed by the inner Ethernet frame.
// After Check returns nil every accessor stays within bounds.
type VXLAN []byte

// Check validates that len(v) >= 8 (ErrTruncated) and that the I flag is set
// (ErrFlags). Reserved bits are ignored on receive, as RFC 7348 section 5
// asks. It never panics.
func (v VXLAN) Check() error {
	if len(v) < VXLANSize {
		return ErrTruncated
	}
	if v[vxlanFlags]&VXLANFlagVNI == 0 {
		return ErrFlags
	}
	return nil
}

// Flags returns the flags byte.
func (v VXLAN) Flags() uint8 { return v[vxlanFlags] }

// VNI returns the 24-bit VXLAN network identifier.
func (v VXLAN) VNI() uint32 { return binary.BigEndian.Uint32(v[vxlanVNI:]) >> 8 }

// SetVNI sets the 24-bit VNI (high bits of vni are dropped), keeping the
// reserved byte after it.
func (v VXLAN) SetVNI(vni uint32) {
	_ = v[vxlanVNI+2]
	v[vxlanVNI] = byte(vni >> 16)
	v[vxlanVNI+1] = byte(vni >> 8)
	v[vxlanVNI+2] = byte(vni)
}

// Encode writes an 8-byte header: I flag set, reserved bits zero, vni.
func (v VXLAN) Encode(vni uint32) {
	_ = v[VXLANSize-1]
	binary.BigEndian.PutUint32(v[0:], VXLANFlagVNI<<24)
	binary.BigEndian.PutUint32(v[vxlanVNI:], vni<<8)
}

// Payload returns the inner Ethernet frame, v[8:], in place.
func (v VXLAN) Payload() []byte { return v[VXLANSize:] }
