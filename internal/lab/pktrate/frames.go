package pktrate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/xdplb/xdplb/header"
)

// Frame sizes, RFC 2544 style: the Ethernet frame on the wire including its
// 4-byte FCS. The bytes handed to the interface are Size-FCSLen (a veth
// carries no FCS), so a 64-byte frame is 60 bytes in memory.
const (
	MinFrameSize = 64
	MaxFrameSize = 1518
	FCSLen       = 4
)

// Flow layout: flow i has source port FlowPortBase + i%FlowPortsPerAddr and
// source address Src + i/FlowPortsPerAddr, so a million flows use 32
// source addresses.
const (
	FlowPortBase     = 32768
	FlowPortsPerAddr = 32768
	// MaxFlows bounds FrameSpec.Flows: 64 source addresses of 32768 ports.
	MaxFlows = 64 * FlowPortsPerAddr
)

// Offsets of the fields a frame's flow changes (Ethernet + IPv4 without
// options + UDP), from the start of the (inner) test frame.
const (
	ethLen     = 14
	ipv4Len    = 20
	udpLen     = 8
	vxlanLen   = 8
	hdrsLen    = ethLen + ipv4Len + udpLen
	offIPCheck = ethLen + 10
	offIPSrc   = ethLen + 12
	offUDP     = ethLen + ipv4Len
	offUDPSrc  = offUDP
	offUDPSum  = offUDP + 6
)

// VXLAN test traffic: VXLANOverhead bytes of outer Ethernet, IPv4, UDP and
// VXLAN headers in front of the test frame; the outer UDP source port of
// flow i is VXLANSourcePort(i).
const (
	VXLANOverhead = ethLen + ipv4Len + udpLen + vxlanLen
	// VXLANPort is the IANA VXLAN port (RFC 7348).
	VXLANPort = 4789
	// MaxVXLANVNI is the largest 24-bit VNI.
	MaxVXLANVNI = 1<<24 - 1
)

// offOuterSport is where the outer UDP source port is in a VXLAN frame.
const offOuterSport = ethLen + ipv4Len

// VXLANSourcePort is the outer UDP source port of flow i's VXLAN frame: a
// multiplicative hash of i into the dynamic range 49152-65535, as a Mux
// derives it from the flow hash (RFC 7348 section 5), so that receivers
// spreading by the outer 5-tuple see the flows apart.
func VXLANSourcePort(i int) uint16 {
	return 0xc000 | uint16((uint32(i)*2654435761)>>18)
}

// ErrFrameSpec wraps every FrameSpec.Validate failure.
var ErrFrameSpec = errors.New("pktrate: invalid frame spec")

// FrameSpec describes the test traffic: IPv4/UDP frames from the generator
// to the sink, one per flow, differing only in source address and port.
// It is a plain value: Validate checks it, Frame and SetFlow write frames.
type FrameSpec struct {
	// SrcMAC and DstMAC are the Ethernet addresses (the generator's and
	// the DUT ingress interface's).
	SrcMAC, DstMAC net.HardwareAddr
	// Src is the first flow's source address; Dst the destination (the
	// sink). Both IPv4, inside the test ranges.
	Src, Dst netip.Addr
	// DstPort is the UDP destination port, the sink's match.
	DstPort uint16
	// Size is the frame size with FCS, MinFrameSize..MaxFrameSize.
	Size int
	// Flows is the number of distinct flows, 1..MaxFlows.
	Flows int
	// VXLAN, when set, encapsulates every frame in VXLAN over IPv4: the
	// frame the fields above describe becomes the inner frame (Size is
	// its size, so a frame is VXLANOverhead bytes longer on the wire), as
	// a Mux sends it to a Host Agent.
	VXLAN *VXLANSpec
}

// VXLANSpec is the outer encapsulation of VXLAN test traffic, written as
// xdplb's Mux writes it (encap.Encap): outer IPv4 with DF set, TTL 64, ID
// 0 and no options; outer UDP source port VXLANSourcePort(flow), checksum
// zero (RFC 7348 allows it over IPv4; the Mux and Linux's vxlan device
// send it so); VXLAN header with the I flag and the VNI.
type VXLANSpec struct {
	// SrcMAC and DstMAC are the outer Ethernet addresses (the sender's,
	// the receiving host's interface).
	SrcMAC, DstMAC net.HardwareAddr
	// Src and Dst are the outer IPv4 addresses: the tunnel's source (a
	// Mux) and the host's address.
	Src, Dst netip.Addr
	// Port is the outer UDP destination port (VXLANPort when 0).
	Port uint16
	// VNI is the VXLAN network identifier, 0..MaxVXLANVNI.
	VNI uint32
}

