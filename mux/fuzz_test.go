package mux

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// FuzzMuxPipeline drives the Mux's whole in-memory data path — the stages
// of ourMuxStages (Parse → source filter → uplink VNI → ICMP → balance → encap (TTL) → next hop
// → account) over benchDocument, in a Worker polling one MemPort with the
// Controller's snapshot — with arbitrary frames, and checks with gopacket
// as the oracle what comes out:
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
//     the VIP the injected packet is for, or, for a packet returning to an
//     outbound connection (muxReturnOwner: a reply to an allocated port of
//     benchOutbound, an ICMP error quoting one, an echo reply with an
//     allocated identifier), to the port's owner (see checkVXLAN: outer header
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
	stages, ctl := ourMux(tb, doc, muxConnTable(tb, 1<<14))
	m := &muxFuzzRig{
		rig:      newMuxRigSnapshot(tb, true, ctl.Snapshot, stages...), // the range table comes with the snapshot
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
