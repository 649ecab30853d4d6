package hostagent

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// Kinds of IP packets, as the NAT sees them.
const (
	kindOther     = iota
	kindPorts     // TCP or UDP, whole or first fragment: ports to translate
	kindFragment  // a non-first fragment: addresses only
	kindICMPError // an ICMP or ICMPv6 error: translated through its quote
)

// fuzzFrame is a frame decoded by gopacket, with the offsets the checks
// need.
type fuzzFrame struct {
	b         []byte
	pkt       gopacket.Packet
	eth       *layers.Ethernet
	ip4       *layers.IPv4
	ip6       *layers.IPv6
	l3, l4    int // offsets of the IP and transport headers (l4 < 0: none)
	end       int // end of the IP datagram
	proto     layers.IPProtocol
	frag      bool           // an IP fragment, first or not
	l4layer   gopacket.Layer // TCP, UDP, ICMPv4 or ICMPv6, decoded alone
	kind      int
	truncated bool          // the frame ends before the IP datagram
	vxlan     *layers.VXLAN // an outer frame's VXLAN header (decapOracle)
}

// decodeFuzzFrame decodes an Ethernet frame with gopacket. The transport
// header is decoded on its own from the IP payload, so that a first
// fragment, or IP options gopacket rejects, still yield the ports.
func decodeFuzzFrame(b []byte) *fuzzFrame {
	d := &fuzzFrame{b: b, l4: -1}
	d.pkt = gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
	d.eth, _ = d.pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	off := 0
	var payload []byte
layers:
	for _, l := range d.pkt.Layers() {
		switch l := l.(type) {
		case *layers.IPv4:
			d.ip4, d.l3 = l, off
			ihl := int(l.IHL) * 4
			if ihl < 20 || len(l.Contents) < ihl {
				d.ip4 = nil
				return d
			}
			d.proto = l.Protocol
			d.frag = l.Flags&layers.IPv4MoreFragments != 0 || l.FragOffset != 0
			d.end = off + int(l.Length)
			if l.FragOffset == 0 {
				d.l4 = off + ihl
			}
			payload = l.Payload
		case *layers.IPv6:
			d.ip6, d.l3 = l, off
			d.proto = l.NextHeader
			d.end = off + 40 + int(l.Length)
			switch l.NextHeader {
			case layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv6:
				d.l4 = off + 40 // extension headers: none of our business here
			}
			payload = l.Payload
		default:
			off += len(l.LayerContents())
			continue
		}
		break layers // the first IP header; any tunnelled one is payload
	}
	if d.ip4 == nil && d.ip6 == nil {
		return d
	}
	if d.end > len(b) {
		d.truncated = true
		d.end = len(b)
	}
	if d.l4 >= 0 && d.l4 <= d.end {
		tp := gopacket.NewPacket(payload, d.proto.LayerType(), gopacket.Default)
		if ls := tp.Layers(); len(ls) > 0 {
			d.l4layer = ls[0]
		}
	}
	switch l := d.l4layer.(type) {
	case *layers.TCP, *layers.UDP:
		if d.l4+4 <= d.end {
			d.kind = kindPorts
		}
	case *layers.ICMPv4:
		if ty := l.TypeCode.Type(); !d.frag && d.ip4 != nil && (ty == 3 || ty == 11 || ty == 12) {
			d.kind = kindICMPError
		}
	case *layers.ICMPv6:
		if ty := l.TypeCode.Type(); !d.frag && d.ip6 != nil && ty >= 1 && ty <= 4 {
			d.kind = kindICMPError
		}
	}
	if d.ip4 != nil && d.ip4.FragOffset != 0 {
		d.kind = kindFragment
	}
	return d
}

func (d *fuzzFrame) ok() bool { return d.eth != nil && (d.ip4 != nil || d.ip6 != nil) }

// ttl returns the IPv4 TTL or IPv6 hop limit.
func (d *fuzzFrame) ttl() uint8 {
	if d.ip4 != nil {
		return d.ip4.TTL
	}
	return d.ip6.HopLimit
}

func (d *fuzzFrame) netLayer() gopacket.NetworkLayer {
	if d.ip4 != nil {
		return d.ip4
	}
	return d.ip6
}

func (d *fuzzFrame) srcAddr() netip.Addr {
	a, _ := netip.AddrFromSlice(d.netLayer().NetworkFlow().Src().Raw())
	return a
}

func (d *fuzzFrame) dstAddr() netip.Addr {
	a, _ := netip.AddrFromSlice(d.netLayer().NetworkFlow().Dst().Raw())
	return a
}

func (d *fuzzFrame) srcPort() uint16 { return binary.BigEndian.Uint16(d.b[d.l4:]) }
func (d *fuzzFrame) dstPort() uint16 { return binary.BigEndian.Uint16(d.b[d.l4+2:]) }

func (d *fuzzFrame) src() netip.AddrPort { return netip.AddrPortFrom(d.srcAddr(), d.srcPort()) }
func (d *fuzzFrame) dst() netip.AddrPort { return netip.AddrPortFrom(d.dstAddr(), d.dstPort()) }

// addrSpan is the source or destination address field.
func (d *fuzzFrame) addrSpan(src bool) span {
	if d.ip4 != nil {
		if src {
			return span{d.l3 + 12, 4}
		}
		return span{d.l3 + 16, 4}
	}
	if src {
		return span{d.l3 + 8, 16}
	}
	return span{d.l3 + 24, 16}
}

// ecnSpan is the byte that holds the ECN field.
func (d *fuzzFrame) ecnSpan() span { return span{d.l3 + 1, 1} }

