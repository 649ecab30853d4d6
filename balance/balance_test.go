package balance_test

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

var (
	vip4 = netip.MustParseAddr("198.18.100.1")
	vip6 = netip.MustParseAddr("2001:db8:100::1")
)

type pkt struct {
	src, dst netip.Addr
	sport    uint16
	dport    uint16
	tcp      bool
	syn, ack bool
	fin, rst bool
	frag     int // 0 none, 1 first fragment, 2 non-first
}

// build makes the frame with gopacket.
func (p pkt) build() []byte {
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}}
	var ls []gopacket.SerializableLayer
	var nl gopacket.NetworkLayer
	var proto layers.IPProtocol = layers.IPProtocolUDP
	if p.tcp {
		proto = layers.IPProtocolTCP
	}
	if p.src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice()}
		switch p.frag {
		case 1:
			ip.Flags = layers.IPv4MoreFragments
		case 2:
			ip.FragOffset = 10
		}
		nl = ip
		ls = append(ls, eth, ip)
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice()}
		nl = ip
		ls = append(ls, eth, ip)
	}
	if p.frag == 2 {
		ls = append(ls, gopacket.Payload(make([]byte, 16)))
	} else if p.tcp {
		t := &layers.TCP{SrcPort: layers.TCPPort(p.sport), DstPort: layers.TCPPort(p.dport), SYN: p.syn, ACK: p.ack, FIN: p.fin, RST: p.rst, Window: 1000}
		_ = t.SetNetworkLayerForChecksum(nl)
		ls = append(ls, t, gopacket.Payload("data"))
	} else {
		u := &layers.UDP{SrcPort: layers.UDPPort(p.sport), DstPort: layers.UDPPort(p.dport)}
		_ = u.SetNetworkLayerForChecksum(nl)
		ls = append(ls, u, gopacket.Payload("data"))
	}
	return gpkt.MustSerialize(ls...)
}

func backends(n int, weight uint32) []flow.Backend {
	var bs []flow.Backend
	for i := 0; i < n; i++ {
		a := netip.AddrFrom4([4]byte{198, 19, 1, byte(i + 1)})
		bs = append(bs, flow.Backend{Name: fmt.Sprintf("dip%02d", i), Addr: a, Host: a, Weight: weight})
	}
	return bs
}

// harness runs packets through parse → balance, one at a time, and
// returns each packet's decision.
type harness struct {
	t     *testing.T
	rules *flow.Rules
	conns *flow.ConnTable
	stage *balance.Stage
	pl    *engine.Pipeline
	pool  [engine.MaxBatch]engine.Packet
	batch engine.Batch
	ctr   engine.Counters
	now   flow.Tick // the stage's clock
}

func newHarness(t *testing.T, stateful bool, rules ...flow.Rule) *harness {
	h := &harness{t: t, rules: flow.NewRules()}
	_, err := h.rules.Update(1, rules)
	require.NoError(t, err)
	if stateful {
		h.conns, err = flow.NewConnTable(flow.ConnTableConfig{Capacity: 1024})
		require.NoError(t, err)
	}
	h.now = 1
	h.stage, err = balance.New(balance.Config{Rules: h.rules, Conns: h.conns, Hasher: flow.NewHasher(42),
		Clock: func() flow.Tick { return h.now }})
	require.NoError(t, err)
	h.pl = engine.NewPipeline(engine.Parse{}, h.stage)
	h.batch.Counters = &h.ctr
	return h
}

// load makes the batch one packet of frame, with headroom.
func (h *harness) load(frame []byte) *engine.Packet {
	h.batch.Reset()
	buf := make([]byte, 2048)
	copy(buf[128:], frame)
	p := &h.pool[0]
	p.SetBuffer(nil, 0, buf, 128, len(frame), 0)
	h.batch.Append(p)
	return p
}

// run returns the backend name picked for the frame, or the drop reason.
func (h *harness) run(frame []byte) string {
	p := h.load(frame)
	h.pl.Process(&h.batch)
	if h.batch.Len() == 0 {
		return "drop:" + p.Reason.String()
	}
	require.NotNil(h.t, p.Rule)
	return p.Rule.Backends[p.Backend].Name
}

