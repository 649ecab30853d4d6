package mux

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// FuzzMuxPipeline drives the Mux's whole in-memory data path — the stages
// of ourMuxStages (Parse → source filter → uplink VNI → ICMP → balance → encap (TTL) → next hop
// → account) over benchDocument, in a Worker polling one MemPort — with
// arbitrary frames, and checks with gopacket as the oracle what comes out:
//
//   - Conservation: per input, the RX delta is the number of frames
//     injected, and equals the TX delta plus the drop delta; every drop
//     has a registered, non-empty reason (never reason 0); TX counts the
//     frames the port captured.
//   - Spoofed sources (muxSpoofed: a VIP, the Mux, an infrastructure
//     prefix unless the frame is an ICMP error, a martian) are never
//     transmitted in any form and are dropped with their src_* reason
//     unless the parser refused the frame first; no other frame gets a
//     src_* reason; ttl_exceeded only for a TTL / hop limit of 1 or 0.
//   - Everything transmitted is either (1) VXLAN from the Mux to a host of
//     the VIP the injected packet is for (see checkVXLAN: outer header
//     fields, lengths and IPv4 header checksum, VNI, backend MAC and host,
//     and the inner IP packet byte for byte the injected one but for its
//     TTL / hop limit, one less, and an IPv4 header checksum exactly as
//     right or wrong as it was (a TCP/UDP
//     checksum left partial completed: gpkt.CompletePartialIP), VLAN tags
//     and Ethernet padding gone), or (2) an ICMP message the Mux made for
//     the injected frame's sender: an echo reply to a ping of a VIP
//     address, or fragmentation needed / packet too big quoting a packet
//     the tunnel cannot carry (see checkMuxICMP), with valid checksums.
//     Inputs that are neither (no VIP flow, malformed, rate-limited) must
//     be dropped.
//   - With twice set, the same frame is injected a second time (in its own
//     poll, or with sameBatch in the same batch as the first copy): when the
//     first copy was encapsulated, so is the second, to the same backend,
//     in a byte-identical frame — the flow stays put (connection-table hit
//     after the miss, or two lookups in one batch).
//
// Checksums: IPv4 header checksums are verified with gpkt.Checksum, a
// plain RFC 1071 loop independent of package header; ICMP and
// ICMPv6 checksums by re-serialising the message with gopacket
// (ComputeChecksums; for ICMPv6 with the IPv6 pseudo-header through
// SetNetworkLayerForChecksum) and comparing the bytes.
//
// The rig is built once per fuzzing process (a 300-backend Maglev document
// costs tens of milliseconds, far more than an input), so connection-table
// entries, rate limits and next-hop caches carry over between inputs; the
// invariants are per input and read counter deltas. The rate limits of
// echo replies and ICMP errors make later such inputs drops (counted with a
// reason), which the invariants allow.
func FuzzMuxPipeline(f *testing.F) {
	for _, s := range muxFuzzSeeds(f) {
		f.Add(s.frame, s.twice, s.sameBatch)
	}
	m := newMuxFuzzRig(f)
	f.Fuzz(func(t *testing.T, frame []byte, twice, sameBatch bool) {
		m.run(t, frame, twice, sameBatch)
	})
}

// TestMuxFuzzSeeds runs each seed of FuzzMuxPipeline through a fresh rig
// (no rate limit spent, no flow known) and checks the outcome the seed is
// there for, so the fuzz target's invariants are known to be exercised on
// every path: encapsulation, echo reply, fragmentation needed, packet too
// big, an ICMP error following its flow, and the drops.
func TestMuxFuzzSeeds(t *testing.T) {
	m := newMuxFuzzRig(t)
	seeds := muxFuzzSeeds(t)
	byName := map[string]muxOutcome{}
	for _, s := range seeds {
		t.Run(s.name, func(t *testing.T) {
			got := m.run(t, s.frame, s.twice, s.sameBatch)
			byName[s.name] = got
			require.Equal(t, s.want, got.summary(), "outcome; drops %v", got.drops)
			if s.sameBackendAs != "" {
				prev, ok := byName[s.sameBackendAs]
				if !ok { // filtered out by -run: send its flow now
					for _, o := range seeds {
						if o.name == s.sameBackendAs {
							prev = m.run(t, o.frame, false, false)
						}
					}
				}
				require.NotEmpty(t, prev.backends)
				require.NotEmpty(t, got.backends)
				require.Equal(t, prev.backends[0], got.backends[0],
					"the ICMP error goes to its flow's backend (MAC, host)")
			}
		})
	}
}

// muxFuzzMaxFrame is the largest frame a default MemPort receives (a
// buffer less its headroom); it skips longer ones without counting them,
// as a NIC would, so the fuzz target skips them too.
const muxFuzzMaxFrame = 2048 - engine.DefaultHeadroom

// muxFuzzRig is the pipeline under test and the document it runs.
type muxFuzzRig struct {
	rig *muxRig
	// backends maps a backend MAC to its VIP (index in benchVIPs) and host.
	backends map[[6]byte]muxFuzzBackend
}

type muxFuzzBackend struct {
	vip  int
	host netip.Addr
}

