//go:build linux

package steer

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// modelOutcome is the steering decision computed independently with
// gopacket's decoders: the oracle the BPF program is checked against. ok is
// false when gopacket cannot decode the frame far enough to say (the BPF
// program is then only required not to steer garbage, see the fuzz test).
func modelOutcome(cfg Config, frame []byte) (out outcome, ok bool) {
	if len(frame) < 14 {
		return outMalformed, true
	}
	pk := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.DecodeOptions{Lazy: false, NoCopy: true})
	eth, _ := pk.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if eth == nil {
		return "", false
	}
	typ, l3 := eth.EthernetType, 14
	if typ == layers.EthernetTypeDot1Q {
		if len(frame) < 18 {
			return outMalformed, true
		}
		q, _ := pk.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q)
		if q == nil {
			return "", false
		}
		typ, l3 = q.Type, 18
	}
	avail := len(frame) - l3

	var (
		src, dst     netip.Addr
		proto        layers.IPProtocol
		ports        bool
		sport, dport uint16
	)
	switch typ {
	case layers.EthernetTypeIPv4:
		if avail < 20 {
			return outMalformed, true
		}
		// Length checks on the raw header: gopacket reads tot_len 0 as
		// "the rest of the frame" (TSO), the program calls it malformed.
		hlen := int(frame[l3]&0x0f) * 4
		tot := int(binary.BigEndian.Uint16(frame[l3+2:]))
		if frame[l3]>>4 != 4 || hlen < 20 || tot < hlen || tot > avail {
			return outMalformed, true
		}
		ip, _ := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if ip == nil {
			return "", false
		}
		src, _ = netip.AddrFromSlice(ip.SrcIP)
		dst, _ = netip.AddrFromSlice(ip.DstIP)
		proto = ip.Protocol
		if ip.FragOffset == 0 && (proto == layers.IPProtocolTCP || proto == layers.IPProtocolUDP) {
			l4len := int(ip.Length) - hlen
			if proto == layers.IPProtocolTCP && l4len < 20 || proto == layers.IPProtocolUDP && l4len < 8 {
				return outMalformed, true
			}
			ports = true
			if !transportPorts(ip.Payload, proto, &sport, &dport) {
				return "", false
			}
		}
	case layers.EthernetTypeIPv6:
		if avail < 40 {
			return outMalformed, true
		}
		ip, _ := pk.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		if ip == nil {
			return "", false
		}
		if ip.Version != 6 || int(ip.Length) > avail-40 {
			return outMalformed, true
		}
		if ip.Length == 0 && ip.NextHeader == layers.IPProtocolIPv6HopByHop {
			return "", false // gopacket's jumbogram handling rewrites Length
		}
		src, _ = netip.AddrFromSlice(ip.SrcIP)
		dst, _ = netip.AddrFromSlice(ip.DstIP)
		var later, done bool
		var pay []byte
		proto, pay, later, done, out = walk6(ip.NextHeader, frame[l3+40:l3+40+int(ip.Length)])
		if done {
			return out, out != ""
		}
		switch {
		case later:
			// A later fragment: the protocol without ports.
		case proto == layers.IPProtocolTCP, proto == layers.IPProtocolUDP:
			if proto == layers.IPProtocolTCP && len(pay) < 20 || proto == layers.IPProtocolUDP && len(pay) < 8 {
				return outMalformed, true
			}
			ports = true
			if !transportPorts(pay, proto, &sport, &dport) {
				return "", false
			}
		case proto == layers.IPProtocolICMPv6:
			if len(pay) < 4 {
				return outMalformed, true
			}
			var icmp layers.ICMPv6
			if icmp.DecodeFromBytes(pay, gopacket.NilDecodeFeedback) != nil {
				return "", false
			}
			if t := icmp.TypeCode.Type(); t >= 130 && t <= 137 || t == 143 {
				return outND, true
			}
		case proto == layers.IPProtocolAH, proto == 135, proto == 139, proto == 140, proto == 253, proto == 254:
			proto = 0
		}
	default:
		return outNotIP, true
	}
	return cfg.decide(src, dst, uint8(proto), ports, sport, dport), true
}

