package nat_test

import (
	"cmp"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/nat"
)

// TestFloods: the Host Agent's NAT table under floods of every kind from
// spoofed sources — the flows a Mux forwards without an entry of its own
// (its VIP past its share) reach the host — 20 × the table's Capacity over
// one untrusted timeout, with the VM answering as a kernel does (SYN-ACK to
// a SYN, RST to a stray ACK or FIN). Every connection established before
// the flood keeps its entry, and ≥ 95 % of the connections opened during
// it prove themselves and get theirs. A legitimate connection sends its
// SYN, the handshake's ACK 20 ms later, then a segment every 100 ms for a
// second; the VM answers each.
func TestFloods(t *testing.T) {
	const (
		capacity = 1024
		times    = 20
		nEstab   = 300
		nLegit   = 500
		duration = 10_000 // ms
		start    = 3000
	)
	web, dns := ap(vipA, 80), ap(vipA, 53)
	kinds := []struct {
		name  string
		udp   bool
		pkts  []pkt // flags only
		reply bool  // the VM answers each (SYN-ACK or RST)
	}{
		{name: "SYN", pkts: []pkt{{syn: true}}, reply: true},
		{name: "FIN", pkts: []pkt{{fin: true, ack: true}}, reply: true},
		{name: "RST", pkts: []pkt{{rst: true}}},
		{name: "ACK-pairs", pkts: []pkt{{ack: true}, {ack: true}}, reply: true},
		{name: "UDP", udp: true, pkts: []pkt{{proto: flow.ProtoUDP}, {proto: flow.ProtoUDP}}, reply: true},
	}
	type event struct {
		at    flow.Tick
		seq   int
		p     pkt
		reply bool // a VM packet (Return), else a client packet (Inbound)
	}
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			e := newEnvTable(t, nat.TableConfig{Capacity: capacity}, testRules(), testLocals())
			rng := rand.New(rand.NewPCG(11, uint64(len(kind.name))))
			var ev []event
			add := func(at flow.Tick, p pkt, reply bool) {
				ev = append(ev, event{at: at, seq: len(ev), p: p, reply: reply})
			}
			conn := func(c netip.AddrPort, t0 flow.Tick) {
				syn := pkt{src: c, dst: web, syn: true}
				add(t0, syn, false)
				add(t0+1, pkt{src: ap(dipA, 8080), dst: c, syn: true, ack: true}, true)
				for at := t0 + 20; at <= t0+1000; at += 100 {
					add(at, tcp(c, web), false)
					add(at+1, tcp(ap(dipA, 8080), c), true)
				}
			}
			var estab, legit []netip.AddrPort
			for i := range nEstab {
				c := ap(netip.AddrFrom4([4]byte{198, 19, 200, byte(i)}), uint16(10000+i))
				estab = append(estab, c)
				conn(c, flow.Tick(1000+rng.IntN(1000)))
			}
			for i := range capacity * times {
				at := flow.Tick(start + i*duration/(capacity*times))
				c := ap(netip.AddrFrom4([4]byte{198, 18, byte(rng.IntN(256)), byte(rng.IntN(256))}), uint16(1024+rng.IntN(60000)))
				for j, f := range kind.pkts {
					f.src, f.dst = c, web
					if kind.udp {
						f.dst = dns
					}
					add(at+flow.Tick(j), f, false)
				}
				if kind.reply {
					r := pkt{src: ap(dipA, 8080), dst: c, rst: true}
					switch {
					case kind.udp:
						r = udp(ap(dipA, 53), c)
					case kind.pkts[0].syn:
						r = pkt{src: ap(dipA, 8080), dst: c, syn: true, ack: true}
					}
					add(at+flow.Tick(len(kind.pkts)), r, true)
				}
			}
			for i := range nLegit {
				c := ap(netip.AddrFrom4([4]byte{198, 19, 201 + byte(i/250), byte(i)}), uint16(20000+i))
				legit = append(legit, c)
				conn(c, flow.Tick(start+rng.IntN(duration-1000)))
			}
			slices.SortFunc(ev, func(x, y event) int { return cmp.Or(cmp.Compare(x.at, y.at), cmp.Compare(x.seq, y.seq)) })
			for _, x := range ev {
				e.now = x.at
				p := x.p
				if x.reply {
					e.reply(p)
					continue
				}
				r := e.inbound(p.to(macA))
				if p.src.Addr().As4()[1] == 19 {
					require.Empty(t, r.reason, "a legitimate packet dropped")
				}
			}
			proven := func(cs []netip.AddrPort) (n int) {
				for _, c := range cs {
					if st, ok := e.state(flow.ProtoTCP, vni, ap(dipA, 8080), c); ok && st.Class == flow.ClassEstablished {
						n++
					}
				}
				return n
			}
			ns := e.tr.Stats()
			t.Logf("%s flood: %d of %d new connections proven; NAT %+v; table %+v", kind.name, proven(legit), nLegit, ns, e.table.Conns().Stats())
			require.Equal(t, nEstab, proven(estab), "established connections lost their entry")
			require.GreaterOrEqual(t, proven(legit)*100, nLegit*95, "new connections without an entry")
		})
	}
}

// TestDirectFloodKeepsRoom: a VM answering with SYN-ACKs from its service
// port to many addresses (a tenant filling the table, or the answers to a
// spoofed SYN flood whose entries were evicted) makes direct connections,
// whose entries are promoted like any other, within the table's cap on
// proven entries: connections through the VIP opened afterwards find
// room, and every SYN-ACK still leaves untranslated on the Direct port.
//
// "Find room" is per key, and a key has two buckets: with the proven
// entries at their cap a new key finds both of its buckets full of them
// about once in 30,000, and then moves one of them to its other bucket
// (flow.ConnTableStats.Moves). With moves into free slots only (a full
// table has few), 4 runs in 400 had one of the 200 connections refused
// and one run two, which failed the test's allowance of one; with moves
// over the other bucket's untrusted entries, 0 runs in 1,000 refused any.
// Without the cap every connection is refused.
func TestDirectFloodKeepsRoom(t *testing.T) {
	const capacity, directPort = 1024, 9
	e := newEnvTable(t, nat.TableConfig{Capacity: capacity}, testRules(), testLocals(),
		func(c *nat.Config) { c.Direct, c.HasDirect = directPort, true })
	n := 4 * e.table.Conns().Cap()
	for i := range n {
		dst := ap(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), uint16(1024+i))
		res := e.reply(pkt{src: ap(dipA, 8080), dst: dst, syn: true, ack: true})
		require.Empty(t, res.reason)
		require.EqualValues(t, directPort, res.p.OutPort)
	}
	require.EqualValues(t, n, e.tr.Stats().Direct)
	require.LessOrEqual(t, e.table.Conns().Stats().Proven, capacity, "direct entries past the cap on proven entries")

	without := 0
	for i := range 200 {
		c := ap(netip.AddrFrom4([4]byte{198, 19, 50, byte(i)}), uint16(30000+i))
		require.Empty(t, e.inbound(pkt{src: c, dst: ap(vipA, 80), syn: true}.to(macA)).reason)
		if _, ok := e.state(flow.ProtoTCP, vni, ap(dipA, 8080), c); !ok {
			without++
		}
	}
	require.Zero(t, without, "connections through the VIP without an entry")
	require.EqualValues(t, without, e.tr.Stats().TableRefused)
}