func newMuxFuzzRig(tb testing.TB) *muxFuzzRig {
	doc := benchDocument(tb)
	m := &muxFuzzRig{
		rig:      newMuxRig(tb, true, ourMuxStages(tb, doc, muxConnTable(tb, 1<<14))...),
		backends: map[[6]byte]muxFuzzBackend{},
	}
	require.Len(tb, doc.VIPs, len(benchVIPs))
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		require.Equal(tb, benchVIPs[i].addr.Addr(), v.Address)
		for _, be := range v.Backends {
			_, dup := m.backends[be.MAC]
			require.False(tb, dup, "backend MACs are distinct across VIPs")
			m.backends[be.MAC] = muxFuzzBackend{vip: i, host: be.Host}
		}
	}
	return m
}

// muxOutcome is what one input produced.
type muxOutcome struct {
	kinds    []string               // per transmitted frame: vxlan, echo-reply, frag-needed, packet-too-big
	backends []muxFuzzBackendChoice // per VXLAN frame
	vxlan    [][]byte               // the VXLAN frames
	drops    map[string]uint64      // drop delta by reason
	stats    [2]engine.Stats        // before, after
}

// muxFuzzBackendChoice is where a VXLAN frame went: inner destination MAC
// and outer destination.
type muxFuzzBackendChoice struct {
	mac  [6]byte
	host netip.Addr
}

// summary is the outcome as the seed table states it: the transmitted
// kinds in order, then "drop:<reason>" per dropped frame, sorted by
// reason.
func (o muxOutcome) summary() []string {
	s := append([]string(nil), o.kinds...)
	for _, name := range engine.DropReasons() {
		for i := uint64(0); i < o.drops[name]; i++ {
			s = append(s, "drop:"+name)
		}
	}
	return s
}

// run injects frame (twice: two copies, in two polls or with sameBatch in
// one), polls until the port's queue is empty and checks the invariants.
func (m *muxFuzzRig) run(t *testing.T, frame []byte, twice, sameBatch bool) muxOutcome {
	if len(frame) > muxFuzzMaxFrame {
		return muxOutcome{} // the port would not receive it
	}
	r := m.rig
	drain := func() {
		for r.port.Stats().Queued > 0 {
			r.w.Poll()
		}
	}
	copies := 1
	if twice {
		copies = 2
	}
	var o muxOutcome
	o.stats[0] = r.stats()
	var out [][]byte
	switch {
	case twice && sameBatch:
		r.port.Inject(frame, frame)
		drain()
		out = r.port.Transmitted()
	default:
		for range copies {
			r.port.Inject(frame)
			drain()
			out = append(out, r.port.Transmitted()...)
		}
	}
	o.stats[1] = r.stats()
	before, after := &o.stats[0], &o.stats[1]

	// a. Conservation, and every drop has a reason with a name.
	rx, tx := after.RX-before.RX, after.TX-before.TX
	dropped := after.Dropped() - before.Dropped()
	require.Equal(t, uint64(copies), rx, "RX delta: frames injected")
	require.Equal(t, rx, tx+dropped, "RX = TX + drops; drops %v", after.DropsByName())
	require.Equal(t, tx, uint64(len(out)), "TX delta: frames the port captured")
	names := engine.DropReasons()
	o.drops = map[string]uint64{}
	for i := range after.Drops {
		d := after.Drops[i] - before.Drops[i]
		if d == 0 {
			continue
		}
		require.NotZero(t, i, "%d drops with reason 0 (none)", d)
		require.Less(t, i, len(names), "drop reason %d is not registered", i)
		require.NotEmpty(t, names[i], "drop reason %d has no name", i)
		o.drops[names[i]] += d
	}
	// b. Spoofed sources and expired TTLs, by gopacket's reading: a frame
	// from a VIP, the Mux, an infrastructure prefix (but for an ICMP
	// error) or a martian leaves in no form and is dropped with its
	// reason, unless the parser refused it first; a source filter reason
	// is never given to any other frame. ttl_exceeded only for a TTL /
	// hop limit of 1 or 0.
	in, err := decodeMuxInjected(frame)
	spoof := ""
	if err == nil {
		spoof = muxSpoofed(&in)
	}
	for name := range o.drops {
		if strings.HasPrefix(name, "src_") {
			require.Equal(t, spoof, name, "drop reason %s for a frame the oracle finds %q (%v)", name, spoof, err)
		}
		if name == "ttl_exceeded" {
			require.NoError(t, err, "ttl_exceeded for a frame gopacket cannot read")
			require.LessOrEqual(t, in.ttl(), uint8(1), "ttl_exceeded for TTL %d", in.ttl())
		}
	}
	if spoof != "" {
		require.Empty(t, out, "a frame from a spoofed source (%s) was transmitted", spoof)
		for name := range o.drops {
			require.True(t, name == spoof || muxParseReasons[name], "a frame from a spoofed source (%s) dropped as %s", spoof, name)
		}
	}
	if len(out) == 0 {
		return o
	}

	// c. Every transmitted frame is VXLAN for a VIP flow or an ICMP
	// message for the sender.
	require.NoError(t, err, "gopacket cannot read the injected frame, yet the Mux transmitted %d frames\n in  %x\n out %x",
		len(out), frame, out[0])
	for _, fr := range out {
		if isMuxVXLAN(fr) {
			bc := m.checkVXLAN(t, fr, &in)
			o.kinds = append(o.kinds, "vxlan")
			o.backends = append(o.backends, bc)
			o.vxlan = append(o.vxlan, fr)
			continue
		}
		o.kinds = append(o.kinds, checkMuxICMP(t, fr, &in))
	}

	// d. The flow stays put.
	if twice && len(o.vxlan) > 0 {
		require.Len(t, o.vxlan, 2, "one copy encapsulated and the other not: %v", o.summary())
		require.Equal(t, o.backends[0], o.backends[1], "the second copy went to another backend")
		require.True(t, bytes.Equal(o.vxlan[0], o.vxlan[1]),
			"the two copies were encapsulated differently\n 1st %x\n 2nd %x", o.vxlan[0], o.vxlan[1])
	}
	return o
}