func TestBalanceDecisions(t *testing.T) {
	tcp := func(sport uint16) pkt {
		return pkt{src: netip.MustParseAddr("198.18.0.7"), dst: vip4, sport: sport, dport: 80, tcp: true, syn: true}
	}
	rules := []flow.Rule{
		{Name: "web", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(4, 1)},
		{Name: "dns-all", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoUDP}, Mode: flow.Tuple3, Backends: backends(3, 1)},
		{Name: "web6", VIP: flow.VIP{Addr: vip6, Proto: flow.ProtoTCP, Port: 443}, Backends: backends(2, 1)},
		{Name: "empty", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 81}, Backends: backends(2, 0)},
	}
	h := newHarness(t, true, rules...)
	tests := []struct {
		name string
		p    pkt
		want string // exact result, or "" for "any backend"
	}{
		{"tcp to vip", tcp(1000), ""},
		{"wrong port", pkt{src: netip.MustParseAddr("198.18.0.7"), dst: vip4, sport: 1, dport: 8080, tcp: true, syn: true}, "drop:no_rule"},
		{"not a vip", pkt{src: netip.MustParseAddr("198.18.0.7"), dst: netip.MustParseAddr("198.18.100.2"), sport: 1, dport: 80, tcp: true}, "drop:no_rule"},
		{"udp all ports", pkt{src: netip.MustParseAddr("198.18.0.7"), dst: vip4, sport: 5, dport: 5353}, ""},
		{"v6", pkt{src: netip.MustParseAddr("2001:db8::7"), dst: vip6, sport: 5, dport: 443, tcp: true, syn: true}, ""},
		{"no active backend", pkt{src: netip.MustParseAddr("198.18.0.7"), dst: vip4, sport: 5, dport: 81, tcp: true, syn: true}, "drop:no_backend"},
		{"non-first fragment, 5-tuple rule", pkt{src: netip.MustParseAddr("198.18.0.7"), dst: vip4, tcp: true, frag: 2}, "drop:no_rule"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := h.run(tc.p.build())
			if tc.want == "" {
				require.NotContains(t, got, "drop:")
			} else {
				require.Equal(t, tc.want, got)
			}
		})
	}

	// UDP fragments on a 3-tuple all-ports rule: first and rest agree.
	first := pkt{src: netip.MustParseAddr("198.18.0.9"), dst: vip4, sport: 7, dport: 53, frag: 1}
	rest := first
	rest.frag = 2
	a, b := h.run(first.build()), h.run(rest.build())
	require.NotContains(t, a, "drop:")
	require.Equal(t, a, b)
}

// TestTupleModes checks which fields the rule's mode hashes: with a 2- or
// 3-tuple rule every source port of a client lands on one backend; with a
// 5-tuple rule they spread.
func TestTupleModes(t *testing.T) {
	for _, mode := range []flow.TupleMode{flow.Tuple5, flow.Tuple3, flow.Tuple2} {
		t.Run(mode.String(), func(t *testing.T) {
			h := newHarness(t, false, flow.Rule{Name: "r", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoUDP}, Mode: mode, Backends: backends(8, 1)})
			seen := map[string]bool{}
			for sport := uint16(1); sport <= 64; sport++ {
				seen[h.run(pkt{src: netip.MustParseAddr("198.18.0.7"), dst: vip4, sport: sport, dport: sport}.build())] = true
			}
			if mode == flow.Tuple5 {
				require.Greater(t, len(seen), 4)
			} else {
				require.Len(t, seen, 1)
			}
		})
	}
}

