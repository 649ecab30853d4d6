package mux

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// muxInjected is gopacket's reading of an injected frame.
type muxInjected struct {
	frame []byte
	l3off int    // where the IP header starts (after any VLAN tags)
	etype uint16 // the EtherType before the IP header
	ip    []byte // the IP packet, header and payload, Ethernet padding excluded
	v4    bool
	ip4   layers.IPv4
	ip6   layers.IPv6 // the fixed header (see decodeIPv6Fixed)
	src   netip.Addr
	dst   netip.Addr
	l4    muxL4
}

// muxL4 locates an IP packet's transport header.
type muxL4 struct {
	proto    uint8
	off      int  // in the IP packet
	frag     bool // a fragment
	nonFirst bool // a fragment other than the first: no transport header
	ok       bool // the IPv6 extension chain could be walked
}

// decodeMuxInjected reads frame with gopacket's layer decoders: Ethernet,
// any 802.1Q / 802.1ad tags, then the IPv4 or IPv6 header, whose length
// field bounds the IP packet.
//
// gopacket also validates IPv4 options and the TLVs of IPv6 Hop-by-Hop
// and Destination Options headers, which a forwarder neither processes nor
// must validate (the Mux passes them to the backend untouched), so an
// IPv4 options error is ignored once the fixed header is read, and IPv6
// extension headers are walked by their length fields (muxIPv6L4).
func decodeMuxInjected(frame []byte) (muxInjected, error) {
	in := muxInjected{frame: frame}
	var eth layers.Ethernet
	if err := eth.DecodeFromBytes(frame, gopacket.NilDecodeFeedback); err != nil {
		return in, fmt.Errorf("ethernet: %w", err)
	}
	off, et := len(eth.Contents), eth.EthernetType
	for et == layers.EthernetTypeDot1Q || et == layers.EthernetTypeQinQ {
		var tag layers.Dot1Q
		if err := tag.DecodeFromBytes(frame[off:], gopacket.NilDecodeFeedback); err != nil {
			return in, fmt.Errorf("vlan tag: %w", err)
		}
		off += len(tag.Contents)
		et = tag.Type
	}
	in.l3off, in.etype = off, uint16(et)
	var plen int
	switch et {
	case layers.EthernetTypeIPv4:
		if err := decodeIPv4(&in.ip4, frame[off:]); err != nil {
			return in, err
		}
		in.v4, plen = true, int(in.ip4.Length)
		in.src, _ = netip.AddrFromSlice(in.ip4.SrcIP)
		in.dst, _ = netip.AddrFromSlice(in.ip4.DstIP)
	case layers.EthernetTypeIPv6:
		if err := decodeIPv6Fixed(&in.ip6, frame[off:]); err != nil {
			return in, err
		}
		plen = 40 + int(in.ip6.Length)
		in.src, _ = netip.AddrFromSlice(in.ip6.SrcIP)
		in.dst, _ = netip.AddrFromSlice(in.ip6.DstIP)
	default:
		return in, fmt.Errorf("EtherType %v is not IP", et)
	}
	if off+plen > len(frame) {
		return in, fmt.Errorf("IP packet of %d bytes in %d", plen, len(frame)-off)
	}
	in.ip = frame[off : off+plen]
	if in.v4 {
		in.l4 = muxL4{proto: uint8(in.ip4.Protocol), off: len(in.ip4.Contents), ok: true,
			frag:     in.ip4.Flags&layers.IPv4MoreFragments != 0 || in.ip4.FragOffset != 0,
			nonFirst: in.ip4.FragOffset != 0}
	} else {
		in.l4 = muxIPv6L4(in.ip)
	}
	return in, nil
}

// decodeIPv4 decodes an IPv4 header with gopacket, ignoring an error in
// its options (see decodeMuxInjected).
func decodeIPv4(ip *layers.IPv4, b []byte) error {
	err := ip.DecodeFromBytes(b, gopacket.NilDecodeFeedback)
	if err != nil && !(strings.Contains(err.Error(), "option") && int(ip.IHL)*4 == len(ip.Contents)) {
		return fmt.Errorf("ipv4: %w", err)
	}
	return nil
}

// decodeIPv6Fixed decodes the fixed IPv6 header of b with gopacket, from a
// copy whose Next Header says "no next header" (59), so that gopacket does
// not parse a Hop-by-Hop header's options (see decodeMuxInjected).
func decodeIPv6Fixed(ip *layers.IPv6, b []byte) error {
	c := bytes.Clone(b)
	if len(c) > 6 {
		c[6] = byte(layers.IPProtocolNoNextHeader)
	}
	// A payload length of 0 is a jumbogram's to gopacket, which then
	// wants a Hop-by-Hop header; the Mux forwards such a packet as an
	// empty one (found by the fuzzer: a multicast source of it was
	// dropped as src_martian, but gopacket read no header).
	zero := len(c) >= 40 && c[4] == 0 && c[5] == 0
	if zero {
		c[5] = 1
	}
	if err := ip.DecodeFromBytes(c, gopacket.NilDecodeFeedback); err != nil {
		return fmt.Errorf("ipv6: %w", err)
	}
	if zero {
		ip.Length = 0
	}
	ip.NextHeader = layers.IPProtocol(b[6])
	return nil
}