// maxExt6 is how many IPv6 extension headers the program walks
// (header.IPv6MaxExtensionHeaders).
const maxExt6 = 8

// walk6 walks the hop-by-hop, routing, destination options and fragment
// headers at the start of pay (the IPv6 payload, cut to the payload
// length), decoding each with gopacket, to the upper-layer protocol and
// its bytes; later is true after a fragment header with a non-zero
// offset. done is true when the outcome is decided already: malformed (a
// header that does not fit, more than maxExt6 headers) or undecided
// (gopacket cannot decode a header: out is "").
func walk6(next layers.IPProtocol, pay []byte) (proto layers.IPProtocol, rest []byte, later, done bool, out outcome) {
	for n := 0; ; n++ {
		switch next {
		case layers.IPProtocolIPv6HopByHop, layers.IPProtocolIPv6Routing,
			layers.IPProtocolIPv6Destination, layers.IPProtocolIPv6Fragment:
		default:
			return next, pay, false, false, ""
		}
		if n == maxExt6 || len(pay) < 8 {
			return 0, nil, false, true, outMalformed
		}
		if next != layers.IPProtocolIPv6Fragment && (int(pay[1])+1)*8 > len(pay) {
			return 0, nil, false, true, outMalformed
		}
		typ := next.LayerType()
		l := gopacket.NewPacket(pay, typ, gopacket.DecodeOptions{NoCopy: true}).Layer(typ)
		switch h := l.(type) {
		case *layers.IPv6HopByHop:
			next = h.NextHeader
		case *layers.IPv6Routing:
			next = h.NextHeader
		case *layers.IPv6Destination:
			next = h.NextHeader
		case *layers.IPv6Fragment:
			next = h.NextHeader
			if h.FragmentOffset != 0 {
				return next, nil, true, false, ""
			}
		default:
			return 0, nil, false, true, "" // gopacket cannot decode it
		}
		pay = l.LayerPayload()
	}
}

// transportPorts decodes the TCP or UDP header at the start of payload
// (gopacket itself stops at the IP layer for a first fragment).
func transportPorts(payload []byte, proto layers.IPProtocol, sport, dport *uint16) bool {
	if proto == layers.IPProtocolTCP {
		var t layers.TCP
		if t.DecodeFromBytes(payload, gopacket.NilDecodeFeedback) != nil {
			return false
		}
		*sport, *dport = uint16(t.SrcPort), uint16(t.DstPort)
		return true
	}
	var u layers.UDP
	if u.DecodeFromBytes(payload, gopacket.NilDecodeFeedback) != nil {
		return false
	}
	*sport, *dport = uint16(u.SrcPort), uint16(u.DstPort)
	return true
}

// decide applies the documented matching order to a decoded packet, over
// the rules as written in the Config (not the map keys).
func (c Config) decide(src, dst netip.Addr, proto uint8, ports bool, sport, dport uint16) outcome {
	for _, r := range c.Dst {
		if r.Addr.Unmap() != dst {
			continue
		}
		switch {
		case r.Proto == 0 && r.Port == 0,
			r.Port == 0 && r.Proto == proto && proto != 0,
			ports && r.Proto == proto && r.Port == dport:
			return outDst
		}
	}
	for _, r := range c.VXLAN {
		port := r.Port
		if port == 0 {
			port = DefaultVXLANPort
		}
		if ports && proto == ProtoUDP && r.Local.Unmap() == dst && port == dport {
			return outVXLAN
		}
	}
	for _, r := range c.Src {
		if r.Addr.Unmap() == src && (r.Port == 0 || ports && r.Port == sport) {
			for _, p := range c.Infra {
				if p.Contains(dst) {
					return outInfra
				}
			}
			return outSrc
		}
	}
	return outNoMatch
}