// TestStickyAcrossReload: a flow keeps its backend when the pool changes
// (a backend added), while new flows spread over the new pool; a backend
// going down moves its flows; draining keeps them.
func TestStickyAcrossReload(t *testing.T) {
	rule := func(bs []flow.Backend) flow.Rule {
		return flow.Rule{Name: "web", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: bs}
	}
	h := newHarness(t, true, rule(backends(4, 1)))
	type conn struct {
		p    pkt
		dest string
	}
	var conns []conn
	for i := 0; i < 200; i++ {
		p := pkt{src: netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}), dst: vip4, sport: uint16(1000 + i), dport: 80, tcp: true, syn: true}
		conns = append(conns, conn{p, h.run(p.build())})
	}
	// Reload with 8 backends: all established flows stay.
	_, err := h.rules.Update(2, []flow.Rule{rule(backends(8, 1))})
	require.NoError(t, err)
	// The same configuration without a connection table: Maglev alone.
	st, err := balance.New(balance.Config{Rules: h.rules, Hasher: flow.NewHasher(42)})
	require.NoError(t, err)
	nostate := &harness{t: t, rules: h.rules, stage: st, pl: engine.NewPipeline(engine.Parse{}, st)}
	nostate.batch.Counters = &nostate.ctr
	moved := 0
	for _, c := range conns {
		p := c.p
		p.syn, p.ack = false, true
		require.Equal(t, c.dest, h.run(p.build()), "flow moved on reload")
		if nostate.run(p.build()) != c.dest {
			moved++
		}
	}
	require.Greater(t, moved, 50, "the test must exercise flows Maglev alone would move")

	// Backend dip00 goes down, dip01 drains.
	bs := backends(8, 1)
	bs[0].State = flow.BackendDown
	bs[1].State = flow.BackendDraining
	_, err = h.rules.Update(3, []flow.Rule{rule(bs)})
	require.NoError(t, err)
	for _, c := range conns {
		p := c.p
		p.syn, p.ack = false, true
		got := h.run(p.build())
		switch c.dest {
		case "dip00":
			require.NotEqual(t, "dip00", got, "flows of a down backend move")
		default:
			require.Equal(t, c.dest, got, "flows of healthy or draining backends stay")
		}
	}
	// New flows never go to the down or draining backend.
	for i := 0; i < 200; i++ {
		p := pkt{src: netip.AddrFrom4([4]byte{198, 18, 1, byte(i)}), dst: vip4, sport: uint16(3000 + i), dport: 80, tcp: true, syn: true}
		got := h.run(p.build())
		require.NotEqual(t, "dip00", got)
		require.NotEqual(t, "dip01", got)
	}
}

// TestSameChoiceAcrossMuxes: two stages with the same configuration and
// seed (two Muxes) pick the same backend for every flow, whichever saw it
// first and whatever the order of backends in their documents.
func TestSameChoiceAcrossMuxes(t *testing.T) {
	bs := backends(10, 1)
	rev := append([]flow.Backend(nil), bs...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	a := newHarness(t, true, flow.Rule{Name: "r", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: bs})
	b := newHarness(t, true, flow.Rule{Name: "r", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: rev})
	for i := 0; i < 500; i++ {
		p := pkt{src: netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), dst: vip4, sport: uint16(i * 7), dport: 80, tcp: true, ack: true}
		require.Equal(t, a.run(p.build()), b.run(p.build()))
	}
}