// muxIPv6L4 walks the extension headers of the IPv6 packet ip by their
// length fields (RFC 8200 section 4: Hop-by-Hop, Routing and Destination
// Options count 8-octet units beyond the first; a Fragment header is 8
// octets) to the transport header.
func muxIPv6L4(ip []byte) muxL4 {
	l := muxL4{proto: ip[6], off: 40}
	for {
		switch l.proto {
		case 0, 43, 60, 44:
		default:
			l.ok = true
			return l
		}
		if len(ip)-l.off < 8 {
			return l
		}
		h := ip[l.off:]
		size := (int(h[1]) + 1) * 8
		if l.proto == 44 {
			size = 8
			l.frag = true
			l.nonFirst = l.nonFirst || binary.BigEndian.Uint16(h[2:])>>3 != 0
		}
		l.proto = h[0]
		l.off += size
		if l.off > len(ip) {
			return muxL4{}
		}
	}
}

// vipByAddr returns the index in benchVIPs of the VIP with address a, or
// -1. (benchVIPs' addresses are distinct.)
func vipByAddr(a netip.Addr) int {
	for i, v := range benchVIPs {
		if v.addr.Addr() == a {
			return i
		}
	}
	return -1
}

// isMuxVXLAN reports whether fr is, on its face, a VXLAN frame from the
// Mux: Ethernet, IPv4 from benchMuxSrc, UDP to port 4789.
func isMuxVXLAN(fr []byte) bool {
	pkt := gopacket.NewPacket(fr, layers.LayerTypeEthernet, gopacket.Default)
	ip, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if !ok || ip.Protocol != layers.IPProtocolUDP || !bytes.Equal(ip.SrcIP.To4(), benchMuxSrc.AsSlice()) {
		return false
	}
	u, ok := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	return ok && u.DstPort == layers.UDPPort(4789)
}

