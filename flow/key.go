package flow

import (
	"encoding/binary"
	"net/netip"
)

// Key identifies a flow: the tenant (VNI), the transport protocol and both
// endpoints. It is a packed, comparable value made only of fixed-size fields
// (no pointers), so it can be copied, compared with ==, used as a map key and
// hashed without allocating. An IPv4 address is stored in the first four
// bytes of its 16-byte field and Family says which family the key holds;
// the unused bytes are always zero, so two keys for the same flow are equal.
//
// Tailscale's flowtrack notes that netip.AddrPort keys were about twice as
// slow as fixed arrays; this is the same trade.
type Key struct {
	Src     [16]byte
	Dst     [16]byte
	VNI     uint32 // 24-bit VXLAN network identifier (tenant); 0 for none
	SrcPort uint16
	DstPort uint16
	Proto   uint8 // IP protocol number (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6)
	Family  uint8 // 4 or 6; 0 means the zero (invalid) key
}

// Address families stored in Key.Family.
const (
	FamilyIPv4 = 4
	FamilyIPv6 = 6
)

// IP protocol numbers used across xdplb.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58
)

// SetIPv4 fills k with an IPv4 flow. src and dst must be 4 bytes long.
// It is the allocation-free constructor the data path uses.
func (k *Key) SetIPv4(vni uint32, proto uint8, src, dst []byte, sport, dport uint16) {
	// Field by field rather than *k = Key{...}: see SetBuffer in engine.
	k.Src, k.Dst = [16]byte{}, [16]byte{}
	copy(k.Src[:4], src[:4])
	copy(k.Dst[:4], dst[:4])
	k.VNI, k.Proto, k.Family, k.SrcPort, k.DstPort = vni, proto, FamilyIPv4, sport, dport
}

// SetIPv6 fills k with an IPv6 flow. src and dst must be 16 bytes long.
func (k *Key) SetIPv6(vni uint32, proto uint8, src, dst []byte, sport, dport uint16) {
	copy(k.Src[:], src[:16])
	copy(k.Dst[:], dst[:16])
	k.VNI, k.Proto, k.Family, k.SrcPort, k.DstPort = vni, proto, FamilyIPv6, sport, dport
}

// KeyFrom builds a Key from netip values; it is meant for configuration,
// tests and examples, not the data path. Both addresses must be of the same
// family (IPv4-mapped IPv6 addresses are unmapped first).
func KeyFrom(vni uint32, proto uint8, src, dst netip.AddrPort) Key {
	var k Key
	s, d := src.Addr().Unmap(), dst.Addr().Unmap()
	if s.Is4() {
		a, b := s.As4(), d.As4()
		k.SetIPv4(vni, proto, a[:], b[:], src.Port(), dst.Port())
	} else {
		a, b := s.As16(), d.As16()
		k.SetIPv6(vni, proto, a[:], b[:], src.Port(), dst.Port())
	}
	return k
}

// IsValid reports whether k holds a flow (its Family is set).
func (k Key) IsValid() bool { return k.Family == FamilyIPv4 || k.Family == FamilyIPv6 }

// Reverse returns the key of the opposite direction of the same flow.
func (k Key) Reverse() Key {
	k.Src, k.Dst = k.Dst, k.Src
	k.SrcPort, k.DstPort = k.DstPort, k.SrcPort
	return k
}

// SrcAddr returns the source address as a netip.Addr (for logs and tests).
func (k Key) SrcAddr() netip.Addr { return k.addr(&k.Src) }

// DstAddr returns the destination address as a netip.Addr.
func (k Key) DstAddr() netip.Addr { return k.addr(&k.Dst) }

func (k *Key) addr(a *[16]byte) netip.Addr {
	if k.Family == FamilyIPv4 {
		return netip.AddrFrom4([4]byte(a[:4]))
	}
	return netip.AddrFrom16(*a)
}

// String formats k as "vni/proto src:port->dst:port"; not for the data path.
func (k Key) String() string {
	return "vni=" + itoa(uint64(k.VNI)) + " proto=" + itoa(uint64(k.Proto)) + " " +
		netip.AddrPortFrom(k.SrcAddr(), k.SrcPort).String() + "->" +
		netip.AddrPortFrom(k.DstAddr(), k.DstPort).String()
}

func itoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}

// keyBytes is the canonical wire form of a Key that hashing reads: fixed
// layout, big-endian numbers, independent of the machine's byte order, so
// every Mux of a fleet computes the same hash for the same flow.
const keyBytes = 16 + 16 + 2 + 2 + 4 + 1 + 1

// put writes the canonical form of k into b (len(b) >= keyBytes).
func (k *Key) put(b []byte) {
	copy(b[0:16], k.Src[:])
	copy(b[16:32], k.Dst[:])
	binary.BigEndian.PutUint16(b[32:], k.SrcPort)
	binary.BigEndian.PutUint16(b[34:], k.DstPort)
	binary.BigEndian.PutUint32(b[36:], k.VNI)
	b[40] = k.Proto
	b[41] = k.Family
}
