package nat_test

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/nat"
)

// batch is a reusable batch of parsed frames: reset restores the original
// bytes and parse results, so a stage can run over the same packets again
// without allocating.
type batch struct {
	frames [][]byte
	bufs   [engine.MaxBatch][]byte
	pkts   [engine.MaxBatch]engine.Packet
	saved  [engine.MaxBatch]engine.Packet
	b      engine.Batch
}

func newBatch(t testing.TB, vni uint32, frames [][]byte) *batch {
	require.LessOrEqual(t, len(frames), engine.MaxBatch)
	bt := &batch{frames: frames}
	for i, f := range frames {
		bt.bufs[i] = make([]byte, engine.DefaultHeadroom+len(f)+64)
		copy(bt.bufs[i][engine.DefaultHeadroom:], f)
		p := &bt.saved[i]
		p.SetBuffer(nil, 0, bt.bufs[i], engine.DefaultHeadroom, len(f), 3)
		require.Zero(t, engine.ParsePacket(p, vni))
	}
	bt.b.Counters = new(engine.Counters)
	return bt
}

// reset restores every packet (bytes and metadata) and refills the batch.
func (bt *batch) reset() *engine.Batch {
	bt.b.Reset()
	for i, f := range bt.frames {
		copy(bt.bufs[i][engine.DefaultHeadroom:], f)
		bt.pkts[i] = bt.saved[i]
		bt.b.Append(&bt.pkts[i])
	}
	return &bt.b
}

// flows returns n client packets for the web rule (TCP, VIP A:80 → dipA or
// dipB by MAC, half each) and the VM's replies to them.
func flows(n int) (in, out [][]byte) {
	for i := 0; i < n; i++ {
		c := ap(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), uint16(10000+i))
		mac, dip := macA, dipA
		if i%2 == 1 {
			mac, dip = macB, dipB
		}
		p := tcp(c, ap(vipA, 80)).to(mac)
		in = append(in, p.frame())
		out = append(out, p.withDst(ap(dip, 8080)).reply().frame())
	}
	return in, out
}

// mixedFlows adds UDP, IPv6 and all-ports flows to flows.
func mixedFlows() (in, out [][]byte) {
	in, out = flows(48)
	add := func(p pkt, dip netip.AddrPort) {
		in = append(in, p.frame())
		out = append(out, p.withDst(dip).reply().frame())
	}
	for i := 0; i < 4; i++ {
		port := uint16(20000 + i)
		add(udp(ap(client4, port), ap(vipA, 53)).to(macA), ap(dipA, 53))
		add(udp(ap(client4, port), ap(vipC, 6000+port)).to(macA), ap(dipA, 9000))
		add(tcp(ap(client6, port), ap(vip6, 443)).to(mac6), ap(dip6, 8443))
		add(udp(ap(client6, port), ap(vip6, 53)).to(mac6), ap(dip6, 53))
	}
	return in, out
}

// TestNoAllocs: both stages allocate nothing per batch, whatever path the
// packets take (state hit, new state, stateless, fragments, drops).
func TestNoAllocs(t *testing.T) {
	e := newEnv(t, testRules(), testLocals())
	in, out := mixedFlows()
	inB, outB := newBatch(t, vni, in), newBatch(t, vni, out)
	e.in.Process(inB.reset()) // enter the state (allocation-free too, but warm the view)
	e.ret.Process(outB.reset())
	require.EqualValues(t, len(in), e.tr.Stats().Inbound)
	require.EqualValues(t, len(out), e.tr.Stats().Return)

	odd := [][]byte{
		tcp(ap(dipA, 8080), ap(client4, 9)).frame(),                                                             // stateless
		tcp(ap(dipB, 7), ap(client4, 9)).frame(),                                                                // no state
		udp(ap(dip6, 53), ap(client6, 9)).withFrag(2).frame(),                                                   // fragment
		tcp(ap(dipA, 8080), ap(prober, 9)).frame(),                                                              // infra
		tcp(ap(client4, 1), ap(vipA, 81)).to(macA).frame(),                                                      // no rule (inbound)
		udp(ap(client4, 2), ap(vipA, 53)).to(macA).withFrag(2).frame(),                                          // fragment (inbound)
		icmpErr(netip.MustParseAddr("198.18.50.1"), vipA, macA, tcp(ap(vipA, 80), ap(client4, 3)), 0, false),    // ICMP error (inbound)
		icmpErr(netip.MustParseAddr("2001:db8:50::1"), vip6, mac6, udp(ap(vip6, 53), ap(client6, 3)), 0, false), // ICMPv6 error (inbound)
		icmpErr(dipA, client4, macGW, udp(ap(client4, 4), ap(dipA, 53)), 0, true),                               // ICMP error (return)
		icmpErrFrame(netip.MustParseAddr("2001:db8:50::1"), vip6, mac6, // ICMPv6 error quoting extension headers (inbound)
			frameExt6(tcp(ap(vip6, 443), ap(client6, 3)), gpkt.DestOpts6, gpkt.DestOpts6, firstFrag6), 0, false),
		icmpErrFrame(dip6, client6, macGW, frameExt6(udp(ap(client6, 4), ap(dip6, 53)), gpkt.DestOpts6, firstFrag6), 0, true), // and return
	}
	oddB := newBatch(t, vni, odd)

	for name, run := range map[string]func(){
		"inbound": func() { e.in.Process(inB.reset()) },
		"return":  func() { e.ret.Process(outB.reset()) },
		"odd/in":  func() { e.in.Process(oddB.reset()) },
		"odd/ret": func() { e.ret.Process(oddB.reset()) },
	} {
		require.Zero(t, testing.AllocsPerRun(50, run), name)
	}
	require.NotZero(t, e.tr.Stats().ICMPErrors, "the odd batch took the ICMP paths")
	require.NotZero(t, e.tr.Stats().Stateless)
	require.NotZero(t, e.tr.Stats().Fragments)
	// And a new connection per packet (a fresh table each round would
	// allocate outside the stage; expire the entries instead).
	require.Zero(t, testing.AllocsPerRun(20, func() {
		e.now += flow.Ticks(flow.DefaultTimeouts().Established) + 1
		e.in.Process(inB.reset())
	}), "new flows")
}

