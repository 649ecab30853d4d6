package gpkt

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Ext6 is an IPv6 extension header for a test frame: its protocol number,
// and its layer given the header that follows it (Chain6 links them).
type Ext6 struct {
	Proto layers.IPProtocol
	Layer func(next layers.IPProtocol) gopacket.SerializableLayer
}

var (
	// DestOpts6 is a Destination Options header (8 bytes), by gopacket.
	DestOpts6 = Ext6{layers.IPProtocolIPv6Destination, func(next layers.IPProtocol) gopacket.SerializableLayer {
		d := &layers.IPv6Destination{Options: []*layers.IPv6DestinationOption{{OptionType: 0x1e, OptionData: []byte{1, 2, 3, 4}}}}
		d.NextHeader = next
		return d
	}}
	// HopByHop6 is a Hop-by-Hop Options header (8 bytes), by gopacket.
	HopByHop6 = Ext6{layers.IPProtocolIPv6HopByHop, func(next layers.IPProtocol) gopacket.SerializableLayer {
		h := &layers.IPv6HopByHop{Options: []*layers.IPv6HopByHopOption{{OptionType: 0x1e, OptionData: []byte{5, 6, 7, 8}}}}
		h.NextHeader = next
		return h
	}}
)

// Fragment6 is a Fragment header (offset in 8-byte units), by hand:
// gopacket cannot serialise one.
func Fragment6(offset uint16, more bool) Ext6 {
	return Ext6{layers.IPProtocolIPv6Fragment, func(next layers.IPProtocol) gopacket.SerializableLayer {
		fo := offset << 3
		if more {
			fo |= 1
		}
		h := gopacket.Payload{byte(next), 0, 0, 0, 0, 0, 0x12, 0x34}
		binary.BigEndian.PutUint16(h[2:], fo)
		return h
	}}
}

// Routing6 is a type 0 Routing header with one address (24 bytes) and
// segmentsLeft segments left, by hand: gopacket cannot serialise one.
func Routing6(segmentsLeft byte) Ext6 {
	return Ext6{layers.IPProtocolIPv6Routing, func(next layers.IPProtocol) gopacket.SerializableLayer {
		h := make(gopacket.Payload, 24)
		h[0], h[1], h[3] = byte(next), 2, segmentsLeft
		copy(h[8:], netip.MustParseAddr("2001:db8:77::1").AsSlice())
		return h
	}}
}

// Chain6 returns the layers of exts in order, each told the header that
// follows it (the last: transport), and the protocol of the first — the
// IPv6 header's Next Header (transport when exts is empty).
func Chain6(transport layers.IPProtocol, exts ...Ext6) (first layers.IPProtocol, ls []gopacket.SerializableLayer) {
	first = transport
	if len(exts) > 0 {
		first = exts[0].Proto
	}
	for i, e := range exts {
		next := transport
		if i+1 < len(exts) {
			next = exts[i+1].Proto
		}
		ls = append(ls, e.Layer(next))
	}
	return first, ls
}

// ChainLen6 is the length of the extension headers exts.
func ChainLen6(exts ...Ext6) int {
	n := 0
	for _, e := range exts {
		n += len(MustSerialize(e.Layer(layers.IPProtocolTCP)))
	}
	return n
}
