package mux

// A measurement prototype for issue 11's next step (session 14; not part
// of the Mux): a per-worker cache of an established flow's whole decision
// — the outer headers the full pipeline wrote for the flow, with the next
// hop's MACs, and the inner MACs — keyed by the flow key and valid for one
// rule snapshot. A packet whose flow is cached is encapsulated from the
// cache (the inner TTL decremented, the outer lengths and IPv4 checksum
// patched); any other goes through the fused stage, and fills the cache.
// It leaves out what a real one needs and would cost: refreshing the
// shared connection table's entry (lookups do it every 1/32 of the
// timeout), sending FIN, RST and ICMP errors through the full path, the
// per-VIP and per-backend counters' own slots, a next-hop generation, and
// the drop accounting of its miss path (a drop would count twice).
// TestMuxFastPathPrototypeAgrees shows its output is byte-identical to the
// fused stage's over three passes of the agreement traffic;
// BenchmarkMuxFastPathPrototype times both in one process.

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

const fpSlots = 1 << 14

type fpEntry struct {
	key    flow.Key
	snap   *flow.Snapshot
	tmpl   [50 + 12]byte // outer headers, then the inner MACs
	w0, w1 uint16        // the template's IPv4 words 0 and 1 (version/IHL/TOS, total length)
	csum   uint16
	pkts   uint64
	bytes  uint64
}

type fastPath struct {
	full   engine.Stage
	rules  *flow.Rules
	hasher flow.Hasher
	cache  [fpSlots]fpEntry
	keys   [engine.MaxBatch]flow.Key
	slots  [engine.MaxBatch]uint32
	hit    [engine.MaxBatch]bool
	miss   [engine.MaxBatch]int
	sub    engine.Batch
}

func (f *fastPath) Process(b *engine.Batch) {
	snap := f.rules.Load()
	pkts := b.Packets()
	f.sub.Reset()
	f.sub.Worker, f.sub.Now, f.sub.Counters, f.sub.Snapshot = b.Worker, b.Now, b.Counters, b.Snapshot
	nm := 0
	for i, p := range pkts {
		f.hit[i] = false
		if engine.ParsePacket(p, 0) != 0 || p.Flags&engine.FlagIPv4 == 0 && p.Flags&engine.FlagIPv6 == 0 || p.Flags&engine.FlagFragment != 0 ||
			p.L4Proto != flow.ProtoTCP && p.L4Proto != flow.ProtoUDP {
			f.sub.Append(p)
			f.miss[nm] = i
			f.slots[i] = ^uint32(0) // not cached
			nm++
			continue
		}
		f.keys[i] = p.Key
		s := uint32(f.hasher.Hash(&p.Key, flow.Tuple5)) & (fpSlots - 1)
		f.slots[i] = s
		if e := &f.cache[s]; e.snap != snap || e.key != p.Key {
			f.sub.Append(p)
			f.miss[nm] = i
			nm++
			continue
		}
		f.hit[i] = true
	}
	for i, p := range pkts {
		if !f.hit[i] {
			continue
		}
		e := &f.cache[f.slots[i]]
		if e.key != p.Key || e.snap != snap {
			panic("fastPath: a cached entry changed under a hit")
		}
		data := p.Data()
		l3 := int(p.L3Off)
		var l3len int
		var tc uint8
		if p.Flags&engine.FlagIPv4 != 0 {
			ip := header.IPv4(data[l3:])
			l3len, tc = int(ip.TotalLength()), ip.TOS()
			ip.SetTTLWithChecksumUpdate(ip.TTL() - 1)
		} else {
			ip := header.IPv6(data[l3:])
			l3len, tc = 40+int(ip.PayloadLength()), ip.TrafficClass()
			ip.SetHopLimit(ip.HopLimit() - 1)
		}
		start := l3 - 14
		copy(data[start:start+12], e.tmpl[50:62])
		binary.BigEndian.PutUint16(data[start+12:], p.EtherType)
		p.TrimFront(start)
		inner := 14 + l3len
		p.SetLen(inner)
		out, _ := p.Prepend(50)
		*(*[50]byte)(out) = [50]byte(e.tmpl[:50])
		w0 := e.w0&0xff00 | uint16(tc)
		w1 := uint16(20 + 8 + 8 + inner)
		binary.BigEndian.PutUint16(out[14:], w0)
		binary.BigEndian.PutUint16(out[16:], w1)
		sum := uint32(^e.csum) + uint32(^e.w0) + uint32(w0) + uint32(^e.w1) + uint32(w1)
		sum = sum&0xffff + sum>>16
		sum = sum&0xffff + sum>>16
		binary.BigEndian.PutUint16(out[24:], ^uint16(sum))
		binary.BigEndian.PutUint16(out[38:], uint16(8+8+inner))
		e.pkts++
		e.bytes += uint64(inner)
	}
	if nm > 0 {
		f.full.Process(&f.sub)
		for _, i := range f.miss[:nm] {
			p := pkts[i]
			if p.Verdict != engine.VerdictTX {
				b.Drop(p, p.Reason)
				continue
			}
			if f.slots[i] == ^uint32(0) || p.Verdict == engine.VerdictEmit {
				continue
			}
			d := p.Data()
			e := &f.cache[f.slots[i]]
			e.key, e.snap = f.keys[i], snap
			copy(e.tmpl[:], d[:62])
			ip := header.IPv4(d[14:34])
			e.w0, e.w1 = binary.BigEndian.Uint16(ip[0:]), ip.TotalLength()
			e.csum = binary.BigEndian.Uint16(ip[10:])
		}
	}
}

