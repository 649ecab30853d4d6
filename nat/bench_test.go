package nat_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/nat"
)

// benchFlows returns nflows client packets (TCP to the web VIP, spread over
// the two local backends, IPv4) and the VM's replies, in batches of 64.
func benchFlows(b *testing.B, nflows int) (in, out []*batch) {
	for i := 0; i < nflows; i += 64 {
		var fi, fo [][]byte
		for j := i; j < i+64 && j < nflows; j++ {
			c := ap(netip.AddrFrom4([4]byte{198, 18, byte(j >> 16), byte(j >> 8)}), uint16(1024+j&0xff))
			mac, dip := macA, dipA
			if j%2 == 1 {
				mac, dip = macB, dipB
			}
			p := tcp(c, ap(vipA, 80)).to(mac)
			fi = append(fi, p.frame())
			fo = append(fo, p.withDst(ap(dip, 8080)).reply().frame())
		}
		in = append(in, newBatch(b, vni, fi))
		out = append(out, newBatch(b, vni, fo))
	}
	return in, out
}

func benchEnv(b *testing.B, nflows int) *env {
	e := &env{t: b, rules: flow.NewRules(), now: 1000}
	if _, err := e.rules.Update(1, testRules()); err != nil {
		b.Fatal(err)
	}
	var err error
	if e.table, err = nat.NewTable(nat.TableConfig{Capacity: max(nflows, 1024)}); err != nil {
		b.Fatal(err)
	}
	e.tr, err = nat.New(nat.Config{Rules: e.rules, Table: e.table, DIPs: testLocals(), Uplink: uplink,
		Infra: infra, Clock: func() flow.Tick { return e.now }})
	if err != nil {
		b.Fatal(err)
	}
	e.in, e.ret = e.tr.Inbound(), e.tr.Return()
	return e
}

// runBench times fn over b.N iterations and reports the time per packet
// with the cost of restoring the batches (copying the original frames and
// parse results back, which a real pipeline does not do) measured first
// and subtracted: "ns/pkt" is the stages' own cost. pkts is packets per
// iteration.
func runBench(b *testing.B, pkts int, restore func(i int), fn func(i int)) {
	b.ReportAllocs()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		restore(i)
	}
	base := time.Since(start)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		restore(i)
		fn(i)
	}
	b.StopTimer()
	n := float64(b.N) * float64(pkts)
	b.ReportMetric(float64(b.Elapsed()-base)/n, "ns/pkt")
	b.ReportMetric(float64(base)/n, "restore-ns/pkt")
}

var benchSizes = []int{64, 1 << 14}

// BenchmarkInbound: client packets of established connections (state
// hit), 64 per batch, over 64 or 16384 connections.
func BenchmarkInbound(b *testing.B) {
	for _, nflows := range benchSizes {
		b.Run(fmt.Sprintf("flows=%d", nflows), func(b *testing.B) {
			e := benchEnv(b, nflows)
			in, _ := benchFlows(b, nflows)
			for _, bt := range in {
				e.in.Process(bt.reset())
			}
			runBench(b, 64,
				func(i int) { in[i%len(in)].reset() },
				func(i int) { e.in.Process(&in[i%len(in)].b) })
		})
	}
}

// BenchmarkReturn: the VM's replies of those connections (state hit).
func BenchmarkReturn(b *testing.B) {
	for _, nflows := range benchSizes {
		b.Run(fmt.Sprintf("flows=%d", nflows), func(b *testing.B) { benchReturn(b, nflows) })
	}
}

// benchReturn runs replies of nflows established connections through
// Return, 64 per batch (BenchmarkReturn; BenchmarkSNAT's comparison).
func benchReturn(b *testing.B, nflows int) {
	e := benchEnv(b, nflows)
	in, out := benchFlows(b, nflows)
	for _, bt := range in {
		e.in.Process(bt.reset())
	}
	runBench(b, 64,
		func(i int) { out[i%len(out)].reset() },
		func(i int) { e.ret.Process(&out[i%len(out)].b) })
}

// BenchmarkReturnStateless: replies without state (after an agent
// restart), translated by their unique rule.
func BenchmarkReturnStateless(b *testing.B) {
	e := benchEnv(b, 64)
	_, out := benchFlows(b, 64)
	runBench(b, 64,
		func(i int) { out[0].reset() },
		func(i int) { e.ret.Process(&out[0].b) })
}