// checkVXLAN checks a VXLAN frame the Mux sent for in, and returns the
// backend it went to.
func (m *muxFuzzRig) checkVXLAN(t *testing.T, fr []byte, in *muxInjected) muxFuzzBackendChoice {
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("VXLAN frame: "+format+"\n in  %x\n out %x", append(args, in.frame, fr)...)
	}
	pkt := gopacket.NewPacket(fr, layers.LayerTypeEthernet, gopacket.Default)
	ls := pkt.Layers()
	if len(ls) < 4 {
		fail("gopacket decodes %d layers", len(ls))
	}
	eth, ok1 := ls[0].(*layers.Ethernet)
	ip, ok2 := ls[1].(*layers.IPv4)
	udp, ok3 := ls[2].(*layers.UDP)
	vx, ok4 := ls[3].(*layers.VXLAN)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		fail("layers %v, want Ethernet, IPv4, UDP, VXLAN", ls[:4])
	}

	// Outer Ethernet: the next hop's MACs, untagged.
	if !bytes.Equal(eth.SrcMAC, benchHop.SrcMAC[:]) || !bytes.Equal(eth.DstMAC, benchHop.DstMAC[:]) ||
		eth.EthernetType != layers.EthernetTypeIPv4 {
		fail("outer Ethernet %v → %v type %v", eth.SrcMAC, eth.DstMAC, eth.EthernetType)
	}
	// Outer IPv4.
	hdr := fr[14 : 14+len(ip.Contents)]
	switch {
	case ip.Version != 4 || ip.IHL != 5:
		fail("outer IPv4 version %d IHL %d", ip.Version, ip.IHL)
	case gpkt.Checksum(hdr) != 0:
		fail("outer IPv4 header checksum %#04x is wrong", ip.Checksum)
	case int(ip.Length) != len(fr)-14:
		fail("outer IPv4 total length %d, frame %d", ip.Length, len(fr))
	case int(ip.Length) > encap.DefaultMTU:
		fail("outer IPv4 total length %d over the MTU %d", ip.Length, encap.DefaultMTU)
	case ip.Flags != layers.IPv4DontFragment || ip.FragOffset != 0:
		fail("outer IPv4 flags %v offset %d, want DF", ip.Flags, ip.FragOffset)
	case ip.TTL != encap.DefaultTTL:
		fail("outer TTL %d", ip.TTL)
	}
	innerTOS := in.ip6.TrafficClass
	if in.v4 {
		innerTOS = in.ip4.TOS
	}
	if ip.TOS != innerTOS {
		fail("outer TOS %#02x, inner %#02x", ip.TOS, innerTOS)
	}
	host, _ := netip.AddrFromSlice(ip.DstIP.To4())
	if !netip.MustParsePrefix("198.18.254.0/24").Contains(host) {
		fail("outer destination %v is no host", host)
	}
	// UDP and VXLAN.
	switch {
	case int(udp.Length) != int(ip.Length)-20:
		fail("UDP length %d, IPv4 total length %d", udp.Length, ip.Length)
	case udp.Checksum != 0:
		fail("outer UDP checksum %#04x, want 0 over IPv4", udp.Checksum)
	case udp.SrcPort < encap.SourcePortMin:
		fail("outer UDP source port %d below the dynamic range", udp.SrcPort)
	case !vx.ValidIDFlag:
		fail("VXLAN I flag clear")
	}

	inner := vx.Payload
	if len(inner) < 14 {
		fail("inner frame of %d bytes", len(inner))
	}
	mac := [6]byte(inner[:6])
	if o, ok := muxReturnOwner(in); ok {
		// A reply to an outbound connection: to the owner of its port.
		if vx.VNI != o.VNI || mac != o.MAC || host != o.Host {
			fail("a reply to %v went to VNI %d MAC %v host %v, the port's owner is %+v", in.dst, vx.VNI, net.HardwareAddr(mac[:]), host, o)
		}
	} else {
		m.checkVIPBackend(fail, in, vx.VNI, mac, host)
	}

	// The inner frame: untagged Ethernet from the client's MAC, then the
	// injected IP packet unchanged, without padding.
	if !bytes.Equal(inner[6:12], in.frame[6:12]) {
		fail("inner source MAC %x, injected %x", inner[6:12], in.frame[6:12])
	}
	if et := binary.BigEndian.Uint16(inner[12:14]); et != in.etype {
		fail("inner EtherType %#04x, injected IP is %#04x", et, in.etype)
	}
	// The Mux routes the packet: the TTL / hop limit is one less (one of
	// 1 or 0 must not have been forwarded), and the IPv4 header checksum
	// verifies exactly when the injected one did, and is off by the same
	// amount when it did not (an incremental update).
	if in.ttl() <= 1 {
		fail("forwarded with TTL / hop limit %d", in.ttl())
	}
	if spoof := muxSpoofed(in); spoof != "" {
		fail("forwarded from a spoofed source (%s)", spoof)
	}
	want := gpkt.CompletePartialIP(in.ip)
	if len(inner) >= 14+20 && len(want) >= 20 {
		got := inner[14:]
		if in.v4 {
			want[8]--
			ihl := int(want[0]&0x0f) * 4
			if len(got) < ihl || gpkt.Checksum(got[:ihl]) != gpkt.Checksum(in.ip[:ihl]) {
				fail("inner IPv4 header checksum: RFC 1071 sum %#04x, injected %#04x", gpkt.Checksum(got[:ihl]), gpkt.Checksum(in.ip[:ihl]))
			}
			copy(want[10:12], got[10:12])
		} else {
			want[7]--
		}
	}
	// A TCP/UDP checksum the sender left partial (field = pseudo-header
	// sum, not verifying) is completed, and nothing else changes.
	if !bytes.Equal(inner[14:], want) {
		fail("inner IP packet differs from the injected one (TTL / hop limit one less, partial checksum completed, if any)\n want %x\n got  %x", want, inner[14:])
	}
	return muxFuzzBackendChoice{mac: mac, host: host}
}

// checkVIPBackend checks that a VXLAN frame for in, with VNI vni to MAC
// mac on host, went to a backend of the VIP whose flow in is, by the
// oracle.
func (m *muxFuzzRig) checkVIPBackend(fail func(string, ...any), in *muxInjected, vni uint32, mac [6]byte, host netip.Addr) {
	// The VIP the packet is for, by the oracle; its VNI and one of its
	// backends.
	vip, why := muxFlowVIP(in)
	if vip < 0 {
		fail("the Mux encapsulated a packet that is no VIP flow: %s", why)
	}
	v := benchVIPs[vip]
	if vni != v.vni {
		fail("VNI %d, VIP %s has %d", vni, v.name, v.vni)
	}
	be, ok := m.backends[mac]
	if !ok || be.vip != vip {
		fail("inner destination MAC %v is no backend of VIP %s", net.HardwareAddr(mac[:]), v.name)
	}
	if be.host != host {
		fail("outer destination %v, backend %v is on host %v", host, net.HardwareAddr(mac[:]), be.host)
	}
}
