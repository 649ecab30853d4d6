package hostagent

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// FuzzHostAgentPipeline runs arbitrary frames through the Host Agent's
// whole in-memory data path (newPipeRig: the pipelines Agent.pipelines
// wires, on a worker whose port 0 is the uplink and ports 1 and 2 are vm_a
// and vm_b) and checks every outcome against gopacket. The nat package's
// own fuzz targets drive one stage on a hand-parsed packet; this one adds
// the VXLAN decapsulation, the worker's parse and port routing, the next
// hop, both directions, and state carried from one direction to the other.
//
// An input is (port1, frame1, port2, frame2): frame1 is received on port
// port1%3 (0 uplink, 1 vm_a, 2 vm_b), then, when frame2 is not empty,
// frame2 on port2%3. Two frames let the fuzzer build a conversation — a
// client's packet in VXLAN on the uplink, then the VM's reply or ICMP
// error — from the seeds, and keep the ports free, which a fixed "frame1
// on the uplink" would not (a reply before any state, two inbound frames,
// a frame from the wrong VM port). Frames longer than the MemPorts' frames
// are cut to that size (a MemPort silently skips longer ones, as a NIC
// would, which would break the conservation check).
//
// The rig is built once per fuzzing process — a rig takes milliseconds
// (the document parsed, three MemPorts allocated), an input microseconds —
// and every check works on deltas of the worker's counters. NAT state
// therefore carries over from input to input; no check depends on its
// absence.
//
// Each frame is received, polled and then checked:
//
//   - conservation: RX grew by one and TX plus drops by one, the captured
//     frames are the TX count, and every drop is counted under a registered
//     reason other than "none";
//   - routing: a frame from the uplink leaves on the VM port its inner
//     destination MAC names, a frame from a VM port on the uplink; nothing
//     leaves on the port it came in on (the Host Agent's pipelines have no
//     stage that answers on the receiving port: no ICMP generation, see
//     datapath.go; the slow path port carries only direct connections,
//     fixedHop resolves everything else);
//   - from a VM to the slow path: a packet of a direct connection (a
//     SYN-ACK without NAT state, or a later packet of such a connection,
//     which the shared state may hold from an earlier input): TCP,
//     untranslated — the bytes are the input's but for a completed
//     partial checksum;
//   - from the uplink: the outer frame is VXLAN with VNI 100 (gopacket), the
//     output is the inner frame, no longer VXLAN, with destination VIP
//     198.18.100.1 rewritten to the VM's DIP (port 80 to 8080), the
//     Ethernet destination that VM's MAC, the inner ECN field combined
//     with the outer one as RFC 6040 section 4.2 says; an ICMP error's
//     quote rewritten to match (quoted source DIP:8080);
//   - from a VM: the output goes to the router (routerMAC from uplinkMAC,
//     fixedHop) from the VIP (DIP:8080 to 198.18.100.1:80, or the VIP
//     endpoint of the conversation frame1 established); an ICMP error's
//     quoted destination rewritten to match; a reply of an established
//     conversation is never dropped for want of state;
//   - both: the frame has its input's length and no byte changed outside
//     the fields the translation owns (addresses, ports, checksums, ECN,
//     the Ethernet addresses on return), so payloads and the rest of the
//     headers pass untouched; the IPv4 header checksum verifies exactly
//     when it did on input (inner headers are not verified, and a wrong
//     checksum must stay wrong); a TCP, UDP or ICMP checksum, and an ICMP
//     error's quoted IPv4 header checksum, that verified on input (and is
//     not of a fragment) verifies on output. gopacket computes the
//     checksums: TCP.ComputeChecksum, or a layer re-serialised with
//     ComputeChecksums and compared.
func FuzzHostAgentPipeline(f *testing.F) {
	for _, s := range pipelineSeeds(f) {
		f.Add(s.port1, s.frame1, s.port2, s.frame2)
	}
	r := newPipeRig(f, true)
	names := engine.DropReasons()
	f.Fuzz(func(t *testing.T, port1 uint8, frame1 []byte, port2 uint8, frame2 []byte) {
		c := &fuzzConv{t: t, r: r, names: names, convs: map[[2]netip.AddrPort]netip.AddrPort{}}
		c.step(int(port1%3), frame1)
		if len(frame2) > 0 {
			c.step(int(port2%3), frame2)
		}
	})
}