// TestConcurrentWorkers: inbound and return run on different goroutines
// for the same connections (as they do when RSS puts the two directions on
// different queues), while the rules are reloaded, locals replaced and the
// table aged. Every reply is translated back to its VIP, whether its state
// was there yet or not. Run with -race.
func TestConcurrentWorkers(t *testing.T) {
	// Web and DNS only: every reply's source is then the endpoint of
	// exactly one rule, so a reply that overtakes its state is translated
	// statelessly.
	rulesV := func() []flow.Rule { return testRules()[:2] }
	e := newEnv(t, rulesV(), testLocals(), func(c *nat.Config) { c.Clock = nil })
	in, out := flows(64)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan string, 16)
	worker := func(id int, stage engine.Stage, bt *batch, check bool) {
		defer wg.Done()
		frames := bt.frames
		bt.b.Worker = id
		for round := 0; round < 200; round++ {
			b := bt.reset()
			stage.Process(b)
			b.Compact()
			if b.Len() != len(frames) {
				errs <- "dropped: " + b.Dropped()[0].Reason.String()
				return
			}
			if !check {
				continue
			}
			for _, p := range b.Packets() {
				if p.Key.SrcAddr() != vipA || p.Key.SrcPort != 80 || p.OutPort != uplink {
					errs <- "bad reply " + p.Key.String()
					return
				}
			}
		}
	}
	wg.Add(4)
	go worker(0, e.in, newBatch(t, vni, in), false)
	go worker(1, e.in, newBatch(t, vni, in), false)
	go worker(2, e.ret, newBatch(t, vni, out), true)
	go worker(3, e.ret, newBatch(t, vni, out), true)
	var ctl sync.WaitGroup
	ctl.Add(1)
	go func() {
		defer ctl.Done()
		for v := uint64(2); ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			rules := rulesV()
			rules[0].Backends[0].Weight = uint32(v % 5) // a change that keeps IDs
			if _, err := e.rules.Update(v, rules); err != nil {
				errs <- err.Error()
				return
			}
			if v%3 == 0 {
				e.tr.SetDIPs(nat.MustDIPs(testLocals()...))
			} else {
				e.tr.Sync()
			}
			e.table.Age(e.table.Now(), 256)
		}
	}()
	wg.Wait()
	close(stop)
	ctl.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	s := e.tr.Stats()
	require.EqualValues(t, 2*200*64, s.Inbound)
	require.EqualValues(t, 2*200*64, s.Return+s.Stateless)
}

// TestInboundBatchState: Inbound records each packet of a full batch
// under its own return key (its two passes: every query prepared, then
// every connection recorded), in the batch's order: a flow's second packet
// in the same batch finds the entry its first made. Every reply then finds
// its state.
func TestInboundBatchState(t *testing.T) {
	e := newEnv(t, testRules(), testLocals())
	in, out := mixedFlows()
	in, out = in[:engine.MaxBatch-1], out[:engine.MaxBatch-1]
	in = append(in, in[0]) // the first flow again, last
	inB, outB := newBatch(t, vni, in), newBatch(t, vni, out)
	e.in.Process(inB.reset())
	require.Equal(t, engine.MaxBatch, inB.b.Len(), "no packet dropped")
	st := e.tr.Stats()
	require.EqualValues(t, engine.MaxBatch, st.Inbound)
	require.EqualValues(t, engine.MaxBatch-1, st.NewFlows, "one connection per flow")
	require.Zero(t, st.TableRefused)
	e.ret.Process(outB.reset())
	require.Equal(t, len(out), outB.b.Len(), "every reply translated")
	st = e.tr.Stats()
	require.EqualValues(t, len(out), st.Return, "every reply by its state")
	require.Zero(t, st.Stateless)
}
