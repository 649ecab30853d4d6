//go:build linux

package pktrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// Config is one harness invocation: every DUT at every point of
// Sizes x Flows x Loads, Trials times. Trials are interleaved: trial i of
// every DUT runs before trial i+1 of any, in an order rotated per trial,
// so slow drifts of a shared machine hit all modes alike and the ratios
// between them stay meaningful. The zero value of each field is its
// default.
type Config struct {
	// DUTs are the modes to compare (required), all on one Path
	// (ShapeOf). The first is the reference of the ratio column.
	DUTs []DUT
	// Sizes are frame sizes with FCS (default 64).
	Sizes []int
	// Flows are flow counts (default 1).
	Flows []int
	// Loads are offered loads (default max).
	Loads []Load
	// Warmup runs before each measurement window (default 500 ms);
	// Duration is the window (default 2 s); Drain is the wait after the
	// generator stops before the final count (default 200 ms).
	Warmup, Duration, Drain time.Duration
	// Trials per DUT and point (default 5); each figure is their median.
	Trials int
	// GenAffinity pins the generator's sending thread to these CPUs.
	GenAffinity []int
	// ProcessFIFO runs every thread of a DUT's processes (Instance.PIDs)
	// SCHED_FIFO at the priority of the DUT's ingress NAPI threads, once
	// the DUT is started: a process DUT then competes with the rest of a
	// busy machine as the kernel modes' NAPI threads do, instead of being
	// time-shared with it (a data-plane process has cores of its own in
	// production). Off by default.
	ProcessFIFO bool
	// Topology configures the namespaces and veths; its Path is the
	// DUTs'.
	Topology TopologyConfig
	// Progress, when set, is called after every trial.
	Progress func(p Point, trial int, s Sample)
	// AfterTrial, when set, is called after every trial, once the DUT has
	// stopped, with the topology (tests read the sink's captured frames
	// there); an error ends the Run.
	AfterTrial func(t *Topology, p Point, trial int) error
}

func (c Config) withDefaults() Config {
	if len(c.Sizes) == 0 {
		c.Sizes = []int{64}
	}
	if len(c.Flows) == 0 {
		c.Flows = []int{1}
	}
	if len(c.Loads) == 0 {
		c.Loads = []Load{Max}
	}
	if c.Warmup == 0 {
		c.Warmup = 500 * time.Millisecond
	}
	if c.Duration == 0 {
		c.Duration = 2 * time.Second
	}
	if c.Drain == 0 {
		c.Drain = 200 * time.Millisecond
	}
	if c.Trials == 0 {
		c.Trials = 5
	}
	return c
}

// Run builds the topology in lab, runs every trial and returns one Result
// per DUT and point, in the order of Config (sizes, then flows, then
// loads, then DUTs). lab is not closed: the caller closes it (the
// topology's namespaces, veths, XDP programs and DUT processes go with it)
// even when Run fails or ctx is cancelled.
func Run(ctx context.Context, lab *netlab.Lab, cfg Config) ([]Result, error) {
	cfg = cfg.withDefaults()
	if len(cfg.DUTs) == 0 {
		return nil, errors.New("pktrate: no DUT to measure")
	}
	path, _ := ShapeOf(cfg.DUTs[0])
	for _, d := range cfg.DUTs[1:] {
		if p, _ := ShapeOf(d); p != path {
			return nil, fmt.Errorf("pktrate: %s runs on the %v path and %s on the %v path: measure them in separate runs",
				cfg.DUTs[0].Name(), path, d.Name(), p)
		}
	}
	cfg.Topology.Path = path
	topo, err := NewTopology(lab, cfg.Topology)
	if err != nil {
		return nil, err
	}
	defer topo.Close()

	var results []Result
	for _, size := range cfg.Sizes {
		for _, flows := range cfg.Flows {
			rs, err := runFrames(ctx, topo, cfg, size, flows)
			results = append(results, rs...)
			if err != nil {
				return results, err
			}
		}
	}
	return results, nil
}