// l4ChecksumSpan is the TCP or UDP checksum field.
func (d *fuzzFrame) l4ChecksumSpan() span {
	if d.proto == layers.IPProtocolTCP {
		return span{d.l4 + 16, 2}
	}
	return span{d.l4 + 6, 2}
}

// ECN codepoints (RFC 3168) and RFC 6040's decapsulation table (section
// 4.2, figure 4, normal mode), indexed [inner][outer].
const (
	ecnNotECT = 0
	ecnECT1   = 1
	ecnECT0   = 2
	ecnCE     = 3
	ecnDrop   = -1
)

var rfc6040 = [4][4]int{
	ecnNotECT: {ecnNotECT: ecnNotECT, ecnECT1: ecnNotECT, ecnECT0: ecnNotECT, ecnCE: ecnDrop},
	ecnECT1:   {ecnNotECT: ecnECT1, ecnECT1: ecnECT1, ecnECT0: ecnECT1, ecnCE: ecnCE},
	ecnECT0:   {ecnNotECT: ecnECT0, ecnECT1: ecnECT1, ecnECT0: ecnECT0, ecnCE: ecnCE},
	ecnCE:     {ecnNotECT: ecnCE, ecnECT1: ecnCE, ecnECT0: ecnCE, ecnCE: ecnCE},
}

// ecn is the frame's ECN field.
func (d *fuzzFrame) ecn() int { return ipECN(d) }

func ipECN(d *fuzzFrame) int {
	if d.ip4 != nil {
		return int(d.ip4.TOS & 3)
	}
	return int(d.ip6.TrafficClass & 3)
}

// decapOracle finds the VXLAN packet in a frame received on the uplink
// and returns the outer frame and the inner one, the way gopacket reads
// them.
func decapOracle(frame []byte) (*fuzzFrame, []byte, bool) {
	o := decodeFuzzFrame(frame)
	if !o.ok() || o.proto != layers.IPProtocolUDP || o.l4 < 0 {
		return nil, nil, false
	}
	var payload []byte
	if o.ip4 != nil {
		payload = o.ip4.Payload
	} else {
		payload = o.ip6.Payload
	}
	p := gopacket.NewPacket(payload, layers.LayerTypeUDP, gopacket.Default)
	vx, ok := p.Layer(layers.LayerTypeVXLAN).(*layers.VXLAN)
	if !ok {
		return nil, nil, false
	}
	o.vxlan = vx
	return o, vx.LayerPayload(), true
}

// ipv4ChecksumOK reports whether the IPv4 header at the start of b has a
// valid checksum: gopacket re-serialises the header with ComputeChecksums
// and the checksums are compared. A header gopacket cannot reproduce byte
// for byte (options it decodes loosely or rejects) is summed with RFC 1071
// instead.
func ipv4ChecksumOK(b []byte) bool {
	ihl := int(b[0]&0x0f) * 4
	hdr := b[:ihl]
	var ip layers.IPv4
	if ip.DecodeFromBytes(b, gopacket.NilDecodeFeedback) == nil {
		orig := ip.Checksum
		buf := gopacket.NewSerializeBuffer()
		if ip.SerializeTo(buf, gopacket.SerializeOptions{ComputeChecksums: true}) == nil &&
			sameButChecksum(buf.Bytes(), hdr, 10) {
			return ip.Checksum == orig
		}
	}
	return gpkt.Checksum(hdr) == 0
}

// sameButChecksum reports whether a and b are equal except at the
// checksum field at offset cs.
func sameButChecksum(a, b []byte, cs int) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if a[k] != b[k] && k != cs && k != cs+1 {
			return false
		}
	}
	return true
}

// l4ChecksumOK reports whether the transport checksum of d verifies, by
// gopacket, and whether that is known at all (not for fragments, other
// protocols, or a segment cut short). A zero UDP checksum over IPv4 means
// none, which is valid.
func l4ChecksumOK(d *fuzzFrame) (valid, known bool) {
	if d.frag || d.truncated || d.l4layer == nil {
		return false, false
	}
	nl := d.netLayer()
	opts := gopacket.SerializeOptions{ComputeChecksums: true}
	switch l := d.l4layer.(type) {
	case *layers.TCP:
		if len(l.Contents) < 20 {
			return false, false
		}
		if err := l.SetNetworkLayerForChecksum(nl); err != nil {
			return false, false
		}
		c, err := l.ComputeChecksum() // over the raw segment, checksum field included
		return err == nil && c == 0, err == nil
	case *layers.UDP:
		if l.Checksum == 0 && d.ip4 != nil {
			return true, true
		}
		u := *l
		if err := u.SetNetworkLayerForChecksum(nl); err != nil {
			return false, false
		}
		if gopacket.SerializeLayers(gopacket.NewSerializeBuffer(), opts, &u, gopacket.Payload(l.Payload)) != nil {
			return false, false
		}
		return u.Checksum == l.Checksum || u.Checksum == 0 && l.Checksum == 0xffff, true
	case *layers.ICMPv4:
		m := *l
		if gopacket.SerializeLayers(gopacket.NewSerializeBuffer(), opts, &m, gopacket.Payload(l.Payload)) != nil {
			return false, false
		}
		return m.Checksum == l.Checksum, true
	case *layers.ICMPv6:
		m := *l
		if err := m.SetNetworkLayerForChecksum(nl); err != nil {
			return false, false
		}
		if gopacket.SerializeLayers(gopacket.NewSerializeBuffer(), opts, &m, gopacket.Payload(l.Payload)) != nil {
			return false, false
		}
		return m.Checksum == l.Checksum, true
	}
	return false, false
}