// TestClassTransitions: a flow is entered untrusted whatever its first
// packet, proven by a later segment at least ProveAfter after its entry,
// never demoted by a SYN, closed by FIN or RST, and started over by a SYN
// after closing.
func TestClassTransitions(t *testing.T) {
	h := newHarness(t, true, flow.Rule{Name: "r", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(2, 1)})
	prove := h.conns.ProveAfter()
	p := pkt{src: netip.MustParseAddr("198.18.0.1"), dst: vip4, sport: 999, dport: 80, tcp: true}
	key := flow.KeyFrom(0, flow.ProtoTCP, netip.AddrPortFrom(p.src, 999), netip.AddrPortFrom(vip4, 80))
	class := func() flow.StateClass {
		_, c, ok := h.conns.Lookup(&key, h.now)
		require.True(t, ok)
		return c
	}
	steps := []struct {
		after         flow.Tick
		syn, ack, fin bool
		want          flow.StateClass
	}{
		{syn: true, want: flow.ClassUntrusted},
		{after: 5, ack: true, want: flow.ClassUntrusted},          // the handshake's ACK: too soon
		{after: prove - 10, ack: true, want: flow.ClassUntrusted}, // still ProveAfter − 5 ms
		{after: 5, ack: true, want: flow.ClassEstablished},        // ProveAfter after the SYN
		{after: 1, syn: true, want: flow.ClassEstablished},        // a SYN does not demote
		{after: 1, fin: true, ack: true, want: flow.ClassClosing},
		{after: 1, ack: true, want: flow.ClassClosing},
		{after: 1, syn: true, want: flow.ClassUntrusted},                // the tuple reused
		{after: prove, fin: true, ack: true, want: flow.ClassUntrusted}, // a FIN proves nothing
	}
	for i, s := range steps {
		h.now += s.after
		p.syn, p.ack, p.fin = s.syn, s.ack, s.fin
		h.run(p.build())
		require.Equal(t, s.want, class(), "step %d", i)
	}
	// A flow first seen with an ACK starts untrusted, and a burst of ACKs
	// does not prove it.
	p.sport = 1001
	p.syn, p.ack, p.fin = false, true, false
	for range 10 {
		h.run(p.build())
	}
	key.SrcPort = 1001
	require.Equal(t, flow.ClassUntrusted, class())
	st := h.stage.Stats()
	require.Equal(t, balance.Stats{Inserted: 2, Promoted: 1}, st)
	require.Equal(t, map[string]balance.Stats{"r": st}, h.stage.VIPStats())
}

func TestNewErrors(t *testing.T) {
	_, err := balance.New(balance.Config{})
	require.Error(t, err)
}

func TestBalanceNoAllocs(t *testing.T) {
	h := newHarness(t, true, flow.Rule{Name: "r", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(4, 1)})
	frames := make([][]byte, 64)
	for i := range frames {
		frames[i] = pkt{src: netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}), dst: vip4, sport: uint16(i), dport: 80, tcp: true, ack: true}.build()
	}
	port, err := engine.NewMemPort(engine.MemPortConfig{})
	require.NoError(t, err)
	port.Replay(frames)
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{port}, Inputs: []engine.Input{{Port: 0, Pipeline: h.pl}}})
	require.NoError(t, err)
	w.Poll()
	require.Zero(t, testing.AllocsPerRun(100, func() { w.Poll() }))
	var s engine.Stats
	w.Counters().Snapshot(&s)
	require.Zero(t, s.Dropped())
}

// TestNewFlowFlag: the first packet of a flow is marked FlagNewFlow, the
// next ones are not, and a flow whose backend went down is new again where
// it is re-placed.
func TestNewFlowFlag(t *testing.T) {
	rule := func(bs []flow.Backend) flow.Rule {
		return flow.Rule{Name: "web", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: bs}
	}
	h := newHarness(t, true, rule(backends(2, 1)))
	isNew := func(p pkt) (string, bool) {
		dest := h.run(p.build())
		return dest, h.pool[0].Flags&engine.FlagNewFlow != 0
	}
	p := pkt{src: netip.MustParseAddr("198.18.0.9"), dst: vip4, sport: 4000, dport: 80, tcp: true, syn: true}
	dest, n := isNew(p)
	require.True(t, n, "a SYN of an unknown flow")
	p.syn, p.ack = false, true
	_, n = isNew(p)
	require.False(t, n, "the flow's second packet")

	bs := backends(2, 1)
	for i := range bs {
		if bs[i].Name == dest {
			bs[i].State = flow.BackendDown
		}
	}
	_, err := h.rules.Update(2, []flow.Rule{rule(bs)})
	require.NoError(t, err)
	moved, n := isNew(p)
	require.NotEqual(t, dest, moved)
	require.True(t, n, "re-placed after its backend went down")
	_, n = isNew(p)
	require.False(t, n)
}

// settled runs frame through Parse and the stage's Pass and reports
// whether Place found it Settled.
func (h *harness) settled(frame []byte) bool {
	ok, _ := h.settledSeen(frame)
	return ok
}

