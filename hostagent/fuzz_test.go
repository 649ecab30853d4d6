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
