package mux

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// movingHops is a versioned next-hop source whose one answer a test
// changes (a neighbour's new MAC).
type movingHops struct {
	mu  sync.Mutex
	hop nexthop.Hop
	v   uint64
}

func (m *movingHops) Lookup(netip.Addr) (nexthop.Hop, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hop, true
}

func (m *movingHops) Version() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.v
}

func (m *movingHops) move(mac [6]byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hop.DstMAC = mac
	m.v++
}

// reframe decodes frame with gopacket up to its transport layer, lets
// edit change those layers and the payload, and serializes them again,
// lengths and checksums computed.
func reframe(tb testing.TB, frame []byte, edit func(gopacket.Packet, *gopacket.Payload)) []byte {
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	var ls []gopacket.SerializableLayer
	var pl gopacket.Payload
	for _, l := range pkt.Layers() {
		ls = append(ls, l.(gopacket.SerializableLayer))
		if l.LayerType() == layers.LayerTypeTCP || l.LayerType() == layers.LayerTypeUDP {
			pl = append(pl, l.LayerPayload()...)
			break
		}
	}
	edit(pkt, &pl)
	return gpkt.Serialize(tb, append(ls, &pl)...)
}

// edited returns frames, each edited by edit (reframe).
func edited(tb testing.TB, frames [][]byte, edit func(gopacket.Packet, *gopacket.Payload)) [][]byte {
	out := make([][]byte, len(frames))
	for i, f := range frames {
		out[i] = reframe(tb, f, edit)
	}
	return out
}

// TestFastPathAgrees runs established flows through the Mux's separate
// stages and through the fused stage with its fast path (fusedPair), and
// requires the same output bytes, drops and counters — the connection
// tables' entries included — while the fast path serves them, and when
// what a kept decision depends on changes: the packet (ECN marks, TTL 1,
// too big for the tunnel, a partial checksum, a group MAC, another
// source MAC), the flow (a
// FIN, then ACKs for longer than the closing timeout), time (packets for
// longer than the established timeout, so that only the refreshes keep the
// entries alive) and the next hop (a new MAC).
func TestFastPathAgrees(t *testing.T) {
	hops := &movingHops{hop: benchHop, v: 1}
	fp := newFusedPairWith(t, muxStagesOpts{partial: true, hops: hops}, 1<<12)
	frames := benchTargets.Frames(benchFlows(300, muxAgreeMix, 11, true))
	send := func(frames [][]byte) {
		t.Helper()
		for i := 0; i < len(frames); i += engine.MaxBatch {
			fp.batch(t, frames[i:min(i+engine.MaxBatch, len(frames))]...)
		}
	}
	hits := func() uint64 {
		h, _ := fp.f.fast.Stats()
		return h
	}
	send(frames)
	fp.now += int64(2 * time.Second) // past ProveAfter
	send(frames)                     // proven
	send(frames)                     // kept
	h := hits()
	send(frames)
	// Nearly every one: two flows of the 300 may share both their
	// entries with others (the cache is two-way skewed-associative,
	// seeded at random).
	require.GreaterOrEqual(t, hits()-h, uint64(len(frames))*95/100, "the packets of established flows are hits")

	tcp := func(p gopacket.Packet) *layers.TCP {
		l, _ := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
		return l
	}
	steps := []struct {
		name string
		edit func(gopacket.Packet, *gopacket.Payload)
		hits bool // the edited frames are hits (those that are not remove the decisions)
	}{
		{"ECN marks", func(p gopacket.Packet, pl *gopacket.Payload) {
			if ip, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
				ip.TOS ^= 3
			} else {
				p.Layer(layers.LayerTypeIPv6).(*layers.IPv6).TrafficClass ^= 3
			}
		}, true},
		{"payload", func(p gopacket.Packet, pl *gopacket.Payload) {
			*pl = make([]byte, 100)
		}, true},
		{"source MAC", func(p gopacket.Packet, pl *gopacket.Payload) {
			p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet).SrcMAC = net.HardwareAddr{0x02, 0, 0x5e, 0x10, 0, 0x77}
		}, true},
		{"TTL 1", func(p gopacket.Packet, pl *gopacket.Payload) {
			if ip, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
				ip.TTL = 1
			} else {
				p.Layer(layers.LayerTypeIPv6).(*layers.IPv6).HopLimit = 1
			}
		}, false},
		{"too big", func(p gopacket.Packet, pl *gopacket.Payload) {
			*pl = make([]byte, 1440)
		}, false},
		{"group MAC", func(p gopacket.Packet, pl *gopacket.Payload) {
			p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet).DstMAC = net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}
		}, false},
	}
	for _, st := range steps {
		send(frames) // the decisions a step's full pipeline removed
		h := hits()
		send(edited(t, frames, st.edit))
		fp.counters(t)
		if got := hits() - h; st.hits != (got > 0) {
			t.Fatalf("%s: %d hits", st.name, got)
		}
	}

	// Partial checksums: completed on the fast path as in the stages.
	send(frames) // the decisions the last steps' full pipeline removed
	c := fp.fusMS.partial.Completed()
	h = hits()
	partial := make([][]byte, len(frames))
	for i, f := range frames {
		partial[i] = gpkt.MakePartial(t, f)
	}
	send(partial)
	fp.counters(t)
	require.Greater(t, fp.fusMS.partial.Completed(), c)
	require.Greater(t, hits(), h)

	// The next hop's MAC changes: the kept decisions follow.
	hops.move([6]byte{0x02, 0xaa, 0, 0, 0, 1})
	send(frames)
	send(frames)
	fp.counters(t)

	// Time: a packet of every flow every 10 s for an hour, four times the
	// established timeout. Only the full pipeline's lookups refresh the
	// entries (every flow.ConnTable.RefreshAfter), and the entries must
	// live as in the separate stages.
	h = hits()
	for range 360 {
		fp.now += int64(10 * time.Second)
		send(frames)
	}
	fp.counters(t)
	require.Greater(t, hits()-h, uint64(len(frames))*100, "the fast path served these flows")

	// A FIN on every TCP flow, half of them in batches with an ICMP echo
	// request (which run through the separate stages), then ACKs every
	// 2 s for 30 s (the closing timeout is 10 s): the entries closed by
	// the FIN live on as the ACKs keep them; then 20 s without a packet,
	// after which they are gone and the next ACKs place the flows anew.
	echo := gpkt.Serialize(t, &layers.Ethernet{SrcMAC: benchClientMAC, DstMAC: net.HardwareAddr(benchHop.SrcMAC[:]), EthernetType: layers.EthernetTypeIPv4},
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: net.IP{198, 19, 7, 7}, DstIP: benchVIPs[0].addr.Addr().AsSlice()},
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 1},
		gopacket.Payload(make([]byte, 16)))
	var fins, icmpFins [][]byte
	for i, f := range frames {
		if p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default); tcp(p) != nil {
			fin := reframe(t, f, func(p gopacket.Packet, _ *gopacket.Payload) { tcp(p).FIN = true })
			if i%2 == 0 {
				icmpFins = append(icmpFins, fin, echo)
			} else {
				fins = append(fins, fin)
			}
		}
	}
	fp.now += int64(30 * time.Second) // every decision kept now, none older
	send(frames)
	send(frames)
	h = hits()
	send(fins)
	require.Equal(t, h, hits(), "a FIN is a hit")
	send(icmpFins)
	for range 15 {
		fp.now += int64(2 * time.Second)
		send(frames)
	}
	fp.counters(t)
	fp.now += int64(20 * time.Second)
	send(frames)
	fp.counters(t)
}

