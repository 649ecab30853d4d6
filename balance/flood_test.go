package balance_test

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// A flood scenario runs, on one clock, established connections opened
// before a flood, the flood itself (spoofed flows of one kind, 20 × the
// table's Capacity over one untrusted timeout: 2 × Capacity new flows per
// second), and legitimate connections opened while it lasts. A legitimate
// connection sends its SYN, the handshake's ACK one RTT (20 ms) later, then
// a segment every 100 ms for a second.
const (
	floodCap      = 1024
	floodTimes    = 20
	floodEstab    = 300
	floodLegit    = 500
	floodDuration = 10_000 // ms: the default untrusted timeout
)

// floodKind is one kind of spoofed flood: the packets of one spoofed flow.
type floodKind struct {
	name string
	udp  bool
	pkts []pkt // flags only; the tuple is filled in
}

var floodKinds = []floodKind{
	{name: "SYN", pkts: []pkt{{syn: true}}},
	{name: "FIN", pkts: []pkt{{fin: true, ack: true}}},
	{name: "RST", pkts: []pkt{{rst: true}}},
	{name: "ACK-pairs", pkts: []pkt{{ack: true}, {ack: true}}},
	{name: "UDP", udp: true, pkts: []pkt{{}, {}}},
}

type floodEvent struct {
	at  flow.Tick
	seq int // keeps a flow's packets in order at equal times
	p   pkt
}

// legitConn returns the packets of one legitimate connection from src:sport
// to dst:80 opened at t0.
func legitConn(src, dst netip.Addr, sport uint16, t0 flow.Tick) []floodEvent {
	base := pkt{src: src, dst: dst, sport: sport, dport: 80, tcp: true}
	syn, ack := base, base
	syn.syn = true
	ack.ack = true
	ev := []floodEvent{{at: t0, p: syn}}
	for at := t0 + 20; at <= t0+1000; at += 100 {
		ev = append(ev, floodEvent{at: at, p: ack})
	}
	return ev
}

// spoofed returns a random client address (198.18.0.0/15 only).
func spoofed(rng *rand.Rand) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 18 + byte(rng.IntN(2)), byte(rng.IntN(256)), byte(rng.IntN(256))})
}

// floodRun is the outcome of a scenario.
type floodRun struct {
	h           *harness
	estab       []flow.Key // opened before the flood
	estabDest   []string
	legit       []flow.Key // opened during the flood
	legitDest   []string
	proven      func(k flow.Key) (string, bool)
	maxShareOfA int // most untrusted entries of the attacked rule held at once (sampled every 100 ms)
}