// Infrastructure of benchDocument (infra_prefixes): the seeds' routers
// are in it.
var muxFuzzInfra = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24"), netip.MustParsePrefix("2001:db8:1::fe/127")}

// muxParseReasons are the drops of a frame engine.Parse refuses.
var muxParseReasons = map[string]bool{"truncated": true, "bad_l2": true, "not_ip": true,
	"bad_ipv4": true, "bad_ipv6": true, "bad_l4": true}

// muxSpoofed returns the source filter's reason for in by the oracle:
// src_martian for 0/8, 127/8, 224/4, 255.255.255.255, ::, ::1, ff00::/8
// and ::ffff:0:0/96 (netip's own predicates where they say the same);
// src_vip for a benchVIPs address; src_node for benchMuxSrc; src_infra for
// muxFuzzInfra unless in is an ICMP error; "" otherwise.
func muxSpoofed(in *muxInjected) string {
	a := in.src
	switch {
	case a.Is4() && (a.As4()[0] == 0 || a.IsLoopback() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255})),
		a.Is6() && (a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.Is4In6()):
		return "src_martian"
	case vipByAddr(a) >= 0:
		return "src_vip"
	case a == benchMuxSrc:
		return "src_node"
	}
	for _, p := range muxFuzzInfra {
		if p.Contains(a) && !in.icmpError() {
			return "src_infra"
		}
	}
	return ""
}

// icmpError reports whether in is an ICMP error message: ICMPv4 (in IPv4)
// of type 3, 4, 5, 11 or 12, or ICMPv6 (in IPv6) of a type below 128, with
// the 8 bytes of an ICMP header, not a later fragment.
func (in *muxInjected) icmpError() bool {
	l4 := in.l4
	if !l4.ok || l4.nonFirst || len(in.ip)-l4.off < 8 {
		return false
	}
	t := in.ip[l4.off]
	switch {
	case in.v4 && l4.proto == flow.ProtoICMP:
		return t == 3 || t == 4 || t == 5 || t == 11 || t == 12
	case !in.v4 && l4.proto == flow.ProtoICMPv6:
		return t < 128
	}
	return false
}

