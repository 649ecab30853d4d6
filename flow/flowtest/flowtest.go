// Package flowtest generates client traffic for benchmarks and tests:
// distinct client flows in chosen proportions of IPv4 TCP, IPv4 UDP, IPv6
// TCP and VLAN-tagged IPv4 TCP (Flows), and one frame per flow towards
// the VIPs of a Targets, serialised by gopacket with every length and
// checksum computed — the library's independent oracle, never its own
// header code.
//
// It is the one generator of the root module's benchmarks and tests (mux)
// and of the benchmarks module (benchmarks/, which cannot import internal
// packages). The same arguments always give the same flows and bytes, so
// runs compare. Clients come from 198.18.0.0/15 and 2001:db8:1::/64;
// nothing here is sent anywhere.
//
// The packet-rate harness (internal/lab/pktrate) writes its own frames:
// it rewrites one frame in place per flow at line rate, from a fixed
// sequential layout of addresses and ports, with no gopacket in the loop.
package flowtest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/flow"
)

// Kind is the shape of a flow's frames.
type Kind uint8

const (
	TCP4     Kind = iota // Ethernet, IPv4, TCP
	UDP4                 // Ethernet, IPv4, UDP
	TCP6                 // Ethernet, IPv6, TCP
	TCP4VLAN             // Ethernet, 802.1Q tag (VLAN 100), IPv4, TCP
	NumKinds
)

// String returns "tcp4", "udp4", "tcp6" or "tcp4-vlan".
func (k Kind) String() string {
	if k >= NumKinds {
		return fmt.Sprintf("Kind(%d)", uint8(k))
	}
	return [...]string{"tcp4", "udp4", "tcp6", "tcp4-vlan"}[k]
}

// Proto is the flow's transport protocol (flow.ProtoTCP or
// flow.ProtoUDP).
func (k Kind) Proto() uint8 {
	if k == UDP4 {
		return flow.ProtoUDP
	}
	return flow.ProtoTCP
}

// Mix is a traffic mix: the percentage of flows of each kind, summing to
// 100.
type Mix [NumKinds]int

// Flow is one generated flow: a client endpoint of a kind, talking to the
// VIP of that kind (Targets).
type Flow struct {
	Kind    Kind
	Src     netip.Addr
	SrcPort uint16
	TOS     uint8 // IPv4 TOS or IPv6 traffic class: a DSCP, ECN bits clear
}

// Config says which flows Flows generates.
type Config struct {
	// Mix is the proportion of each kind.
	Mix Mix
	// Seed seeds the generator (a PCG); the same seed gives the same
	// flows.
	Seed uint64
	// TOS gives about a quarter of the flows a non-zero DSCP.
	TOS bool
	// Skip, when set, rejects client addresses (a spoofed source the
	// data path under test would drop, for instance); a rejected draw is
	// drawn again.
	Skip func(src netip.Addr) bool
}

// pcgStream is the PCG's second seed word: "xdplb".
const pcgStream = 0x786470_6c62

// Flows returns n distinct flows (no two share protocol, client address
// and port) of c.Mix. IPv4 clients are spread over 198.18.0.0/15, IPv6
// ones over 2001:db8:1::/64, source ports over 1024–65535.
func Flows(n int, c Config) []Flow {
	rng := rand.New(rand.NewPCG(c.Seed, pcgStream))
	type tuple struct {
		proto uint8
		src   netip.Addr
		sport uint16
	}
	seen := make(map[tuple]struct{}, n)
	flows := make([]Flow, 0, n)
	for len(flows) < n {
		var f Flow
		pick := rng.IntN(100)
		for k := range NumKinds {
			if pick < c.Mix[k] {
				f.Kind = k
				break
			}
			pick -= c.Mix[k]
		}
		r := rng.Uint64()
		if f.Kind == TCP6 {
			a := [16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1}
			for i := 8; i < 16; i++ {
				a[i] = byte(r >> (8 * (i - 8)))
			}
			f.Src = netip.AddrFrom16(a)
		} else {
			f.Src = netip.AddrFrom4([4]byte{198, 18 + byte(r&1), byte(r >> 8), byte(r >> 16)})
		}
		f.SrcPort = uint16(1024 + rng.IntN(65536-1024))
		if c.TOS && r>>40&3 == 0 {
			f.TOS = byte(r>>48) &^ 3
		}
		if c.Skip != nil && c.Skip(f.Src) {
			continue
		}
		t := tuple{f.Kind.Proto(), f.Src, f.SrcPort}
		if _, dup := seen[t]; dup {
			continue
		}
		seen[t] = struct{}{}
		flows = append(flows, f)
	}
	return flows
}

