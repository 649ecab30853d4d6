package afxdp_test

import (
	"context"
	"fmt"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
)

// A Config is a plain value: defaults are explicit and Validate says what
// is wrong before any socket exists.
func ExampleConfig() {
	cfg := afxdp.Config{Interface: "eth0", Queue: 1}.WithDefaults()
	fmt.Println(cfg.Name, cfg.NumFrames, cfg.FrameSize, cfg.Headroom, cfg.Mode, cfg.Ring)

	bad := afxdp.Config{Interface: "eth0", FrameSize: 3000}
	fmt.Println(bad.Validate())
	// Output:
	// afxdp:eth0:1 4096 2048 128 auto own
	// afxdp: invalid config: frame size 3000: must be 2048 or 4096
}

// Open one port per RX queue, hand each socket to the XDP program that
// steers frames to it (engine/steer, or any program with an XSKMAP), and
// run one worker per queue.
func ExampleOpenAll() {
	ports, err := afxdp.OpenAll(afxdp.Config{Interface: "eth0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	var workers []*engine.Worker
	for q, p := range ports {
		defer p.Close()
		// prog.RegisterSocket(p.Queue(), p.FD()) with the steering program.
		w, err := engine.NewWorker(engine.WorkerConfig{
			ID:     q,
			Ports:  []engine.Port{p},
			Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{})}},
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		workers = append(workers, w)
	}
	eng, err := engine.New(workers...)
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = eng.Run(context.Background())
}