// fuzzMaxFrame is the longest frame newPipeRig's MemPorts receive: their
// default frame size less the headroom.
const fuzzMaxFrame = 2048 - engine.DefaultHeadroom

// What pipeDoc puts behind each VM port (worker port index).
var fuzzVMs = [3]struct {
	mac net.HardwareAddr
	dip netip.Addr
}{
	1: {net.HardwareAddr{2, 0, 0, 0, 4, 1}, netip.MustParseAddr("198.18.4.1")},
	2: {net.HardwareAddr{2, 0, 0, 0, 4, 2}, netip.MustParseAddr("198.18.4.2")},
}

const fuzzDIPPort = 8080 // both backends' port in pipeDoc

// fuzzConv runs one fuzz input: a frame or two on the shared rig.
type fuzzConv struct {
	t     *testing.T
	r     *pipeRig
	names []string // registered drop reasons, by value
	// convs are the connections this input's inbound frames established:
	// return key (DIP endpoint, client endpoint) → the VIP endpoint.
	convs map[[2]netip.AddrPort]netip.AddrPort
}

// parseReasons are the drops of a frame the engine's parser refuses.
var parseReasons = map[string]bool{"truncated": true, "bad_l2": true, "not_ip": true,
	"bad_ipv4": true, "bad_ipv6": true, "bad_l4": true}

// step receives frame on port in, polls, and checks the outcome.
func (c *fuzzConv) step(in int, frame []byte) {
	t, r := c.t, c.r
	if len(frame) > fuzzMaxFrame {
		frame = frame[:fuzzMaxFrame]
	}
	var before, after engine.Stats
	r.w.Counters().Snapshot(&before)
	r.ports[in].Inject(frame)
	n := r.w.Poll()
	r.w.Counters().Snapshot(&after)

	out, outPort := []byte(nil), -1
	sent := 0
	for i, p := range r.ports {
		for _, f := range p.Transmitted() {
			out, outPort = f, i
			sent++
		}
	}
	reason := ""
	var dropped uint64
	for i := range after.Drops {
		d := after.Drops[i] - before.Drops[i]
		if d == 0 {
			continue
		}
		require.Truef(t, i != 0 && i < len(c.names), "%d drops counted under reason %d, which has no registered name", d, i)
		reason = c.names[i]
		dropped += d
	}
	require.Equal(t, 1, n, "frames received by Poll")
	require.EqualValues(t, 1, after.RX-before.RX, "RX")
	require.EqualValues(t, 1, after.TX-before.TX+dropped, "TX %d + drops %d for one frame received",
		after.TX-before.TX, dropped)
	require.EqualValues(t, after.TX-before.TX, sent, "frames captured on the ports")

	if sent == 0 {
		c.dropped(in, frame, reason)
		return
	}
	require.NotEqual(t, in, outPort, "a frame left on the port it came in on")
	if in == UplinkPort {
		c.inbound(frame, out, outPort)
	} else if outPort == len(r.ports)-1 {
		c.direct(frame, out)
	} else {
		require.Equal(t, UplinkPort, outPort, "a frame from VM port %d left on port %d", in, outPort)
		c.reply(frame, out)
	}
}

// direct checks a frame from a VM that left on the slow path: a TCP
// segment of no connection this input made through the VIP, byte for byte
// the input but for a partial checksum completed (gpkt.CompletePartialIP).
// (The rig has no steering program, which in a node sends only a DIP's
// service-port traffic to this pipeline.)
func (c *fuzzConv) direct(frame, out []byte) {
	t := c.t
	d := decodeFuzzFrame(frame)
	require.True(t, d.ok() && d.kind == kindPorts && d.proto == layers.IPProtocolTCP,
		"a frame that is not TCP left on the slow path: %v", d.pkt)
	_, known := c.convs[[2]netip.AddrPort{d.src(), d.dst()}]
	require.False(t, known, "a reply of a connection through the VIP left untranslated")
	want := slices.Clone(frame)
	copy(want[d.l3:], gpkt.CompletePartialIP(frame[d.l3:d.end]))
	// The host routes it: TTL one less, the IPv4 header checksum as right
	// or wrong as it was (an incremental update).
	o := decodeFuzzFrame(out)
	require.True(t, o.ok(), "the output is not Ethernet/IP to gopacket: %v", o.pkt)
	ttl := c.ttl(d, o)
	want[ttl.off] = out[ttl.off]
	if d.ip4 != nil {
		copy(want[d.l3+10:d.l3+12], out[d.l3+10:d.l3+12])
		require.Equal(t, ipv4ChecksumOK(frame[d.l3:]), ipv4ChecksumOK(out[o.l3:]), "IPv4 header checksum validity")
	}
	require.Equal(t, want, out, "a direct connection's packet changed")
}