// Targets is where the flows go and how their frames are addressed: the
// VIP of each kind (TCP4VLAN flows go to TCP4) and the Ethernet addresses
// of every frame.
type Targets struct {
	TCP4, UDP4, TCP6 netip.AddrPort
	SrcMAC, DstMAC   net.HardwareAddr
	// VNI is the flow keys' VNI (Key).
	VNI uint32
}

// Dst returns the VIP flow f is sent to.
func (t Targets) Dst(f Flow) netip.AddrPort {
	switch f.Kind {
	case UDP4:
		return t.UDP4
	case TCP6:
		return t.TCP6
	}
	return t.TCP4
}

// Key returns the flow key a parser must find in f's frames.
func (t Targets) Key(f Flow) flow.Key {
	return flow.KeyFrom(t.VNI, f.Kind.Proto(), netip.AddrPortFrom(f.Src, f.SrcPort), t.Dst(f))
}

// PayloadLen is the payload of every frame: an untagged IPv4 TCP frame is
// 64 bytes.
const PayloadLen = 10

// Frame returns frame seq of flow f, serialised by gopacket: a TCP segment
// of an established connection (ACK|PSH, sequence number seq) or a UDP
// datagram, carrying PayloadLen zero bytes.
func (t Targets) Frame(f Flow, seq uint32) []byte {
	dst := t.Dst(f)
	eth := &layers.Ethernet{SrcMAC: t.SrcMAC, DstMAC: t.DstMAC}
	ls := []gopacket.SerializableLayer{eth}
	var nl gopacket.NetworkLayer
	if f.Kind == TCP6 {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 64, TrafficClass: f.TOS, NextHeader: layers.IPProtocolTCP,
			SrcIP: f.Src.AsSlice(), DstIP: dst.Addr().AsSlice()}
		nl = ip
		ls = append(ls, ip)
	} else {
		eth.EthernetType = layers.EthernetTypeIPv4
		if f.Kind == TCP4VLAN {
			eth.EthernetType = layers.EthernetTypeDot1Q
			ls = append(ls, &layers.Dot1Q{VLANIdentifier: 100, Type: layers.EthernetTypeIPv4})
		}
		ip := &layers.IPv4{Version: 4, TTL: 64, TOS: f.TOS, Protocol: layers.IPProtocol(f.Kind.Proto()),
			SrcIP: f.Src.AsSlice(), DstIP: dst.Addr().AsSlice(), Flags: layers.IPv4DontFragment}
		nl = ip
		ls = append(ls, ip)
	}
	if f.Kind == UDP4 {
		u := &layers.UDP{SrcPort: layers.UDPPort(f.SrcPort), DstPort: layers.UDPPort(dst.Port())}
		_ = u.SetNetworkLayerForChecksum(nl)
		ls = append(ls, u)
	} else {
		tcp := &layers.TCP{SrcPort: layers.TCPPort(f.SrcPort), DstPort: layers.TCPPort(dst.Port()),
			Seq: seq, Ack: 1, ACK: true, PSH: true, Window: 65535}
		_ = tcp.SetNetworkLayerForChecksum(nl)
		ls = append(ls, tcp)
	}
	ls = append(ls, gopacket.Payload(make([]byte, PayloadLen)))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		panic(fmt.Sprintf("flowtest: %v", err)) // only a Targets without addresses of the kind's family fails
	}
	return buf.Bytes()
}

// Frames returns one frame per flow (flow i's with sequence number i),
// packed in shared 1 MiB arenas: a million frames cost about 100 MB and
// few allocations.
func (t Targets) Frames(flows []Flow) [][]byte {
	frames := make([][]byte, len(flows))
	var arena []byte
	for i, f := range flows {
		fr := t.Frame(f, uint32(i))
		if len(arena) < len(fr) {
			arena = make([]byte, 1<<20)
		}
		frames[i] = arena[:len(fr):len(fr)]
		copy(frames[i], fr)
		arena = arena[len(fr):]
	}
	return frames
}