// runFlood runs kind against VIP a (legitimate connections to legitVIP)
// with the given VIP share.
func runFlood(t *testing.T, kind floodKind, share float64, legitVIP netip.Addr) *floodRun {
	vipA, vipB := netip.MustParseAddr("198.18.100.1"), netip.MustParseAddr("198.18.100.2")
	rules := []flow.Rule{
		{Name: "a", VIP: flow.VIP{Addr: vipA, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(10, 1)},
		{Name: "a-udp", VIP: flow.VIP{Addr: vipA, Proto: flow.ProtoUDP, Port: 53}, Backends: backends(10, 1)},
		{Name: "b", VIP: flow.VIP{Addr: vipB, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(10, 1)},
	}
	for i := range rules[1].Backends {
		rules[1].Backends[i].Name += "u"
	}
	h := &harness{t: t, rules: flow.NewRules(), now: 1}
	_, err := h.rules.Update(1, rules)
	require.NoError(t, err)
	h.conns, err = flow.NewConnTable(flow.ConnTableConfig{Capacity: floodCap})
	require.NoError(t, err)
	h.stage, err = balance.New(balance.Config{Rules: h.rules, Conns: h.conns, Hasher: flow.NewHasher(42),
		VIPShare: share, Clock: func() flow.Tick { return h.now }})
	require.NoError(t, err)
	h.pl = engine.NewPipeline(engine.Parse{}, h.stage)
	h.batch.Counters = &h.ctr

	rng := rand.New(rand.NewPCG(7, uint64(len(kind.name))))
	run := &floodRun{h: h}
	var ev []floodEvent
	add := func(es []floodEvent) {
		for _, e := range es {
			e.seq = len(ev)
			ev = append(ev, e)
		}
	}
	keyOf := func(p pkt) flow.Key {
		return flow.KeyFrom(0, flow.ProtoTCP, netip.AddrPortFrom(p.src, p.sport), netip.AddrPortFrom(p.dst, p.dport))
	}
	// Established connections to both VIPs, opened in the first second.
	for i := range floodEstab {
		dst := vipA
		if i%2 == 1 {
			dst = vipB
		}
		es := legitConn(netip.AddrFrom4([4]byte{198, 19, 0, byte(i)}), dst, uint16(10000+i), flow.Tick(1+rng.IntN(1000)))
		run.estab = append(run.estab, keyOf(es[0].p))
		add(es)
	}
	// The flood, from 3 s to 13 s, and legitimate connections opened during it.
	const start = 3000
	for i := range floodCap * floodTimes {
		at := flow.Tick(start + i*floodDuration/(floodCap*floodTimes))
		src, sport := spoofed(rng), uint16(1024+rng.IntN(60000))
		for j, f := range kind.pkts {
			f.src, f.dst, f.sport, f.dport, f.tcp = src, vipA, sport, 80, !kind.udp
			if kind.udp {
				f.dport = 53
			}
			add([]floodEvent{{at: at + flow.Tick(j), p: f}}) // a burst
		}
	}
	for i := range floodLegit {
		es := legitConn(netip.AddrFrom4([4]byte{198, 19, 1 + byte(i/250), byte(i)}), legitVIP, uint16(20000+i),
			flow.Tick(start+rng.IntN(floodDuration-1000)))
		run.legit = append(run.legit, keyOf(es[0].p))
		add(es)
	}
	slices.SortFunc(ev, func(x, y floodEvent) int { return cmp.Or(cmp.Compare(x.at, y.at), cmp.Compare(x.seq, y.seq)) })

	snap := h.rules.Load()
	attacked := "a"
	if kind.udp {
		attacked = "a-udp"
	}
	dest := map[flow.Key]string{}
	nextSample := flow.Tick(0)
	for _, e := range ev {
		h.now = e.at
		if e.at >= nextSample {
			nextSample = e.at + 100
			n := 0
			h.conns.Range(func(_ flow.Key, id uint32, cls flow.StateClass, seen flow.Tick) bool {
				if r, _, ok := snap.Backend(id); ok && r.Name == attacked && cls == flow.ClassUntrusted && int32(h.now-seen) <= 10_000 {
					n++
				}
				return true
			})
			run.maxShareOfA = max(run.maxShareOfA, n)
		}
		got := h.run(e.p.build())
		k := keyOf(e.p)
		if d, ok := dest[k]; ok && e.p.tcp && !e.p.syn && d != got && e.p.src.As4()[1] == 19 {
			t.Fatalf("legitimate flow %v moved from %s to %s", k, d, got)
		}
		dest[k] = got
	}
	for _, k := range run.estab {
		run.estabDest = append(run.estabDest, dest[k])
	}
	for _, k := range run.legit {
		run.legitDest = append(run.legitDest, dest[k])
	}
	run.proven = func(k flow.Key) (string, bool) {
		id, cls, ok := h.conns.Lookup(&k, h.now)
		if !ok || cls != flow.ClassEstablished {
			return "", false
		}
		r, idx, ok := snap.Backend(id)
		if !ok {
			return "", false
		}
		return r.Backends[idx].Name, true
	}
	return run
}

// provenShare returns how many of keys hold a proven entry on the backend
// their packets went to.
func (r *floodRun) provenShare(keys []flow.Key, dests []string) (ok int, missing []string) {
	for i, k := range keys {
		if d, proven := r.proven(k); proven && d == dests[i] {
			ok++
		} else if len(missing) < 5 {
			missing = append(missing, fmt.Sprintf("%v (went to %s, entry %q proven=%v)", k, dests[i], d, proven))
		}
	}
	return ok, missing
}

// TestFloods: floods of every kind from spoofed sources, 20 × the table's
// Capacity, with the per-VIP share off (so that the table's own defence is
// what holds): every connection established before the flood keeps its
// entry and backend, and ≥ 95 % of the connections opened during the flood
// prove themselves and get their entry.
func TestFloods(t *testing.T) {
	for _, kind := range floodKinds {
		t.Run(kind.name, func(t *testing.T) {
			r := runFlood(t, kind, 1, netip.MustParseAddr("198.18.100.1"))
			n, missing := r.provenShare(r.estab, r.estabDest)
			require.Equal(t, len(r.estab), n, "established connections lost their entry: %v", missing)
			n, missing = r.provenShare(r.legit, r.legitDest)
			t.Logf("%s flood: %d of %d new connections proven; stage %+v; table %+v", kind.name, n, len(r.legit), r.h.stage.Stats(), r.h.conns.Stats())
			require.GreaterOrEqual(t, n*100, len(r.legit)*95, "new connections without an entry: %v", missing)
		})
	}
}

// TestFloodVIPShare: with the default share, a flood on VIP a holds at
// most its share of the table, a's established connections survive, and
// VIP b's new connections are unaffected: all of them prove themselves, none
// refused.
func TestFloodVIPShare(t *testing.T) {
	for _, kind := range floodKinds {
		t.Run(kind.name, func(t *testing.T) {
			r := runFlood(t, kind, 0, netip.MustParseAddr("198.18.100.2"))
			n, missing := r.provenShare(r.estab, r.estabDest)
			require.Equal(t, len(r.estab), n, "established connections lost their entry: %v", missing)
			n, missing = r.provenShare(r.legit, r.legitDest)
			require.Equal(t, len(r.legit), n, "VIP b's new connections without an entry: %v", missing)
			vs := r.h.stage.VIPStats()
			t.Logf("%s flood: VIP stats %+v; at most %d entries of a", kind.name, vs, r.maxShareOfA)
			require.LessOrEqual(t, r.maxShareOfA, int(balance.DefaultVIPShare*floodCap), "VIP a past its share")
			attacked := "a"
			if kind.udp {
				attacked = "a-udp"
			}
			require.NotZero(t, vs[attacked].ShareRefused, "the flood was not limited")
			require.Zero(t, vs["b"].ShareRefused+vs["b"].Refused)
		})
	}
}

// TestVIPStatsAcrossReloads: the per-VIP counters follow their VIP by
// name through a reload that reorders the rules, a health-like change
// that keeps every ID, and one that removes a VIP (kept under its name).
func TestVIPStatsAcrossReloads(t *testing.T) {
	a := flow.Rule{Name: "a", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 80}, Backends: backends(2, 1)}
	b := flow.Rule{Name: "b", VIP: flow.VIP{Addr: vip4, Proto: flow.ProtoTCP, Port: 81}, Backends: backends(2, 1)}
	h := newHarness(t, true, a, b)
	send := func(port uint16, n int) {
		for i := range n {
			h.run(pkt{src: netip.AddrFrom4([4]byte{198, 18, 7, byte(i)}), dst: vip4, sport: uint16(1000 + i), dport: port, tcp: true, syn: true}.build())
		}
	}
	send(80, 3)
	send(81, 5)
	want := map[string]balance.Stats{"a": {Inserted: 3}, "b": {Inserted: 5}}
	require.Equal(t, want, h.stage.VIPStats())
	_, err := h.rules.Update(2, []flow.Rule{b, a}) // reordered: new IDs
	require.NoError(t, err)
	send(80, 1) // a rebind happens on the next batch
	want["a"] = balance.Stats{Inserted: 3}
	require.Equal(t, want, h.stage.VIPStats(), "a's known flow is no new insert; counters kept by name")
	a2 := a
	a2.Backends = backends(2, 1)
	a2.Backends[0].State = flow.BackendDown
	_, err = h.rules.Update(3, []flow.Rule{b, a2}) // same IDs, other states
	require.NoError(t, err)
	send(81, 7)
	want["b"] = balance.Stats{Inserted: 7}
	require.Equal(t, want, h.stage.VIPStats())
	_, err = h.rules.Update(4, []flow.Rule{b})
	require.NoError(t, err)
	send(81, 8)
	want["b"] = balance.Stats{Inserted: 8}
	require.Equal(t, want, h.stage.VIPStats(), "a removed: kept under its name")
	require.Equal(t, balance.Stats{Inserted: 11}, h.stage.Stats())
}