// dropped checks what can be said of a dropped frame.
func (c *fuzzConv) dropped(in int, frame []byte, reason string) {
	t := c.t
	if in == UplinkPort && (reason == "src_vip" || reason == "src_martian") {
		// The client filter: gopacket's inner source is what the reason
		// says.
		_, inner, ok := decapOracle(frame)
		require.True(t, ok, "%s for a frame gopacket finds no VXLAN in", reason)
		d := decodeFuzzFrame(inner)
		require.True(t, d.ok(), "%s for an inner frame gopacket cannot read", reason)
		require.Equal(t, reason, fuzzSpoofed(d.srcAddr()), "%s for inner source %v", reason, d.srcAddr())
		return
	}
	if in == UplinkPort && reason == "bad_tunnel_source" {
		outer, _, ok := decapOracle(frame)
		if ok {
			require.NotEqual(t, pipeMux, outer.srcAddr(), "VXLAN from the Mux (mux_prefixes) dropped as bad_tunnel_source")
		}
		return
	}
	if in != UplinkPort && (reason == "src_vip" || reason == "src_martian" || reason == "ttl_exceeded") {
		d := decodeFuzzFrame(frame)
		require.True(t, d.ok(), "%s for a frame gopacket cannot read", reason)
		if reason == "ttl_exceeded" {
			require.LessOrEqual(t, d.ttl(), uint8(1), "ttl_exceeded for TTL / hop limit %d", d.ttl())
		} else {
			require.Equal(t, reason, fuzzSpoofed(d.dstAddr()), "%s for a reply to %v", reason, d.dstAddr())
		}
		return
	}
	if in == UplinkPort {
		if reason == "ecn_ce_not_ect" {
			outer, inner, ok := decapOracle(frame)
			if ok {
				if d := decodeFuzzFrame(inner); d.ok() {
					require.Equal(t, ecnCE, ipECN(outer), "ecn_ce_not_ect without outer CE")
					require.Equal(t, ecnNotECT, d.ecn(), "ecn_ce_not_ect of an ECN-capable inner packet")
				}
			}
		}
		return
	}
	d := decodeFuzzFrame(frame)
	if d.kind != kindPorts || d.proto != layers.IPProtocolTCP || d.truncated {
		return
	}
	if _, ok := c.convs[[2]netip.AddrPort{d.src(), d.dst()}]; ok {
		// gopacket reads a whole TCP segment of a connection this input
		// established: only the parser may refuse it.
		require.Truef(t, parseReasons[reason], "a reply of an established connection dropped: %s", reason)
	}
}