func (v *VXLANSpec) port() uint16 {
	if v.Port == 0 {
		return VXLANPort
	}
	return v.Port
}

// Validate reports what is wrong with s, wrapping ErrFrameSpec.
func (s FrameSpec) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrFrameSpec, fmt.Sprintf(format, args...))
	}
	if len(s.SrcMAC) != 6 || len(s.DstMAC) != 6 {
		return bad("MAC addresses must be 6 bytes (src %v, dst %v)", s.SrcMAC, s.DstMAC)
	}
	if !s.Src.Is4() || !s.Dst.Is4() {
		return bad("addresses must be IPv4 (src %v, dst %v)", s.Src, s.Dst)
	}
	if s.Size < MinFrameSize || s.Size > MaxFrameSize {
		return bad("frame size %d outside [%d, %d]", s.Size, MinFrameSize, MaxFrameSize)
	}
	if s.Flows < 1 || s.Flows > MaxFlows {
		return bad("%d flows outside [1, %d]", s.Flows, MaxFlows)
	}
	if s.DstPort == 0 {
		return bad("destination port 0")
	}
	if v := s.VXLAN; v != nil {
		if len(v.SrcMAC) != 6 || len(v.DstMAC) != 6 {
			return bad("outer MAC addresses must be 6 bytes (src %v, dst %v)", v.SrcMAC, v.DstMAC)
		}
		if !v.Src.Is4() || !v.Dst.Is4() {
			return bad("outer addresses must be IPv4 (src %v, dst %v)", v.Src, v.Dst)
		}
		if v.VNI > MaxVXLANVNI {
			return bad("VNI %d above %d", v.VNI, MaxVXLANVNI)
		}
		if s.Size+VXLANOverhead > MaxFrameSize {
			return bad("a %d-byte frame in VXLAN is %d bytes, above %d (the veths' MTU): at most %d",
				s.Size, s.Size+VXLANOverhead, MaxFrameSize, MaxFrameSize-VXLANOverhead)
		}
	}
	last := s.Src.As4()
	hi := binary.BigEndian.Uint32(last[:]) + uint32((s.Flows-1)/FlowPortsPerAddr)
	if hi < binary.BigEndian.Uint32(last[:]) {
		return bad("source addresses from %v wrap around", s.Src)
	}
	return nil
}

// Len is the number of bytes of one frame in memory: Size without FCS,
// plus VXLANOverhead with VXLAN.
func (s FrameSpec) Len() int {
	if s.VXLAN != nil {
		return s.Size - FCSLen + VXLANOverhead
	}
	return s.Size - FCSLen
}

// Flow returns flow i's source address and port.
func (s FrameSpec) Flow(i int) (netip.Addr, uint16) {
	a := s.Src.As4()
	v := binary.BigEndian.Uint32(a[:]) + uint32(i/FlowPortsPerAddr)
	binary.BigEndian.PutUint32(a[:], v)
	return netip.AddrFrom4(a), uint16(FlowPortBase + i%FlowPortsPerAddr)
}

