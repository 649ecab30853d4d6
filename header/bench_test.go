package header

import (
	"strconv"
	"testing"

	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

func BenchmarkChecksum(b *testing.B) {
	for _, n := range []int{64, 1500} {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(i)
		}
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				sinkU16 = Checksum(buf, 0)
			}
		})
		b.Run(strconv.Itoa(n)+"/reference", func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				sinkU16 = gpkt.Sum(buf, 0)
			}
		})
	}
}

// BenchmarkParse walks a VXLAN frame the way a data path does: outer
// Ethernet, IPv4, UDP, VXLAN, inner Ethernet with a VLAN tag, IPv4, TCP.
func BenchmarkParse(b *testing.B) {
	g := goldenFrames(b)
	frame := g[len(g)-1].frame // vxlan inner dot1q ipv4 tcp
	b.ReportAllocs()
	var sum uint32
	for b.Loop() {
		_, off, err := ParseEthernet(frame)
		if err != nil {
			b.Fatal(err)
		}
		ip := IPv4(frame[off:])
		if ip.Check() != nil {
			b.Fatal("ip")
		}
		u := UDP(ip.Payload())
		if u.Check() != nil {
			b.Fatal("udp")
		}
		v := VXLAN(u.Payload())
		if v.Check() != nil {
			b.Fatal("vxlan")
		}
		inner := v.Payload()
		_, off, err = ParseEthernet(inner)
		if err != nil {
			b.Fatal(err)
		}
		iip := IPv4(inner[off:])
		if iip.Check() != nil {
			b.Fatal("inner ip")
		}
		t := TCP(iip.Payload())
		if t.Check() != nil {
			b.Fatal("tcp")
		}
		sum += v.VNI() + uint32(t.SrcPort()) + uint32(t.DstPort())
	}
	sinkInt = int(sum)
}

// BenchmarkParseIPv6Extensions walks the IPv6 extension header chain
// (Hop-by-Hop, Destination Options, Routing, Fragment) to TCP.
func BenchmarkParseIPv6Extensions(b *testing.B) {
	var frame []byte
	for _, g := range goldenFrames(b) {
		if g.name == "ipv6 hbh destopts routing fragment tcp" {
			frame = g.frame
		}
	}
	ip := IPv6(frame[EthernetSize:])
	b.ReportAllocs()
	for b.Loop() {
		_, sinkInt, _, sinkErr = ip.TransportHeader()
	}
}

// BenchmarkRewriteIPv4TCP is one NAT rewrite: address and port with the IP
// and TCP checksums updated incrementally.
func BenchmarkRewriteIPv4TCP(b *testing.B) {
	frame := goldenFrames(b)[0].frame
	_, off, _ := ParseEthernet(frame)
	ip := IPv4(frame[off:])
	addrs := [2][4]byte{{198, 18, 0, 10}, {198, 18, 0, 11}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		sinkErr = RewriteIPv4(ip, SideDst, addrs[i&1], uint16(i))
	}
}