// inbound checks a frame received on the uplink and transmitted on the VM
// port vm.
func (c *fuzzConv) inbound(frame, out []byte, vm int) {
	t := c.t
	require.Contains(t, []int{1, 2}, vm, "a frame from the uplink left on port %d", vm)
	outer, inner, ok := decapOracle(frame)
	require.True(t, ok, "transmitted, but gopacket finds no VXLAN: %v", gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default))
	require.EqualValues(t, 100, outer.vxlan.VNI, "VNI")

	i, o := decodeFuzzFrame(inner), decodeFuzzFrame(out)
	require.True(t, o.ok(), "the output is not Ethernet/IP to gopacket: %v", o.pkt)
	require.Nil(t, o.pkt.Layer(layers.LayerTypeVXLAN), "the output is still VXLAN")
	require.True(t, i.ok(), "the inner frame is not Ethernet/IP to gopacket: %v", i.pkt)
	require.Equal(t, len(inner), len(out), "length of the inner frame and of the output")
	require.Equal(t, fuzzVMs[vm].mac.String(), o.eth.DstMAC.String(), "Ethernet destination")
	require.Equal(t, fuzzVMs[vm].dip, o.dstAddr(), "IP destination")

	// ECN: RFC 6040 section 4.2, normal mode.
	want := rfc6040[i.ecn()][ipECN(outer)]
	require.NotEqual(t, ecnDrop, want, "forwarded what RFC 6040 drops")
	require.Empty(t, fuzzSpoofed(i.srcAddr()), "delivered a packet from a spoofed client %v", i.srcAddr())
	require.Equal(t, pipeMux, outer.srcAddr(), "delivered VXLAN from %v, not a Mux (mux_prefixes)", outer.srcAddr())
	require.Equal(t, want, o.ecn(), "inner ECN after decapsulation (inner %d, outer %d)", i.ecn(), ipECN(outer))

	allowed := []span{o.addrSpan(false), o.ecnSpan()}
	if i.kind != kindICMPError {
		// An ICMP error names its connection by its quote alone: its
		// outer destination is rewritten whatever it was.
		require.Equal(t, pipeVIP.Addr(), i.dstAddr(), "translated a packet not sent to the VIP")
	}
	switch i.kind {
	case kindPorts:
		require.Equal(t, pipeVIP.Port(), i.dstPort(), "VIP port")
		require.EqualValues(t, fuzzDIPPort, o.dstPort(), "DIP port")
		allowed = append(allowed, span{o.l4 + 2, 2}, o.l4ChecksumSpan())
		if i.proto == layers.IPProtocolTCP {
			c.convs[[2]netip.AddrPort{o.dst(), o.src()}] = i.dst()
		}
	case kindFragment:
	case kindICMPError:
		allowed = append(allowed, span{o.l4 + 2, 2})
		allowed = append(allowed, c.quote(i, o, true, []netip.Addr{pipeVIP.Addr()}, pipeVIP.Port(), fuzzVMs[vm].dip, fuzzDIPPort)...)
	default:
		require.Failf(t, "translated a packet that is neither TCP/UDP, a fragment nor an ICMP error", "%v", i.pkt)
	}
	c.common(i, o, allowed)
}

// reply checks a frame received on a VM port and transmitted on the uplink.
func (c *fuzzConv) reply(frame, out []byte) {
	t := c.t
	i, o := decodeFuzzFrame(frame), decodeFuzzFrame(out)
	require.True(t, o.ok(), "the output is not Ethernet/IP to gopacket: %v", o.pkt)
	require.True(t, i.ok(), "the input is not Ethernet/IP to gopacket: %v", i.pkt)
	require.Equal(t, len(frame), len(out), "length")
	require.Equal(t, routerMAC.String(), o.eth.DstMAC.String(), "Ethernet destination")
	require.Equal(t, uplinkMAC.String(), o.eth.SrcMAC.String(), "Ethernet source")
	require.Equal(t, pipeVIP.Addr(), o.srcAddr(), "IP source")
	require.Empty(t, fuzzSpoofed(i.dstAddr()), "a reply to a spoofed client %v left", i.dstAddr())
	dips := []netip.Addr{fuzzVMs[1].dip, fuzzVMs[2].dip}
	if i.kind != kindICMPError {
		// An ICMP error names its connection by its quote alone: its
		// outer source is rewritten whatever it was.
		require.Contains(t, dips, i.srcAddr(), "translated a packet not from a DIP")
	}

	allowed := []span{{0, 12}, o.addrSpan(true), c.ttl(i, o)}
	switch i.kind {
	case kindPorts:
		require.EqualValues(t, fuzzDIPPort, i.srcPort(), "DIP port")
		want := pipeVIP
		if i.proto == layers.IPProtocolTCP {
			if v, ok := c.convs[[2]netip.AddrPort{i.src(), i.dst()}]; ok {
				want = v
			}
		}
		require.Equal(t, want, o.src(), "source of the reply")
		allowed = append(allowed, span{o.l4, 2}, o.l4ChecksumSpan())
	case kindFragment:
	case kindICMPError:
		allowed = append(allowed, span{o.l4 + 2, 2})
		allowed = append(allowed, c.quote(i, o, false, dips, fuzzDIPPort, pipeVIP.Addr(), pipeVIP.Port())...)
	default:
		require.Failf(t, "translated a packet that is neither TCP/UDP, a fragment nor an ICMP error", "%v", i.pkt)
	}
	c.common(i, o, allowed)
}