// BenchmarkHostAgentBothDirections: one batch of client packets through
// Inbound and one batch of replies through Return per iteration; ns/pkt is
// per packet (half the cost of one request + one reply).
func BenchmarkHostAgentBothDirections(b *testing.B) {
	for _, nflows := range benchSizes {
		b.Run(fmt.Sprintf("flows=%d", nflows), func(b *testing.B) {
			e := benchEnv(b, nflows)
			in, out := benchFlows(b, nflows)
			for _, bt := range in {
				e.in.Process(bt.reset())
			}
			runBench(b, 128,
				func(i int) { in[i%len(in)].reset(); out[i%len(out)].reset() },
				func(i int) {
					e.in.Process(&in[i%len(in)].b)
					e.ret.Process(&out[i%len(out)].b)
				})
		})
	}
}

// BenchmarkBuildingBlocks measures, in the same run, the two calls from
// other packages that dominate both stages: a flow.ConnTable lookup of the
// reply keys and header.RewriteIPv4 of one side, over the same 64
// packets, so the stages' own overhead can be read off BenchmarkInbound
// and BenchmarkReturn.
func BenchmarkBuildingBlocks(b *testing.B) {
	e := benchEnv(b, 64)
	in, out := benchFlows(b, 64)
	e.in.Process(in[0].reset())
	keys := make([]flow.Key, 0, 64)
	for i := range out[0].frames {
		keys = append(keys, out[0].saved[i].Key)
	}
	b.Run("conntable-lookup", func(b *testing.B) {
		conns := e.table.Conns()
		runBench(b, 64, func(int) {}, func(int) {
			for i := range keys {
				conns.Lookup(&keys[i], e.now)
			}
		})
	})
	b.Run("rewrite-ipv4", func(b *testing.B) {
		addr := [4]byte{198, 19, 1, 1}
		bt := out[0]
		runBench(b, 64, func(int) { bt.reset() }, func(int) {
			for i := range bt.frames {
				p := &bt.pkts[i]
				_ = header.RewriteIPv4(header.IPv4(p.L3()), header.SideSrc, addr, 80)
			}
		})
	})
	b.Run("snapshot-lookup", func(b *testing.B) {
		snap := e.rules.Load()
		bt := in[0]
		runBench(b, 64, func(int) {}, func(int) {
			for i := range bt.frames {
				snap.Lookup(&bt.saved[i].Key)
			}
		})
	})
}

// snatBenchFlows returns nflows outgoing packets of outbound connections
// (TCP, IPv4, dipA through vipO to remotes in 198.18.50.0/24-ish) and the
// remotes' answers, in batches of 64, after opening the connections and
// proving them (one answer each) in e.
func snatBenchFlows(b *testing.B, e *snatEnv, nflows int) (out, in []*batch) {
	for i := 0; i < nflows; i += 64 {
		var fo, fi [][]byte
		for j := i; j < i+64 && j < nflows; j++ {
			r := ap(netip.AddrFrom4([4]byte{198, 18, 50 + byte(j>>12), byte(j >> 4)}), 443)
			c := tcp(ap(dipA, uint16(1024+j&0xfff)), r)
			res := e.out(c)
			if res.reason != "" {
				b.Fatal(res.reason)
			}
			ans := c.withSrc(netip.AddrPortFrom(vipO, res.p.Key.SrcPort)).reply().to(macA)
			if r := e.back(ans, vni); r.reason != "" {
				b.Fatal(r.reason)
			}
			fo = append(fo, c.frame())
			fi = append(fi, ans.frame())
		}
		out = append(out, newBatch(b, vni, fo))
		in = append(in, newBatch(b, vni, fi))
	}
	return out, in
}

// BenchmarkSNAT: the source NAT's two translations of established
// connections, 64 per batch, over 64 or 16384 connections: out (the
// VM's packets, Return stage: a DSR-state miss, then the SNAT's state)
// and in (the remotes' packets, Inbound stage: a rule miss, then the
// SNAT's state); dsr-return is BenchmarkReturn's case, for comparison in
// the same run.
func BenchmarkSNAT(b *testing.B) {
	for _, nflows := range benchSizes {
		for _, dir := range []string{"out", "in", "dsr-return"} {
			b.Run(fmt.Sprintf("%s/flows=%d", dir, nflows), func(b *testing.B) {
				if dir == "dsr-return" {
					benchReturn(b, nflows)
					return
				}
				e := newSNATEnvSized(b, max(2*nflows, 4096), defaultSections(), alloc(vipO, 1024, 65535, dipA, vni))
				out, in := snatBenchFlows(b, e, nflows)
				bts, st := out, engine.Stage(e.ret)
				if dir == "in" {
					bts, st = in, e.in
				}
				runBench(b, 64,
					func(i int) { bts[i%len(bts)].reset() },
					func(i int) { st.Process(&bts[i%len(bts)].b) })
				if s := e.s.Stats(); s.Exhausted+s.NoState+s.Refused != 0 {
					b.Fatalf("drops: %+v", s)
				}
			})
		}
	}
}