func BenchmarkMuxFastPathPrototype(b *testing.B) {
	doc := benchDocument(b)
	rigs := map[string]*muxRig{}
	for round := 0; round < 3; round++ {
		for _, k := range []string{"fused", "fastpath"} {
			b.Run(fmt.Sprintf("r%d/%s", round, k), func(b *testing.B) {
				r := rigs[k]
				benchMuxRig(b, &r, 1000, func(tb testing.TB, n int) []engine.Stage {
					st, ctl := ourMux(tb, doc, muxConnTable(tb, n))
					if k == "fused" {
						return st
					}
					_ = ctl
					return []engine.Stage{&fastPath{full: st[0], rules: st[0].(*fused).rules, hasher: flow.NewHasher(doc.HashSeed)}}
				})
				rigs[k] = r
			})
		}
	}
}

func TestMuxFastPathPrototypeAgrees(t *testing.T) {
	const n = 3000
	doc := benchDocument(t)
	flows := benchFlows(n, muxAgreeMix, 7, true)
	frames := benchTargets.Frames(flows)
	ours := newMuxRig(t, true, ourMuxStages(t, doc, muxConnTable(t, n))...)
	st, _ := ourMux(t, doc, muxConnTable(t, n))
	fp := newMuxRig(t, true, &fastPath{full: st[0], rules: st[0].(*fused).rules, hasher: flow.NewHasher(doc.HashSeed)})
	// The second pass marks every packet's ECN bits (the inner TOS or
	// traffic class changes within a flow, as a congested router makes
	// it): the outer header's TOS and IPv4 checksum must follow.
	ecn := make([][]byte, len(frames))
	for i, f := range frames {
		g := append([]byte(nil), f...)
		et, l3, err := header.ParseEthernet(g)
		if err != nil {
			t.Fatal(err)
		}
		if et == header.EtherTypeIPv4 {
			old := binary.BigEndian.Uint16(g[l3:])
			g[l3+1] ^= 0x03
			binary.BigEndian.PutUint16(g[l3+10:], header.ChecksumUpdate16(binary.BigEndian.Uint16(g[l3+10:]), old, binary.BigEndian.Uint16(g[l3:])))
		} else {
			g[l3+1] ^= 0x30
		}
		ecn[i] = g
	}
	for pass := 0; pass < 3; pass++ {
		in := frames
		if pass == 1 {
			in = ecn
		}
		for _, r := range []*muxRig{ours, fp} {
			r.port.Inject(in...)
			for r.port.Stats().Queued > 0 {
				r.w.Poll()
			}
		}
		got, want := fp.port.Transmitted(), ours.port.Transmitted()
		if len(got) != len(want) {
			t.Fatalf("pass %d: %d against %d", pass, len(got), len(want))
		}
		for i := range got {
			if string(got[i]) != string(want[i]) {
				t.Fatalf("pass %d frame %d differ\n fp %x\nours %x", pass, i, got[i], want[i])
			}
		}
	}
}