// runFrames measures every load and DUT with one generator (one set of
// prebuilt frames).
func runFrames(ctx context.Context, topo *Topology, cfg Config, size, flows int) ([]Result, error) {
	var gen *Generator
	err := topo.Gen.Do(func() error {
		var err error
		gen, err = OpenGenerator(GenConfig{
			Ifindex: topo.GenLink.Index, Spec: topo.Spec(size, flows), Affinity: cfg.GenAffinity,
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	defer gen.Close()

	var results []Result
	for _, load := range cfg.Loads {
		rs := make([]Result, len(cfg.DUTs))
		for i, d := range cfg.DUTs {
			rs[i].Point = Point{DUT: d.Name(), Size: size, Flows: flows, Load: load}
		}
		for trial := 0; trial < cfg.Trials; trial++ {
			for j := range cfg.DUTs {
				i := (trial + j) % len(cfg.DUTs)
				s, err := runTrial(ctx, topo, gen, cfg, cfg.DUTs[i], load)
				if err != nil {
					return append(results, summarized(rs)...), fmt.Errorf("pktrate: %s, %d-byte frames, %d flows, load %v, trial %d: %w",
						rs[i].DUT, size, flows, load, trial+1, err)
				}
				rs[i].Samples = append(rs[i].Samples, s)
				if cfg.Progress != nil {
					cfg.Progress(rs[i].Point, trial, s)
				}
				if cfg.AfterTrial != nil {
					if err := cfg.AfterTrial(topo, rs[i].Point, trial); err != nil {
						return append(results, summarized(rs)...), err
					}
				}
			}
		}
		results = append(results, summarized(rs)...)
	}
	return results, nil
}

// summarized fills in the summaries and leaves out results without a
// sample (a run cut short).
func summarized(rs []Result) []Result {
	var out []Result
	for _, r := range rs {
		if len(r.Samples) > 0 {
			r.Summary = Summarize(r.Samples)
			out = append(out, r)
		}
	}
	return out
}

// snapshot is the state of every counter at one moment.
type snapshot struct {
	at      time.Time
	sent    uint64
	sink    SinkCounts
	dutCPU  time.Duration
	genCPU  time.Duration
	sinkCPU time.Duration
	busy    uint64
	drops   Drops
	// fastPath is the DUT's fast-path counters (FastPathReader), read
	// at the window's start and end only.
	fastPath *FastPathCounts
}

// runTrial starts the DUT, sends for Warmup+Duration at load, and measures.
func runTrial(ctx context.Context, topo *Topology, gen *Generator, cfg Config, dut DUT, load Load) (s Sample, err error) {
	inst, err := dut.Start(ctx, topo)
	if err != nil {
		return s, err
	}
	defer func() {
		if serr := inst.Stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	if cfg.ProcessFIFO {
		for _, pid := range inst.PIDs() {
			if err := processFIFO(pid, dutPriority); err != nil {
				return s, fmt.Errorf("pktrate: %s: %w", dut.Name(), err)
			}
		}
	}
	dutThreads, err := topo.DUTNAPIThreads()
	if err != nil {
		return s, err
	}
	sinkThreads, err := topo.SinkNAPIThreads()
	if err != nil {
		return s, err
	}
	fpr, _ := inst.(FastPathReader)
	// take reads every counter; window is true at the measurement
	// window's start and end, where it also reads the DUT's fast-path
	// counters if it has any (a scrape the trial's other moments need
	// not pay for).
	take := func(window bool) (snapshot, error) {
		sn := snapshot{at: time.Now(), sent: gen.Sent(), genCPU: gen.CPU(), sinkCPU: threadsCPU(sinkThreads), busy: gen.KickErrors()}
		var err error
		if window && fpr != nil {
			fp, err := fpr.FastPath()
			if err != nil {
				return sn, fmt.Errorf("pktrate: %s: %w", dut.Name(), err)
			}
			sn.fastPath = &fp
		}
		if sn.drops, err = topo.drops(); err != nil {
			return sn, err
		}
		if sn.sink, err = topo.Sink.Counts(); err != nil {
			return sn, err
		}
		if topo.Threaded() {
			sn.dutCPU = threadsCPU(dutThreads)
		} else if sn.dutCPU, err = softirqTime(); err != nil {
			return sn, err
		}
		for _, pid := range inst.PIDs() {
			d, err := procCPU(pid)
			if err != nil {
				return sn, fmt.Errorf("pktrate: %s: CPU time of pid %d: %w", dut.Name(), pid, err)
			}
			sn.dutCPU += d
		}
		return sn, nil
	}

	_, output := ShapeOf(dut)
	start, err := take(false)
	if err != nil {
		return s, err
	}
	if err := gen.Start(load); err != nil {
		return s, err
	}
	stopped := false
	defer func() {
		if !stopped {
			gen.Stop()
		}
	}()
	if err := sleep(ctx, cfg.Warmup); err != nil {
		return s, err
	}
	w0, err := take(true)
	if err != nil {
		return s, err
	}
	if err := sleep(ctx, cfg.Duration); err != nil {
		return s, err
	}
	w1, err := take(true)
	if err != nil {
		return s, err
	}
	stopped = true
	if err := gen.Stop(); err != nil {
		return s, err
	}
	if err := sleep(ctx, cfg.Drain); err != nil {
		return s, err
	}
	end, err := take(false)
	if err != nil {
		return s, err
	}
	var fastPath *FastPathCounts
	if w0.fastPath != nil && w1.fastPath != nil {
		d := w1.fastPath.sub(*w0.fastPath)
		fastPath = &d
	}
	delivered := func(sn snapshot) uint64 { d, _ := sn.sink.Delivered(output); return d }
	otherKind := func(sn snapshot) uint64 { _, o := sn.sink.Delivered(output); return o }
	return Sample{
		Window:            w1.at.Sub(w0.at),
		WindowSent:        w1.sent - w0.sent,
		WindowReceived:    delivered(w1) - delivered(w0),
		WindowEgressDrops: w1.drops.DUTOutTX - w0.drops.DUTOutTX,
		Sent:              end.sent - start.sent,
		Received:          delivered(end) - delivered(start),
		WrongMAC:          end.sink.WrongMAC - start.sink.WrongMAC,
		WrongKind:         otherKind(end) - otherKind(start),
		DUTCPU:            w1.dutCPU - w0.dutCPU,
		GenCPU:            w1.genCPU - w0.genCPU,
		SinkCPU:           w1.sinkCPU - w0.sinkCPU,
		Busy:              end.busy - start.busy,
		Drops: Drops{
			GenTX:    end.drops.GenTX - start.drops.GenTX,
			DUTInRX:  end.drops.DUTInRX - start.drops.DUTInRX,
			DUTOutTX: end.drops.DUTOutTX - start.drops.DUTOutTX,
			SinkRX:   end.drops.SinkRX - start.drops.SinkRX,
		},
		FastPath: fastPath,
	}, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