// TestFastPathNaps: a worker whose flows are too many for its cache (20k
// flows in turn: no flow comes back before a third of its set's entries
// were replaced) finds too few hits in its first window and naps (no
// lookup for fastMinNap batches), tries again and naps longer; once its
// flows are few, it wakes, hits, and stays awake; what the full pipeline
// changed while it slept (a FIN) is not hidden by a decision kept from
// before. The stages and the fused stage agree throughout.
func TestFastPathNaps(t *testing.T) {
	fp := newFusedPairWith(t, muxStagesOpts{partial: true}, 1<<15)
	many := benchTargets.Frames(benchFlows(20000, muxBenchMix, 12, false))
	few := many[:300]
	c := fp.f.fast.caches.Get(0)
	pos := map[*[][]byte]int{} // where each list's next batch starts
	send := func(frames *[][]byte, batches int) {
		t.Helper()
		for range batches {
			j := pos[frames]
			k := min(j+engine.MaxBatch, len(*frames))
			fp.batch(t, (*frames)[j:k]...)
			pos[frames] = k % len(*frames)
		}
	}
	looks := func() uint64 { h, m := fp.f.fast.Stats(); return h + m }
	const window = fastWindow / engine.MaxBatch // a window's full batches (every packet is looked up)
	send(&many, window)                         // new flows: no hits, a nap
	require.Equal(t, uint32(fastMinNap), c.sleep, "no nap after a window without hits")
	send(&many, len(many)/engine.MaxBatch+1)
	fp.now += int64(2 * time.Second) // every flow proven from now on
	for c.sleep == 0 {
		send(&many, 1)
	}
	// Napping, the cache holds nothing of the snapshot (a nap may last
	// hours on a quiet worker).
	require.True(t, c.snap == nil, "the snapshot kept while napping")
	for i := range c.e {
		require.True(t, c.e[i].rule == nil, "entry %d holds a rule while napping", i)
	}
	nap := c.nap
	n := looks()
	send(&many, int(c.sleep))
	require.Equal(t, n, looks(), "lookups during a nap")
	// A poor window (of lookups: the batches at the list's end are not
	// full), after those of the cache warming: a longer nap.
	for i := 0; c.sleep == 0; i++ {
		require.Less(t, i, (fastSlots/fastWindow+2)*window, "no nap after a poor window")
		send(&many, 1)
	}
	require.Equal(t, min(2*nap, fastMaxNap), c.nap)

	send(&few, int(c.sleep))      // the nap
	for i := 0; c.nap != 0; i++ { // then a good window
		require.Less(t, i, 2*window, "still napping")
		send(&few, 1)
	}
	h, _ := fp.f.fast.Stats()
	send(&few, 10)
	h2, _ := fp.f.fast.Stats()
	require.Greater(t, h2, h, "no hits once awake")
	fp.counters(t)

	// The few flows' decisions are kept; many flows put the worker to
	// sleep again, and while it sleeps the few TCP flows end (FIN): the
	// decisions kept from before must not serve the ACKs that follow
	// (every 2 s for 30 s: the closing entries live on as they keep
	// them, see TestFastPathAgrees).
	for c.sleep == 0 {
		send(&many, 1)
	}
	var fins [][]byte
	for _, f := range few {
		if p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default); p.Layer(layers.LayerTypeTCP) != nil {
			fins = append(fins, reframe(t, f, func(p gopacket.Packet, _ *gopacket.Payload) {
				p.Layer(layers.LayerTypeTCP).(*layers.TCP).FIN = true
			}))
		}
	}
	send(&fins, len(fins)/engine.MaxBatch+1)
	require.NotZero(t, c.sleep, "the FINs were not sent during a nap")
	send(&many, int(c.sleep))
	for range 15 {
		fp.now += int64(2 * time.Second)
		send(&few, len(few)/engine.MaxBatch+1)
	}
	fp.counters(t)
}