// Frame writes flow i's frame into b, which must hold at least Len bytes,
// and returns b[:Len]. s must be valid. The IPv4 header has DF set, TTL 64
// and no options; the UDP checksum is filled in; the payload is a fixed
// byte pattern. With VXLAN, that frame is the inner one, behind the outer
// headers VXLANSpec describes.
func (s FrameSpec) Frame(b []byte, i int) []byte {
	all := b[:s.Len()]
	if v := s.VXLAN; v != nil {
		v.outer(all, i)
		b = all[VXLANOverhead:]
	}
	n := s.Size - FCSLen
	b = b[:n]
	copy(b[0:6], s.DstMAC)
	copy(b[6:12], s.SrcMAC)
	binary.BigEndian.PutUint16(b[12:14], 0x0800)

	ip := b[ethLen:offUDP]
	ip[0] = 0x45
	ip[1] = 0
	binary.BigEndian.PutUint16(ip[2:4], uint16(n-ethLen))
	binary.BigEndian.PutUint16(ip[4:6], 0)      // ID: unused with DF
	binary.BigEndian.PutUint16(ip[6:8], 0x4000) // DF
	ip[8] = 64
	ip[9] = 17
	ip[10], ip[11] = 0, 0
	src, sport := s.Flow(i)
	s4, d4 := src.As4(), s.Dst.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:12], ^header.Checksum(ip, 0))

	udp := b[offUDP:]
	binary.BigEndian.PutUint16(udp[0:2], sport)
	binary.BigEndian.PutUint16(udp[2:4], s.DstPort)
	binary.BigEndian.PutUint16(udp[4:6], uint16(len(udp)))
	udp[6], udp[7] = 0, 0
	for j := udpLen; j < len(udp); j++ {
		udp[j] = byte(j)
	}
	sum := ^header.Checksum(udp, header.PseudoHeaderChecksum(17, s4[:], d4[:], uint16(len(udp))))
	if sum == 0 {
		sum = 0xffff // RFC 768: a computed zero is sent as all ones
	}
	binary.BigEndian.PutUint16(udp[6:8], sum)
	return all
}

// outer writes the outer headers of flow i's VXLAN frame of f's length.
func (v *VXLANSpec) outer(f []byte, i int) {
	copy(f[0:6], v.DstMAC)
	copy(f[6:12], v.SrcMAC)
	binary.BigEndian.PutUint16(f[12:14], 0x0800)
	ip := f[ethLen : ethLen+ipv4Len]
	ip[0], ip[1] = 0x45, 0
	binary.BigEndian.PutUint16(ip[2:4], uint16(len(f)-ethLen))
	binary.BigEndian.PutUint16(ip[4:6], 0)
	binary.BigEndian.PutUint16(ip[6:8], 0x4000) // DF
	ip[8], ip[9] = 64, 17
	ip[10], ip[11] = 0, 0
	s4, d4 := v.Src.As4(), v.Dst.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:12], ^header.Checksum(ip, 0))
	udp := f[offOuterSport:]
	binary.BigEndian.PutUint16(udp[0:2], VXLANSourcePort(i))
	binary.BigEndian.PutUint16(udp[2:4], v.port())
	binary.BigEndian.PutUint16(udp[4:6], uint16(len(f)-ethLen-ipv4Len))
	udp[6], udp[7] = 0, 0 // no checksum
	header.VXLAN(udp[udpLen:]).Encode(v.VNI)
}

// SetFlow turns f, a frame written by Frame for any flow of s, into flow
// i's frame in place: it rewrites the source address and port and updates
// both checksums incrementally (RFC 1624), so the generator can reuse a
// buffer for another flow at the cost of a few word operations. The result
// is byte for byte what Frame writes. With VXLAN it also rewrites the
// outer UDP source port (the outer UDP checksum is zero, the outer IPv4
// header does not change).
func (s FrameSpec) SetFlow(f []byte, i int) {
	if s.VXLAN != nil {
		binary.BigEndian.PutUint16(f[offOuterSport:], VXLANSourcePort(i))
		f = f[VXLANOverhead:]
	}
	src, sport := s.Flow(i)
	s4 := src.As4()
	var p [2]byte
	binary.BigEndian.PutUint16(p[:], sport)

	ipSum := binary.BigEndian.Uint16(f[offIPCheck:])
	ipSum = header.ChecksumUpdate(ipSum, f[offIPSrc:offIPSrc+4], s4[:])
	binary.BigEndian.PutUint16(f[offIPCheck:], ipSum)

	// The UDP checksum covers the source address (pseudo-header) and port.
	udpSum := binary.BigEndian.Uint16(f[offUDPSum:])
	udpSum = header.ChecksumUpdate(udpSum, f[offIPSrc:offIPSrc+4], s4[:])
	udpSum = header.ChecksumUpdate(udpSum, f[offUDPSrc:offUDPSrc+2], p[:])
	if udpSum == 0 {
		udpSum = 0xffff
	}
	binary.BigEndian.PutUint16(f[offUDPSum:], udpSum)
	copy(f[offIPSrc:offIPSrc+4], s4[:])
	copy(f[offUDPSrc:offUDPSrc+2], p[:])
}