// ttl checks that a frame from a VM left with the TTL / hop limit of i
// one less (i's was 2 or more) and returns that byte's span.
func (c *fuzzConv) ttl(i, o *fuzzFrame) span {
	c.t.Helper()
	require.Greater(c.t, i.ttl(), uint8(1), "forwarded with TTL / hop limit %d", i.ttl())
	require.Equal(c.t, i.ttl()-1, o.ttl(), "TTL / hop limit of the routed packet")
	if o.ip4 != nil {
		return span{o.l3 + 8, 1}
	}
	return span{o.l3 + 7, 1}
}

// fuzzSpoofed returns the client filter's reason for a client address a
// (the inner source inbound, a reply's destination): src_martian for
// 0/8, 127/8, 224/4, 255.255.255.255, ::, ::1, ff00::/8 and
// ::ffff:0:0/96, src_vip for the VIP, "" otherwise.
func fuzzSpoofed(a netip.Addr) string {
	switch {
	case a.Is4() && (a.As4()[0] == 0 || a.IsLoopback() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255})),
		a.Is6() && (a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.Is4In6()):
		return "src_martian"
	case a == pipeVIP.Addr():
		return "src_vip"
	}
	return ""
}

// common checks what both directions promise: only the allowed bytes
// changed, and the IPv4 header and transport checksums verify if they
// did.
func (c *fuzzConv) common(i, o *fuzzFrame, allowed []span) {
	t := c.t
	if o.ip4 != nil {
		// Neither the parser nor the NAT verifies an inner IPv4 header
		// checksum; the incremental rewrite (RFC 1624) keeps a wrong one
		// wrong, so that the receiver still drops the packet.
		allowed = append(allowed, span{o.l3 + 10, 2})
		require.Equal(t, ipv4ChecksumOK(i.b[i.l3:]), ipv4ChecksumOK(o.b[o.l3:]), "IPv4 header checksum validity")
	}
	for k := range i.b {
		if i.b[k] != o.b[k] && !inSpans(allowed, k) {
			require.Failf(t, "a byte outside the translated fields changed",
				"offset %d: %#02x → %#02x\nin:  %x\nout: %x", k, i.b[k], o.b[k], i.b, o.b)
		}
	}
	if v, known := l4ChecksumOK(i); known && v {
		v, _ = l4ChecksumOK(o)
		require.True(t, v, "%v checksum verified on input, not on output", i.proto)
	}
}

// quote checks an ICMP error's quote before and after translation and
// returns the bytes the translation may change in it. Inbound, the quoted
// source (the VIP reply's, one of from:fromPort) becomes to:toPort, the
// DIP endpoint; on return the quoted destination (the client packet's, a
// DIP endpoint) becomes the VIP endpoint.
func (c *fuzzConv) quote(i, o *fuzzFrame, inbound bool, from []netip.Addr, fromPort uint16, to netip.Addr, toPort uint16) []span {
	t := c.t
	q := o.l4 + 8 // the quoted IP header, after the 8-byte ICMP header
	qi, qo := i.b[q:i.end], o.b[q:o.end]
	var spans []span
	var ihl, aoff, alen int
	var proto byte
	switch {
	case len(qo) >= 20 && qo[0]>>4 == 4 && o.ip4 != nil:
		ihl, alen, proto = int(qo[0]&0x0f)*4, 4, qo[9]
		aoff = 16 // destination
		if inbound {
			aoff = 12 // source
		}
		spans = append(spans, span{q + 10, 2})
		if ihl >= 20 && len(qi) >= ihl && ipv4ChecksumOK(qi) {
			require.True(t, ipv4ChecksumOK(qo), "quoted IPv4 header checksum verified on input, not on output")
		}
	case len(qo) >= 40 && qo[0]>>4 == 6 && o.ip6 != nil:
		ihl, alen, proto = 40, 16, qo[6]
		aoff = 24
		if inbound {
			aoff = 8
		}
	default:
		require.Fail(t, "translated an ICMP error without a readable quote")
	}
	spans = append(spans, span{q + aoff, alen})
	a, _ := netip.AddrFromSlice(qi[aoff : aoff+alen])
	require.Contains(t, from, a, "quoted address before translation")
	require.Equal(t, to.AsSlice(), qo[aoff:aoff+alen], "quoted address")

	ql4 := q + ihl
	poff := 2 // the quoted port: the destination, or the source inbound
	if inbound {
		poff = 0
	}
	switch proto {
	case byte(layers.IPProtocolTCP):
		spans = append(spans, span{ql4 + poff, 2}, span{ql4 + 16, 2})
	case byte(layers.IPProtocolUDP):
		spans = append(spans, span{ql4 + poff, 2}, span{ql4 + 6, 2})
	case byte(layers.IPProtocolICMPv6):
		return append(spans, span{ql4 + 2, 2})
	default:
		return spans
	}
	require.GreaterOrEqual(t, o.end, ql4+4, "translated a quote without its ports")
	require.Equal(t, fromPort, binary.BigEndian.Uint16(i.b[ql4+poff:]), "quoted port before translation")
	require.Equal(t, toPort, binary.BigEndian.Uint16(o.b[ql4+poff:]), "quoted port")
	return spans
}

