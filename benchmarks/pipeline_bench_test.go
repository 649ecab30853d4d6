package benchmarks

import (
	"fmt"
	"testing"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// pipelineBackends is the pool size of each VIP in the pipeline benchmark.
const pipelineBackends = 100

// pipelineSeed is the hash seed of our balancer (any fixed value).
const pipelineSeed = 0x786470_6c62

// rig is a worker polling one MemPort that replays frames endlessly
// through a pipeline and transmits what survives back on the same port.
type rig struct {
	w    *engine.Worker
	port *engine.MemPort
}

func newRig(frames [][]byte, stages ...engine.Stage) (*rig, error) {
	mp, err := engine.NewMemPort(engine.MemPortConfig{Name: "uplink"})
	if err != nil {
		return nil, err
	}
	mp.Replay(frames)
	w, err := engine.NewWorker(engine.WorkerConfig{
		Ports:  []engine.Port{mp},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(stages...)}},
	})
	if err != nil {
		return nil, err
	}
	return &rig{w: w, port: mp}, nil
}

// run polls until at least pkts packets were received and returns how many
// were (a batch at a time, so up to MaxBatch-1 more).
func (r *rig) run(pkts int) int {
	n := 0
	for n < pkts {
		n += r.w.Poll()
	}
	return n
}

// stats returns the worker's counters.
func (r *rig) stats() engine.Stats {
	var s engine.Stats
	r.w.Counters().Snapshot(&s)
	return s
}

// pipeVariant is one way of doing the Mux's parse and balance job.
type pipeVariant struct {
	name  string
	group string // comparison group; "" for none
	ours  bool
	// stages builds the pipeline for n flows.
	stages func(n int, pools []pool) ([]engine.Stage, error)
}

// ourBalance returns our parse and balance stages over pools' rules, with
// the connection table ct (nil: stateless) and the table clock (nil: the
// table's), and the rules.
func ourBalance(pools []pool, ct *flow.ConnTable, clock func() flow.Tick) ([]engine.Stage, *flow.Rules, error) {
	rules, err := ourRules(pools)
	if err != nil {
		return nil, nil, err
	}
	st, err := balance.New(balance.Config{Rules: rules, Conns: ct, Hasher: flow.NewHasher(pipelineSeed), Clock: clock,
		// Every flow is new at once: the per-VIP share of new flows (a
		// flood defence) would keep most out of the table.
		VIPShare: 1})
	if err != nil {
		return nil, nil, err
	}
	return []engine.Stage{engine.Parse{}, st}, rules, nil
}

// pipeConnTable returns a ConnTable for n flows with a quarter of headroom.
func pipeConnTable(n int) (*flow.ConnTable, error) {
	return flow.NewConnTable(flow.ConnTableConfig{Capacity: n + n/4})
}

var pipeVariants = []pipeVariant{
	{name: "impl=harness", stages: func(int, []pool) ([]engine.Stage, error) { return nil, nil }},
	{name: "impl=xdplb/stages=parse", ours: true, stages: func(int, []pool) ([]engine.Stage, error) {
		return []engine.Stage{engine.Parse{}}, nil
	}},
	{name: "impl=xdplb/stages=parse+maglev", group: "stateless", ours: true,
		stages: func(n int, p []pool) ([]engine.Stage, error) {
			st, _, err := ourBalance(p, nil, nil)
			return st, err
		}},
	{name: "impl=peer/stages=parse+maglev", group: "stateless",
		stages: func(n int, p []pool) ([]engine.Stage, error) {
			pb, err := newPeerBalancer(p, false, n)
			return []engine.Stage{pb}, err
		}},
	{name: "impl=xdplb/stages=parse+conntrack+maglev", group: "conntrack", ours: true,
		stages: func(n int, p []pool) ([]engine.Stage, error) {
			ct, err := pipeConnTable(n)
			if err != nil {
				return nil, err
			}
			st, _, err := ourBalance(p, ct, nil)
			return st, err
		}},
	{name: "impl=peer/stages=parse+conntrack+maglev", group: "conntrack",
		stages: func(n int, p []pool) ([]engine.Stage, error) {
			pb, err := newPeerBalancer(p, true, n)
			return []engine.Stage{pb}, err
		}},
}

// BenchmarkPipeline runs the Mux's front half (parse, then balance: rule by
// VIP, connection table, Maglev for new flows) on one worker: Worker.Poll
// over a MemPort replaying one frame per flow in a loop, each frame copied
// into a port buffer as a NIC would write it, and transmitted back. One op
// is one packet. Before timing, every flow is seen twice, so the timed part
// is the steady state of established flows (every connection-table lookup
// hits). Run it with -cpu 1.
//
// Variants: impl=harness is the worker and port alone (no stage): the
// floor under every other line. stages=parse adds our parser; parse+maglev
// balances statelessly (hash and Maglev for every packet);
// parse+conntrack+maglev is the Mux's configuration. impl=peer does the
// same jobs with gopacket, Go maps and kkdai/maglev (peerBalancer) inside
// the same harness.
func BenchmarkPipeline(b *testing.B) {
	pools := pipelinePools(pipelineBackends)
	for _, sz := range connSizes {
		for _, v := range pipeVariants {
			var r *rig
			group := fmt.Sprintf("pipe/%s/%s", sz.name, v.group)
			b.Run(fmt.Sprintf("flows=%s/%s", sz.name, v.name), func(b *testing.B) {
				if r == nil {
					ts := traffic(sz.flows, pipelineMix, 3)
					stages, err := v.stages(sz.flows, pools)
					if err != nil {
						b.Fatal(err)
					}
					if r, err = newRig(ts.frames, stages...); err != nil {
						b.Fatal(err)
					}
					r.run(2 * sz.flows) // every flow seen twice: established
				}
				b.ReportAllocs()
				b.ResetTimer()
				n := r.run(b.N)
				b.StopTimer()
				if s := r.stats(); s.Dropped() != 0 {
					b.Fatalf("drops: %v", s.DropsByName())
				}
				ns := nsPer(b, n)
				// Poll takes whole batches, so n can exceed b.N by up to
				// MaxBatch-1: ns/op is set to the exact time per packet.
				b.ReportMetric(ns, "ns/op")
				b.ReportMetric(ns, "ns/pkt")
				b.ReportMetric(1e3/ns, "Mpps")
				switch {
				case v.group == "":
				case v.ours:
					recordOurs(group, ns)
				default:
					reportPeer(b, group, ns)
				}
			})
			r = nil
		}
	}
}