// ttl returns the injected packet's TTL or hop limit.
func (in *muxInjected) ttl() uint8 {
	if in.v4 {
		return in.ip4.TTL
	}
	return in.ip6.HopLimit
}

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
	if err := ip.DecodeFromBytes(c, gopacket.NilDecodeFeedback); err != nil {
		return fmt.Errorf("ipv6: %w", err)
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

	// The VIP the packet is for, by the oracle; its VNI and one of its
	// backends.
	vip, why := muxFlowVIP(in)
	if vip < 0 {
		fail("the Mux encapsulated a packet that is no VIP flow: %s", why)
	}
	v := benchVIPs[vip]
	if vx.VNI != v.vni {
		fail("VNI %d, VIP %s has %d", vx.VNI, v.name, v.vni)
	}
	inner := vx.Payload
	if len(inner) < 14 {
		fail("inner frame of %d bytes", len(inner))
	}
	mac := [6]byte(inner[:6])
	be, ok := m.backends[mac]
	if !ok || be.vip != vip {
		fail("inner destination MAC %v is no backend of VIP %s", net.HardwareAddr(mac[:]), v.name)
	}
	if be.host != host {
		fail("outer destination %v, backend %v is on host %v", host, net.HardwareAddr(mac[:]), be.host)
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

// muxFlowVIP says, by gopacket's decode of the injected IP packet, which
// VIP's rule the packet belongs to (the index in benchVIPs), or -1 and
// why none: a TCP or UDP packet (or first fragment) to the VIP's address,
// protocol and port, or an ICMP error about a flow of that VIP (quoting a
// packet from the VIP's address and port).
func muxFlowVIP(in *muxInjected) (int, string) {
	vip := vipByAddr(in.dst)
	if vip < 0 {
		return -1, fmt.Sprintf("destination %v is no VIP", in.dst)
	}
	v := benchVIPs[vip]
	match := func(proto uint8, dport uint16, what string) (int, string) {
		if proto != v.proto || dport != v.addr.Port() {
			return -1, fmt.Sprintf("%s protocol %d port %d, VIP %s is %d:%d", what, proto, dport, v.name, v.proto, v.addr.Port())
		}
		return vip, ""
	}
	l4 := in.l4
	switch {
	case !l4.ok:
		return -1, "an IPv6 extension chain that does not reach a transport header"
	case l4.nonFirst:
		return -1, "a non-first fragment (the VIP hashes ports)"
	}
	seg := in.ip[l4.off:]
	var quote []byte
	switch l4.proto {
	case flow.ProtoTCP, flow.ProtoUDP:
		lt := layers.LayerTypeTCP
		if l4.proto == flow.ProtoUDP {
			lt = layers.LayerTypeUDP
		}
		pkt := gopacket.NewPacket(seg, lt, gopacket.Default)
		switch l := pkt.Layer(lt).(type) {
		case *layers.TCP:
			return match(l4.proto, uint16(l.DstPort), "TCP")
		case *layers.UDP:
			return match(l4.proto, uint16(l.DstPort), "UDP")
		}
		if l4.frag && len(seg) >= 4 {
			// A first fragment may hold less than gopacket wants.
			return match(l4.proto, binary.BigEndian.Uint16(seg[2:]), "first fragment")
		}
		return -1, fmt.Sprintf("gopacket finds no transport header of protocol %d", l4.proto)
	case flow.ProtoICMP:
		if !in.v4 {
			return -1, "ICMPv4 in IPv6"
		}
		l, ok := gopacket.NewPacket(seg, layers.LayerTypeICMPv4, gopacket.Default).Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		if !ok {
			return -1, "gopacket finds no ICMPv4 header"
		}
		switch l.TypeCode.Type() {
		case layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4TypeTimeExceeded:
		default:
			return -1, fmt.Sprintf("ICMPv4 %v is no error", l.TypeCode)
		}
		quote = l.Payload
	case flow.ProtoICMPv6:
		if in.v4 {
			return -1, "ICMPv6 in IPv4"
		}
		l, ok := gopacket.NewPacket(seg, layers.LayerTypeICMPv6, gopacket.Default).Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
		if !ok {
			return -1, "gopacket finds no ICMPv6 header"
		}
		switch l.TypeCode.Type() {
		case layers.ICMPv6TypeDestinationUnreachable, layers.ICMPv6TypePacketTooBig, layers.ICMPv6TypeTimeExceeded:
		default:
			return -1, fmt.Sprintf("ICMPv6 %v is no error", l.TypeCode)
		}
		if len(l.Payload) < 4 {
			return -1, "ICMPv6 error without a quote"
		}
		quote = l.Payload[4:] // after the unused / MTU word
	default:
		return -1, fmt.Sprintf("protocol %d", l4.proto)
	}
	// The quoted packet: from the VIP (DSR: the VIP is the replies'
	// source) to the client; its source port is the VIP's.
	// gopacket reads the fixed fields before any check that can fail
	// past the fixed header's length, and a quote's length fields are
	// the original packet's, not the quote's: decode errors are ignored.
	var qsrc net.IP
	var qproto uint8
	var ql4 []byte
	if in.v4 {
		var ip layers.IPv4
		if len(quote) < 20 {
			return -1, "the ICMP error quotes no IPv4 header"
		}
		_ = ip.DecodeFromBytes(quote, gopacket.NilDecodeFeedback)
		if hl := int(ip.IHL) * 4; ip.Version != 4 || hl < 20 || hl > len(quote) {
			return -1, "the ICMP error quotes no valid IPv4 header"
		} else if ip.FragOffset == 0 {
			ql4 = quote[hl:]
		}
		qsrc, qproto = ip.SrcIP, uint8(ip.Protocol)
	} else {
		var ip layers.IPv6
		if len(quote) < 40 {
			return -1, "the ICMPv6 error quotes no IPv6 header"
		}
		_ = ip.DecodeFromBytes(quote, gopacket.NilDecodeFeedback)
		if ip.Version != 6 {
			return -1, "the ICMPv6 error quotes no IPv6 header"
		}
		qsrc, qproto, ql4 = ip.SrcIP, uint8(ip.NextHeader), quote[40:]
	}
	if a, _ := netip.AddrFromSlice(qsrc); a != v.addr.Addr() {
		return -1, fmt.Sprintf("the ICMP error to VIP %s quotes a packet from %v", v.name, a)
	}
	if len(ql4) < 4 {
		return -1, "the ICMP error quotes no ports"
	}
	return match(qproto, binary.BigEndian.Uint16(ql4), "quoted packet")
}

// checkMuxICMP checks a frame that is not VXLAN: it must be an ICMP
// message the Mux made for in's sender. It returns its kind.
func checkMuxICMP(t *testing.T, fr []byte, in *muxInjected) string {
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("transmitted frame is neither VXLAN nor ICMP for the sender: "+format+"\n in  %x\n out %x",
			append(args, in.frame, fr)...)
	}
	l3 := in.l3off
	// L2: the injected frame's, MACs swapped, tags kept.
	if len(fr) < l3 || !bytes.Equal(fr[:6], in.frame[6:12]) || !bytes.Equal(fr[6:12], in.frame[:6]) ||
		!bytes.Equal(fr[12:l3], in.frame[12:l3]) {
		fail("the Ethernet header is not the injected one turned around")
	}
	// The IP packet, bounded by its length field, then its ICMP message.
	var (
		ipLen     int
		h4        layers.IPv4
		h6        layers.IPv6
		src, dst  net.IP
		ttl       uint8
		typ, code uint8
		l4        muxL4
	)
	if in.v4 {
		if err := decodeIPv4(&h4, fr[l3:]); err != nil {
			fail("%v", err)
		}
		if gpkt.Checksum(h4.Contents) != 0 {
			fail("IPv4 header checksum %#04x is wrong (the injected header's was right: %v)",
				h4.Checksum, gpkt.Checksum(in.ip4.Contents) == 0)
		}
		ipLen, src, dst, ttl = int(h4.Length), h4.SrcIP, h4.DstIP, h4.TTL
		l4 = muxL4{proto: uint8(h4.Protocol), off: len(h4.Contents), ok: true, nonFirst: h4.FragOffset != 0}
	} else {
		if err := decodeIPv6Fixed(&h6, fr[l3:]); err != nil {
			fail("%v", err)
		}
		ipLen, src, dst, ttl = 40+int(h6.Length), h6.SrcIP, h6.DstIP, h6.HopLimit
	}
	if l3+ipLen > len(fr) {
		fail("IP packet of %d bytes past the frame", ipLen)
	}
	ipPkt := fr[l3 : l3+ipLen]
	if !in.v4 {
		l4 = muxIPv6L4(ipPkt)
	}
	if !l4.ok || l4.nonFirst || l4.off+4 > len(ipPkt) {
		fail("no ICMP header")
	}
	msg := ipPkt[l4.off:] // the ICMP message
	if (in.v4 && l4.proto != flow.ProtoICMP) || (!in.v4 && l4.proto != flow.ProtoICMPv6) {
		fail("protocol %d, no ICMP of the packet's family", l4.proto)
	}
	var sumOK bool
	var reser []byte
	typ, code, sumOK, reser = muxICMPChecksum(t, msg, in.v4, src, dst)
	if !sumOK {
		// Say whether the injected message (an echo request) already had
		// a wrong one.
		was := "not ICMP"
		if in.l4.ok && !in.l4.nonFirst && in.l4.proto == l4.proto && len(in.ip)-in.l4.off >= 8 {
			_, _, reqOK, _ := muxICMPChecksum(t, in.ip[in.l4.off:], in.v4,
				net.IP(in.src.AsSlice()), net.IP(in.dst.AsSlice()))
			was = map[bool]string{true: "right", false: "wrong too"}[reqOK]
		}
		fail("ICMP checksum: gopacket computes %x, sent %x (the injected message's: %s)", reser[2:4], msg[2:4], was)
	}
	// From the address the sender wrote to, to the sender.
	if a, _ := netip.AddrFromSlice(dst); a != in.src {
		fail("ICMP to %v, the injected frame is from %v", a, in.src)
	}
	if a, _ := netip.AddrFromSlice(src); a != in.dst {
		fail("ICMP from %v, the injected frame is to %v", a, in.dst)
	}
	if ttl != 64 {
		fail("TTL / hop limit %d, want 64", ttl)
	}
	if spoof := muxSpoofed(in); spoof != "" {
		fail("ICMP sent to a spoofed source (%s)", spoof)
	}
	switch {
	case in.v4 && typ == layers.ICMPv4TypeEchoReply, !in.v4 && typ == layers.ICMPv6TypeEchoReply:
		// A ping of a VIP address, answered in place: the request with
		// the addresses swapped, TTL / hop limit 64, the type changed
		// (checksums verified above), any padding kept.
		req := byte(layers.ICMPv4TypeEchoRequest)
		if !in.v4 {
			req = layers.ICMPv6TypeEchoRequest
		}
		if vipByAddr(in.dst) < 0 {
			fail("echo reply for a ping of %v, no VIP", in.dst)
		}
		if len(ipPkt) != len(in.ip) {
			fail("echo reply of %d IP bytes for a request of %d", len(ipPkt), len(in.ip))
		}
		at := l4.off
		want := bytes.Clone(in.ip)
		if in.l4.off != at || want[at] != req {
			fail("echo reply to something other than an echo request")
		}
		if in.v4 {
			copy(want[12:16], in.ip[16:20])
			copy(want[16:20], in.ip[12:16])
			want[8] = 64
			copy(want[10:12], ipPkt[10:12])
		} else {
			copy(want[8:24], in.ip[24:40])
			copy(want[24:40], in.ip[8:24])
			want[7] = 64
		}
		want[at] = typ
		copy(want[at+2:at+4], msg[2:4])
		if !bytes.Equal(want, ipPkt) {
			fail("the echo reply is not the request turned around\n want %x", want)
		}
		if !bytes.Equal(fr[l3+len(ipPkt):], in.frame[l3+len(in.ip):]) {
			fail("the echo reply's Ethernet padding differs from the request's")
		}
		return "echo-reply"
	case in.v4 && typ == layers.ICMPv4TypeDestinationUnreachable && code == layers.ICMPv4CodeFragmentationNeeded,
		!in.v4 && typ == layers.ICMPv6TypePacketTooBig && code == 0:
		// The packet does not fit the tunnel: the error gives the inner
		// MTU and quotes as much of the packet as the RFC limit allows
		// (576 bytes for ICMPv4, 1280 for ICMPv6, the whole error), right
		// after a plain IP header.
		kind, hdr, limit := "frag-needed", 20, 576
		if !in.v4 {
			kind, hdr, limit = "packet-too-big", 40, 1280
		}
		mtu := encap.DefaultMTU - encap.OverheadIPv4 // every backend host is IPv4
		if len(in.ip) <= mtu {
			fail("%s for a %d-byte packet, which fits the tunnel's %d", kind, len(in.ip), mtu)
		}
		if in.ttl() <= 1 {
			fail("%s for a packet whose TTL / hop limit (%d) ran out", kind, in.ttl())
		}
		if in.v4 && (in.ip4.Flags&layers.IPv4DontFragment == 0 || in.ip4.FragOffset != 0) {
			fail("frag-needed for a packet without DF or a non-first fragment")
		}
		if len(ipPkt) != hdr+len(msg) || len(fr) != l3+len(ipPkt) {
			fail("%s: %d IP bytes with a %d-byte message in a %d-byte frame", kind, len(ipPkt), len(msg), len(fr))
		}
		q := min(len(in.ip), limit-hdr-8)
		if len(msg) != 8+q {
			fail("%s of %d bytes, want 8 + %d quoted", kind, len(msg), q)
		}
		var want [4]byte
		binary.BigEndian.PutUint32(want[:], uint32(mtu))
		if !bytes.Equal(msg[4:8], want[:]) {
			fail("%s says MTU %x, want %d", kind, msg[4:8], mtu)
		}
		if !bytes.Equal(msg[8:], in.ip[:q]) {
			fail("%s quotes other bytes than the packet's first %d", kind, q)
		}
		return kind
	}
	fail("ICMP type %d code %d is nothing the Mux sends", typ, code)
	return ""
}

// muxICMPChecksum decodes the ICMP (v4) or ICMPv6 message msg of a packet
// from src to dst with gopacket and re-serialises it with gopacket's
// checksum (for ICMPv6 over the IPv6 pseudo-header). It returns the type,
// the code, whether the message's checksum is the one gopacket computes,
// and gopacket's bytes.
func muxICMPChecksum(t *testing.T, msg []byte, v4 bool, src, dst net.IP) (typ, code uint8, ok bool, reser []byte) {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{ComputeChecksums: true}
	if v4 {
		m, ok := gopacket.NewPacket(msg, layers.LayerTypeICMPv4, gopacket.Default).Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		if !ok {
			t.Fatalf("gopacket decodes no ICMPv4 message in %x", msg)
		}
		typ, code = m.TypeCode.Type(), m.TypeCode.Code()
		c := *m
		require.NoError(t, gopacket.SerializeLayers(buf, opts, &c, gopacket.Payload(m.Payload)))
	} else {
		m, ok := gopacket.NewPacket(msg, layers.LayerTypeICMPv6, gopacket.Default).Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
		if !ok {
			t.Fatalf("gopacket decodes no ICMPv6 message in %x", msg)
		}
		typ, code = m.TypeCode.Type(), m.TypeCode.Code()
		c := *m
		require.NoError(t, c.SetNetworkLayerForChecksum(&layers.IPv6{SrcIP: src, DstIP: dst}))
		require.NoError(t, gopacket.SerializeLayers(buf, opts, &c, gopacket.Payload(m.Payload)))
	}
	return typ, code, bytes.Equal(buf.Bytes(), msg), buf.Bytes()
}

// muxFuzzSeed is one seed of FuzzMuxPipeline and what a fresh rig does
// with it (TestMuxFuzzSeeds).
type muxFuzzSeed struct {
	name             string
	frame            []byte
	twice, sameBatch bool
	want             []string // muxOutcome.summary
	sameBackendAs    string   // a seed whose flow this one must follow
}

// Addresses of the seeds beyond the bench flows.
var (
	seedClient4 = netip.MustParseAddr("198.18.5.6")
	seedClient6 = netip.MustParseAddr("2001:db8:1::56")
	seedRouter4 = netip.MustParseAddr("198.18.0.254")
	seedRouter6 = netip.MustParseAddr("2001:db8:1::fe")
)

// muxFuzzSeeds returns the seeds: one bench frame of each kind of
// muxAgreeMix (once, twice, twice in one batch), and frames built with
// gopacket for every other path of the pipeline.
func muxFuzzSeeds(tb testing.TB) []muxFuzzSeed {
	var seeds []muxFuzzSeed
	// One bench flow of each kind (with a TOS where the generator gave
	// one).
	flows := genBenchFlows(256, muxAgreeMix, 11, true)
	kindNames := map[benchKind]string{kindTCP4: "tcp4", kindUDP4: "udp4", kindTCP6: "tcp6", kindTCP4VLAN: "tcp4-vlan"}
	seen := map[benchKind]bool{}
	for _, fl := range flows {
		if seen[fl.kind] {
			continue
		}
		seen[fl.kind] = true
		fr := benchFrames([]benchFlow{fl})[0]
		n := kindNames[fl.kind]
		seeds = append(seeds,
			muxFuzzSeed{name: n, frame: fr, want: []string{"vxlan"}},
			muxFuzzSeed{name: n + "-twice", frame: fr, twice: true, want: []string{"vxlan", "vxlan"}},
			muxFuzzSeed{name: n + "-twice-one-batch", frame: fr, twice: true, sameBatch: true, want: []string{"vxlan", "vxlan"}})
	}
	require.Len(tb, seen, len(kindNames), "genBenchFlows gave every kind")

	web4, web6 := benchVIPs[0].addr, benchVIPs[2].addr
	tcp := func(sport, dport uint16) *layers.TCP {
		return &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport),
			Seq: 7, Ack: 1, ACK: true, PSH: true, Window: 65535}
	}
	ip4 := func(src, dst netip.Addr, proto layers.IPProtocol) *layers.IPv4 {
		return &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(),
			Flags: layers.IPv4DontFragment}
	}
	ip6 := func(src, dst netip.Addr, next layers.IPProtocol) *layers.IPv6 {
		return &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: next, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	}
	payload := func(n int) gopacket.Payload {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(i)
		}
		return p
	}

	// A TCP flow to web4, then an ICMP fragmentation needed about its
	// replies (VIP:80 → client), from a router on the return path: the
	// error follows the flow to its backend.
	flow4 := seedFrame(tb, ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP), tcp(40000, 80), payload(10))
	seeds = append(seeds, muxFuzzSeed{name: "flow4", frame: flow4, want: []string{"vxlan"}})
	quote4 := gpkt.Serialize(tb, ip4(web4.Addr(), seedClient4, layers.IPProtocolTCP), tcp(80, 40000), payload(1400))[:28]
	seeds = append(seeds, muxFuzzSeed{name: "icmp4-frag-needed-quoting-flow4",
		frame: seedFrame(tb, ip4(seedRouter4, web4.Addr(), layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable,
				layers.ICMPv4CodeFragmentationNeeded), Seq: 1400}, gopacket.Payload(quote4)),
		want: []string{"vxlan"}, sameBackendAs: "flow4"})
	// The same for web6: a flow and a packet too big about it.
	flow6 := seedFrame(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolTCP), tcp(40000, 80), payload(10))
	seeds = append(seeds, muxFuzzSeed{name: "flow6", frame: flow6, want: []string{"vxlan"}})
	quote6 := gpkt.Serialize(tb, ip6(web6.Addr(), seedClient6, layers.IPProtocolTCP), tcp(80, 40000), payload(1400))[:48]
	seeds = append(seeds, muxFuzzSeed{name: "icmp6-packet-too-big-quoting-flow6",
		frame: seedFrame(tb, ip6(seedRouter6, web6.Addr(), layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypePacketTooBig, 0)},
			gopacket.Payload(append([]byte{0, 0, 0x05, 0x78}, quote6...))),
		want: []string{"vxlan"}, sameBackendAs: "flow6"})

	// Pings of VIP addresses.
	seeds = append(seeds,
		muxFuzzSeed{name: "echo4-web4", frame: seedFrame(tb, ip4(seedClient4, web4.Addr(), layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 0x1234, Seq: 1},
			payload(32)), want: []string{"echo-reply"}},
		muxFuzzSeed{name: "echo6-web6", frame: seedFrame(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolICMPv6),
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)},
			&layers.ICMPv6Echo{Identifier: 0x1234, SeqNumber: 1}, payload(32)), want: []string{"echo-reply"}})

	// IPv4 fragments to web4: the first is balanced by hash, a later one
	// cannot be (the rule hashes ports).
	first4 := ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP)
	first4.Flags = layers.IPv4MoreFragments
	later4 := ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP)
	later4.Flags, later4.FragOffset = 0, 185
	seeds = append(seeds,
		muxFuzzSeed{name: "frag4-first", frame: seedFrame(tb, first4, tcp(40001, 80), payload(64)), twice: true,
			want: []string{"vxlan", "vxlan"}},
		muxFuzzSeed{name: "frag4-later", frame: seedFrame(tb, later4, payload(100)), want: []string{"drop:no_rule"}})
	// IPv6 fragments to web6 (the Fragment header by hand: gopacket
	// cannot serialise one).
	seg := gpkt.Serialize(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolTCP), tcp(40001, 80), payload(64))[40:]
	fragHdr := func(offset uint16, more bool) []byte {
		h := []byte{byte(layers.IPProtocolTCP), 0, 0, 0, 0, 0, 0x12, 0x34}
		fo := offset << 3
		if more {
			fo |= 1
		}
		binary.BigEndian.PutUint16(h[2:], fo)
		return h
	}
	seeds = append(seeds,
		muxFuzzSeed{name: "frag6-first", frame: seedFrame(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolIPv6Fragment),
			gopacket.Payload(append(fragHdr(0, true), seg...))), twice: true, want: []string{"vxlan", "vxlan"}},
		muxFuzzSeed{name: "frag6-later", frame: seedFrame(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolIPv6Fragment),
			gopacket.Payload(append(fragHdr(185, false), payload(100)...))), want: []string{"drop:no_rule"}})

	// Too big for the tunnel (encap.DefaultMTU less the VXLAN over IPv4
	// overhead): an IPv4 packet with DF gets fragmentation needed, an
	// IPv6 packet packet too big.
	big := encap.DefaultMTU - encap.OverheadIPv4 + 1 // IP bytes
	seeds = append(seeds,
		muxFuzzSeed{name: "toobig4-df", frame: seedFrame(tb, ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP),
			tcp(40002, 80), payload(big-40)), want: []string{"frag-needed"}},
		muxFuzzSeed{name: "toobig6", frame: seedFrame(tb, ip6(seedClient6, web6.Addr(), layers.IPProtocolTCP),
			tcp(40002, 80), payload(big-60)), want: []string{"packet-too-big"}})
	// The largest packet that fits is encapsulated.
	seeds = append(seeds, muxFuzzSeed{name: "fits4", frame: seedFrame(tb, ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP),
		tcp(40003, 80), payload(big-41)), want: []string{"vxlan"}})

	// Spoofed sources: a VIP to itself (the loop of issue 10), another VIP,
	// the Mux's own address, an infrastructure prefix (a router's echo
	// request: only its ICMP errors pass, see the seeds above), martians.
	dns4 := benchVIPs[1].addr
	udp := func(sport, dport uint16) *layers.UDP {
		return &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
	}
	udpFrame := func(src, dst netip.Addr, sport, dport uint16) []byte {
		u := udp(sport, dport)
		ip := ip4(src, dst, layers.IPProtocolUDP)
		require.NoError(tb, u.SetNetworkLayerForChecksum(ip))
		return seedFrame(tb, ip, u, payload(8))
	}
	seeds = append(seeds,
		muxFuzzSeed{name: "spoof-vip-to-itself", frame: udpFrame(dns4.Addr(), dns4.Addr(), 53, 53), want: []string{"drop:src_vip"}},
		muxFuzzSeed{name: "spoof-other-vip", frame: seedFrame(tb, ip4(benchVIPs[1].addr.Addr(), web4.Addr(), layers.IPProtocolTCP),
			tcp(53, 80), payload(10)), want: []string{"drop:src_vip"}},
		muxFuzzSeed{name: "spoof-vip6", frame: seedFrame(tb, ip6(web6.Addr(), web6.Addr(), layers.IPProtocolTCP),
			tcp(80, 80), payload(10)), want: []string{"drop:src_vip"}},
		muxFuzzSeed{name: "spoof-mux", frame: udpFrame(benchMuxSrc, dns4.Addr(), 53, 53), want: []string{"drop:src_node"}},
		muxFuzzSeed{name: "spoof-infra", frame: udpFrame(netip.MustParseAddr("198.18.0.77"), dns4.Addr(), 4000, 53),
			want: []string{"drop:src_infra"}},
		muxFuzzSeed{name: "infra-echo", frame: seedFrame(tb, ip4(seedRouter4, web4.Addr(), layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 1},
			payload(8)), want: []string{"drop:src_infra"}},
		muxFuzzSeed{name: "martian-loopback", frame: udpFrame(netip.MustParseAddr("127.0.0.1"), dns4.Addr(), 4000, 53),
			want: []string{"drop:src_martian"}},
		muxFuzzSeed{name: "martian-broadcast", frame: udpFrame(netip.MustParseAddr("255.255.255.255"), dns4.Addr(), 4000, 53),
			want: []string{"drop:src_martian"}},
		muxFuzzSeed{name: "martian-multicast6", frame: seedFrame(tb, ip6(netip.MustParseAddr("ff02::1"), web6.Addr(), layers.IPProtocolTCP),
			tcp(4000, 80), payload(10)), want: []string{"drop:src_martian"}})
	// TTL / hop limit: 2 is forwarded with 1, 1 is not.
	ttl4 := func(ttl uint8) []byte {
		ip := ip4(seedClient4, web4.Addr(), layers.IPProtocolTCP)
		ip.TTL = ttl
		return seedFrame(tb, ip, tcp(40010+uint16(ttl), 80), payload(10))
	}
	hop6 := func(hl uint8) []byte {
		ip := ip6(seedClient6, web6.Addr(), layers.IPProtocolTCP)
		ip.HopLimit = hl
		return seedFrame(tb, ip, tcp(40010+uint16(hl), 80), payload(10))
	}
	seeds = append(seeds,
		muxFuzzSeed{name: "ttl4-2", frame: ttl4(2), want: []string{"vxlan"}},
		muxFuzzSeed{name: "ttl4-1", frame: ttl4(1), want: []string{"drop:ttl_exceeded"}},
		muxFuzzSeed{name: "ttl4-0", frame: ttl4(0), want: []string{"drop:ttl_exceeded"}},
		muxFuzzSeed{name: "hop6-2", frame: hop6(2), want: []string{"vxlan"}},
		muxFuzzSeed{name: "hop6-1", frame: hop6(1), want: []string{"drop:ttl_exceeded"}})

	// No VIP there; garbage; a frame cut short.
	seeds = append(seeds,
		muxFuzzSeed{name: "no-vip", frame: seedFrame(tb, ip4(seedClient4, netip.MustParseAddr("198.19.255.9"), layers.IPProtocolTCP),
			tcp(40000, 80), payload(10)), want: []string{"drop:no_rule"}},
		muxFuzzSeed{name: "garbage", frame: mustHex(tb, "ffffffffffff0123456789ab88b5deadbeefcafef00d0badc0ffee"),
			want: []string{"drop:not_ip"}},
		muxFuzzSeed{name: "truncated", frame: flow4[:30], want: []string{"drop:truncated"}},
		muxFuzzSeed{name: "empty", frame: nil, want: []string{"drop:truncated"}})
	return seeds
}

// seedFrame is gpkt.Serialize behind an Ethernet header from the client's MAC
// to the Mux's.
func seedFrame(tb testing.TB, ls ...gopacket.SerializableLayer) []byte {
	et := layers.EthernetTypeIPv4
	if _, ok := ls[0].(*layers.IPv6); ok {
		et = layers.EthernetTypeIPv6
	}
	eth := &layers.Ethernet{SrcMAC: benchClientMAC, DstMAC: net.HardwareAddr(benchHop.SrcMAC[:]), EthernetType: et}
	return gpkt.Serialize(tb, append([]gopacket.SerializableLayer{eth}, ls...)...)
}

func mustHex(tb testing.TB, s string) []byte {
	b, err := hex.DecodeString(s)
	require.NoError(tb, err)
	return b
}
