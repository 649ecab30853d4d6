package engine

import (
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// TestStateClass parses TCP segments of every flag combination the
// connection table tells apart, UDP and ICMP, through the common parser
// (untagged) and the general one (VLAN-tagged), and requires the class
// StateClass gives (flow.StateClass): a SYN without ACK untrusted, any
// FIN or RST closing, other TCP established, anything else ClassUDP.
func TestStateClass(t *testing.T) {
	type flags struct{ syn, ack, fin, rst, psh bool }
	cases := []struct {
		name string
		l4   func() gopacket.SerializableLayer // nil: TCP with flags f
		f    flags
		want flow.StateClass
	}{
		{name: "SYN", f: flags{syn: true}, want: flow.ClassUntrusted},
		{name: "SYN-ACK", f: flags{syn: true, ack: true}, want: flow.ClassEstablished},
		{name: "ACK", f: flags{ack: true}, want: flow.ClassEstablished},
		{name: "PSH-ACK", f: flags{psh: true, ack: true}, want: flow.ClassEstablished},
		{name: "none", want: flow.ClassEstablished},
		{name: "FIN-ACK", f: flags{fin: true, ack: true}, want: flow.ClassClosing},
		{name: "RST", f: flags{rst: true}, want: flow.ClassClosing},
		{name: "RST-ACK", f: flags{rst: true, ack: true}, want: flow.ClassClosing},
		{name: "SYN-FIN", f: flags{syn: true, fin: true}, want: flow.ClassClosing},
		{name: "UDP", l4: func() gopacket.SerializableLayer { return &layers.UDP{SrcPort: 40000, DstPort: 53} }, want: flow.ClassUDP},
		{name: "ICMP", l4: func() gopacket.SerializableLayer {
			return &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0)}
		}, want: flow.ClassUDP},
	}
	for _, c := range cases {
		for _, tagged := range []bool{false, true} {
			name := c.name
			if tagged {
				name += "/vlan"
			}
			t.Run(name, func(t *testing.T) {
				ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolTCP,
					SrcIP: net.IP{198, 18, 0, 1}, DstIP: net.IP{198, 19, 0, 2}}
				var l4 gopacket.SerializableLayer = &layers.TCP{SrcPort: 40000, DstPort: 443, Window: 512,
					SYN: c.f.syn, ACK: c.f.ack, FIN: c.f.fin, RST: c.f.rst, PSH: c.f.psh}
				if c.l4 != nil {
					l4 = c.l4()
					ip.Protocol = layers.IPProtocolUDP
					if _, ok := l4.(*layers.ICMPv4); ok {
						ip.Protocol = layers.IPProtocolICMPv4
					}
				}
				eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1},
					EthernetType: layers.EthernetTypeIPv4}
				ls := []gopacket.SerializableLayer{eth, ip, l4, gopacket.Payload(make([]byte, 8))}
				if tagged {
					eth.EthernetType = layers.EthernetTypeDot1Q
					ls = append([]gopacket.SerializableLayer{eth, &layers.Dot1Q{VLANIdentifier: 7, Type: layers.EthernetTypeIPv4}}, ls[1:]...)
				}
				frame := gpkt.MustSerialize(ls...)
				var p Packet
				p.SetBuffer(nil, 0, frame, 0, len(frame), 0)
				p.TCPFlags = 0xff // what a reused packet may hold
				if r := ParsePacket(&p, 0); r != 0 {
					t.Fatalf("dropped: %v", r)
				}
				if got := p.StateClass(); got != c.want {
					t.Fatalf("StateClass %v, want %v (TCPFlags %#x)", got, c.want, p.TCPFlags)
				}
			})
		}
	}
}