// span is a range of frame bytes a translation may change.
type span struct{ off, n int }

func inSpans(ss []span, k int) bool {
	for _, s := range ss {
		if k >= s.off && k < s.off+s.n {
			return true
		}
	}
	return false
}

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

// pipelineSeed is one f.Add.
type pipelineSeed struct {
	port1  uint8
	frame1 []byte
	port2  uint8
	frame2 []byte
}

// pipelineSeeds are conversations and single frames of every kind the
// pipelines translate, and many they refuse.
func pipelineSeeds(tb testing.TB) []pipelineSeed {
	macA, macB := fuzzVMs[1].mac, fuzzVMs[2].mac
	dipA := netip.AddrPortFrom(fuzzVMs[1].dip, fuzzDIPPort)
	dipB := netip.AddrPortFrom(fuzzVMs[2].dip, fuzzDIPPort)
	clientMAC := net.HardwareAddr{2, 0, 0, 0, 0xee, 1}
	router := netip.MustParseAddr("198.18.50.1")

	// The round trip of TestPipelinesDSRRoundTrip.
	inA, inB := vxlanFrame(tb, macA, "GET /"), vxlanFrame(tb, macB, "GET /")
	replyA := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macA, dipA, pipeClient, true, true, "")...)
	replyB := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macB, dipB, pipeClient, true, true, "")...)
	finA := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macA, dipA, pipeClient, false, true, "bye")...)
	finA[14+20+13] |= 0x01 // FIN (the checksum is then wrong: a fuzzer's kind of input)
	badIPSum := append([]byte(nil), replyA...)
	badIPSum[14+10] ^= 0x5a // a wrong IPv4 header checksum stays wrong

	// Inner frames, wrapped in VXLAN like vxlanFrame's.
	client := func(syn, ack bool, payload string) []gopacket.SerializableLayer {
		return tcpLayers(macA, clientMAC, pipeClient, pipeVIP, syn, ack, payload)
	}
	ack := gpkt.Serialize(tb, client(false, true, "more data")...)
	frag1 := client(false, true, "first fragment, with the ports")
	frag1[1].(*layers.IPv4).Flags = layers.IPv4MoreFragments
	fragN := client(false, true, "")
	fragN[1].(*layers.IPv4).FragOffset = 3
	fragN[1].(*layers.IPv4).Protocol = layers.IPProtocolTCP
	fragN = append(fragN[:2], gopacket.Payload("the rest of the datagram"))
	vlan := client(false, true, "tagged")
	vlan[0].(*layers.Ethernet).EthernetType = layers.EthernetTypeDot1Q
	vlan = append([]gopacket.SerializableLayer{vlan[0], &layers.Dot1Q{VLANIdentifier: 5, Type: layers.EthernetTypeIPv4}}, vlan[1:]...)
	ect0 := client(false, true, "ect0")
	ect0[1].(*layers.IPv4).TOS = ecnECT0

	udpIn := func(csum bool) []byte {
		eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: macA, EthernetType: layers.EthernetTypeIPv4}
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: pipeClient.Addr().AsSlice(), DstIP: pipeVIP.Addr().AsSlice()}
		u := &layers.UDP{SrcPort: 40001, DstPort: 80}
		if csum {
			_ = u.SetNetworkLayerForChecksum(ip)
			return gpkt.Serialize(tb, eth, ip, u, gopacket.Payload("no UDP VIP"))
		}
		buf := gopacket.NewSerializeBuffer()
		require.NoError(tb, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, eth, ip, u, gopacket.Payload("no checksum")))
		f := append([]byte(nil), buf.Bytes()...)
		binary.BigEndian.PutUint16(f[14+10:], 0)
		binary.BigEndian.PutUint16(f[14+10:], gpkt.Checksum(f[14:34]))
		return f
	}
	ipv6In := func() []byte {
		eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: macA, EthernetType: layers.EthernetTypeIPv6}
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP,
			SrcIP: net.ParseIP("2001:db8:5::2"), DstIP: net.ParseIP("2001:db8:100::1")}
		tcp := &layers.TCP{SrcPort: 40000, DstPort: 80, SYN: true, Window: 1000}
		_ = tcp.SetNetworkLayerForChecksum(ip)
		return gpkt.Serialize(tb, eth, ip, tcp, gopacket.Payload("v6"))
	}

	// ICMP errors. Inbound: a router about the VIP's reply to the client,
	// which the Mux sends to the DIP's host. Return: the VM about the
	// client's packet, which it received translated.
	icmpErr := func(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, code uint8, quote []byte) []byte {
		eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv4}
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, code), Seq: 1400}
		return gpkt.Serialize(tb, eth, ip, icmp, gopacket.Payload(quote))
	}
	vipReply := gpkt.Serialize(tb, tcpLayers(clientMAC, macA, pipeVIP, pipeClient, true, true, "")[1:]...)
	toDIP := gpkt.Serialize(tb, tcpLayers(macA, clientMAC, pipeClient, dipA, true, false, "GET /")[1:]...)
	routerErr := icmpErr(macA, clientMAC, router, pipeVIP.Addr(), layers.ICMPv4CodeFragmentationNeeded, vipReply)
	routerErrShort := icmpErr(macA, clientMAC, router, pipeVIP.Addr(), layers.ICMPv4CodeFragmentationNeeded, vipReply[:28])
	vmErr := icmpErr(uplinkMAC, macA, dipA.Addr(), pipeClient.Addr(), layers.ICMPv4CodePort, toDIP)
	vmErrShort := icmpErr(uplinkMAC, macA, dipA.Addr(), pipeClient.Addr(), layers.ICMPv4CodePort, toDIP[:28])
	// An error from another address of the VM (its own router, say): the
	// quote names the connection, the outer source becomes the VIP too.
	vmErrOther := icmpErr(uplinkMAC, macA, netip.MustParseAddr("198.18.4.254"), pipeClient.Addr(), layers.ICMPv4CodeFragmentationNeeded, toDIP)

	// Return oddities.
	fragReply := tcpLayers(uplinkMAC, macA, dipA, pipeClient, false, true, "")
	fragReply[1].(*layers.IPv4).FragOffset = 3
	fragReply = append(fragReply[:2], gopacket.Payload("tail of a reply"))
	toInfra := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macA, dipA, netip.MustParseAddrPort("198.18.1.2:5000"), true, true, "")...)
	synOut := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macA, dipA, pipeClient, true, false, "")...)
	wrongVM := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macB, dipB, pipeClient, false, true, "from vm_b's DIP on vm_a")...)

	// Malformed VXLAN.
	noI := wrapVXLAN(tb, ack, func(_ *layers.IPv4, vx *layers.VXLAN) { vx.ValidIDFlag = false })
	shortVXLAN := func() []byte {
		p := gopacket.NewPacket(inA, layers.LayerTypeEthernet, gopacket.Default)
		eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		udp := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		_ = udp.SetNetworkLayerForChecksum(ip)
		return gpkt.Serialize(tb, eth, ip, udp, gopacket.Payload{0x08, 0, 0})
	}()
	ce := func(ip *layers.IPv4, _ *layers.VXLAN) { ip.TOS = ecnCE }
	ect1 := func(ip *layers.IPv4, _ *layers.VXLAN) { ip.TOS = ecnECT1 }

	// Spoofed clients and tunnels, expiring replies (TestPipelinesGuard).
	fromVIP := gpkt.Serialize(tb, tcpLayers(macA, clientMAC, pipeVIP, pipeVIP, true, false, "loop")...)
	fromLoopback := gpkt.Serialize(tb, tcpLayers(macA, clientMAC, netip.MustParseAddrPort("127.0.0.1:40000"), pipeVIP, true, false, "")...)
	notMux := wrapVXLAN(tb, ack, func(ip *layers.IPv4, _ *layers.VXLAN) { ip.SrcIP = pipeClient.Addr().AsSlice() })
	toVIP := gpkt.Serialize(tb, tcpLayers(uplinkMAC, macA, dipA, pipeVIP, true, true, "")...)
	ttlReply := func(ttl uint8) []byte {
		ls := tcpLayers(uplinkMAC, macA, dipA, pipeClient, true, true, "")
		ls[1].(*layers.IPv4).TTL = ttl
		return gpkt.Serialize(tb, ls...)
	}

	up := func(frame []byte) pipelineSeed { return pipelineSeed{port1: UplinkPort, frame1: frame} }
	conv := func(frame1 []byte, vm uint8, frame2 []byte) pipelineSeed {
		return pipelineSeed{port1: UplinkPort, frame1: frame1, port2: vm, frame2: frame2}
	}
	return []pipelineSeed{
		conv(inA, 1, replyA),
		conv(inB, 2, replyB),
		conv(inA, 1, finA),
		conv(inA, 1, vmErr),
		conv(inA, 1, vmErrShort),
		conv(inA, 1, vmErrOther),
		conv(inA, 1, synOut),
		conv(inA, 1, wrongVM),
		conv(inB, 1, replyA),
		conv(wrapVXLAN(tb, ack, nil), 1, replyA),
		up(wrapVXLAN(tb, gpkt.Serialize(tb, frag1...), nil)),
		up(wrapVXLAN(tb, gpkt.Serialize(tb, fragN...), nil)),
		up(wrapVXLAN(tb, gpkt.Serialize(tb, vlan...), nil)),
		up(wrapVXLAN(tb, gpkt.Serialize(tb, ect0...), ce)),
		up(wrapVXLAN(tb, gpkt.Serialize(tb, ect0...), ect1)),
		up(wrapVXLAN(tb, ack, ce)),
		up(wrapVXLAN(tb, udpIn(true), nil)),
		up(wrapVXLAN(tb, udpIn(false), nil)),
		up(wrapVXLAN(tb, ipv6In(), nil)),
		up(wrapVXLAN(tb, routerErr, nil)),
		up(wrapVXLAN(tb, routerErrShort, nil)),
		up(wrapVXLAN(tb, ack, func(_ *layers.IPv4, vx *layers.VXLAN) { vx.VNI = 200 })),
		up(vxlanFrame(tb, net.HardwareAddr{2, 0, 0, 0, 9, 9}, "unknown inner MAC")),
		up(noI),
		up(shortVXLAN),
		up(inA[:46]),
		up(inA[:len(inA)-3]),
		up(append(append([]byte(nil), inA...), make([]byte, 20)...)), // Ethernet padding
		up(replyA), // not VXLAN
		{port1: 1, frame1: replyA},
		{port1: 2, frame1: replyB},
		{port1: 1, frame1: vmErr},
		{port1: 1, frame1: gpkt.Serialize(tb, fragReply...)},
		{port1: 1, frame1: badIPSum},
		{port1: 1, frame1: toInfra},
		{port1: 1, frame1: inA}, // VXLAN from a VM: not the VM port's business
		{port1: 2, frame1: []byte("garbage, not even an Ethernet header's worth of sense")},
		{port1: 0, frame1: []byte{}},
		{port1: 1, frame1: make([]byte, 60)},
		{port1: 0, frame1: arpRequest()},
		up(wrapVXLAN(tb, fromVIP, nil)),
		up(wrapVXLAN(tb, fromLoopback, nil)),
		up(notMux),
		conv(inA, 1, toVIP),
		conv(inA, 1, ttlReply(1)),
		conv(inA, 1, ttlReply(2)),
	}
}

// arpRequest is an ARP request on the uplink: not IP at all.
func arpRequest() []byte {
	b := make([]byte, 42)
	copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(b[6:], routerMAC)
	binary.BigEndian.PutUint16(b[12:], uint16(layers.EthernetTypeARP))
	copy(b[14:], []byte{0, 1, 8, 0, 6, 4, 0, 1}) // Ethernet, IPv4, request
	return b
}