// settledSeen is settled that also returns Pass.Seen.
func (h *harness) settledSeen(frame []byte) (bool, flow.Tick) {
	h.load(frame)
	engine.Parse{}.Process(&h.batch)
	var ps balance.Pass
	h.stage.Begin(&h.batch, &ps)
	ps.Run(h.batch.Packets())
	ps.End()
	return ps.Settled(0), ps.Seen(0)
}

// TestPassSeen: for a Settled packet, Pass.Seen is the entry's last-seen
// as the lookup left it: as it was while it lags by at most RefreshAfter,
// the pass's tick once the lookup refreshed it.
func TestPassSeen(t *testing.T) {
	bs := backends(1, 1)
	udpRule := flow.Rule{Name: "u", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoUDP, Port: 53}, Backends: bs}
	h := newHarness(t, true, udpRule)
	udp := pkt{src: netip.MustParseAddr("198.18.0.1"), dst: vip4, sport: 999, dport: 53}
	slack := h.conns.RefreshAfter(flow.ClassUDP)
	require.Positive(t, slack)
	h.settled(udp.build())
	h.now += h.conns.ProveAfter()
	h.settled(udp.build()) // promoted: last seen now
	p := h.now
	for _, s := range []struct {
		name  string
		after flow.Tick
		seen  func() flow.Tick
	}{
		{"within RefreshAfter", slack - 1, func() flow.Tick { return p }},
		{"at RefreshAfter", 1, func() flow.Tick { return p }},
		{"past it: refreshed", 1, func() flow.Tick { p = h.now; return p }},
		{"after the refresh", 5, func() flow.Tick { return p }},
	} {
		h.now += s.after
		ok, seen := h.settledSeen(udp.build())
		require.True(t, ok, s.name)
		require.Equal(t, s.seen(), seen, s.name)
	}
}

// TestPassSettled: Pass.Settled holds exactly for a packet placed by a
// proven flow's entry (established TCP, or UDP) of the packet's own class
// at a backend that is up — the packets whose flow's next packets of that
// class are placed the same way, which the Mux's fast path keeps.
func TestPassSettled(t *testing.T) {
	bs := backends(1, 1)
	tcpRule := flow.Rule{Name: "t", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: bs}
	udpRule := flow.Rule{Name: "u", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoUDP, Port: 53}, Backends: bs}
	h := newHarness(t, true, tcpRule, udpRule)
	prove := h.conns.ProveAfter()
	tcp := pkt{src: netip.MustParseAddr("198.18.0.1"), dst: vip4, sport: 999, dport: 80, tcp: true}
	udp := pkt{src: netip.MustParseAddr("198.18.0.1"), dst: vip4, sport: 999, dport: 53}
	steps := []struct {
		name          string
		p             pkt
		after         flow.Tick
		syn, ack, fin bool
		want          bool
	}{
		{name: "SYN, new", p: tcp, syn: true},
		{name: "ACK, untrusted", p: tcp, after: prove, ack: true}, // promoted by this one: not settled
		{name: "ACK, established", p: tcp, after: 1, ack: true, want: true},
		{name: "SYN on established", p: tcp, after: 1, syn: true},
		{name: "ACK again", p: tcp, after: 1, ack: true, want: true},
		{name: "FIN", p: tcp, after: 1, fin: true, ack: true},
		{name: "ACK, closing", p: tcp, after: 1, ack: true},
		{name: "UDP, new", p: udp, after: 1},
		{name: "UDP, promoted", p: udp, after: prove},
		{name: "UDP, proven", p: udp, after: 1, want: true},
	}
	for _, s := range steps {
		h.now += s.after
		p := s.p
		p.syn, p.ack, p.fin = s.syn, s.ack, s.fin
		require.Equal(t, s.want, h.settled(p.build()), s.name)
	}
	// The backend down: the flow is placed anew, not settled.
	down := slices.Clone(bs)
	down[0].State = flow.BackendDown
	udpRule.Backends = down
	_, err := h.rules.Update(2, []flow.Rule{tcpRule, udpRule})
	require.NoError(t, err)
	h.now++
	require.False(t, h.settled(udp.build()), "backend down")
}
