package rawip_test

import (
	"log"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/engine/rawip"
)

// The slow path of a node: one raw-IP port, the same index in every
// worker, named as the next-hop stage's SlowPort. A frame towards a
// destination the resolver has not resolved yet leaves through the kernel
// instead of being dropped. (Needs CAP_NET_RAW; not run as a test.)
func Example() {
	slow, err := rawip.Open("kernel")
	if err != nil {
		log.Fatal(err)
	}
	defer slow.Close()

	resolver, err := nexthop.NewResolver(nexthop.Config{})
	if err != nil {
		log.Fatal(err)
	}
	const uplinkIfindex = 2
	nh, err := nexthop.NewStage(nexthop.StageConfig{
		Mode:     nexthop.OuterDst,
		Ports:    map[int]uint16{uplinkIfindex: 0}, // port 0: the uplink's AF_XDP socket
		SlowPath: true,
		SlowPort: 1, // port 1: slow
	}, resolver)
	if err != nil {
		log.Fatal(err)
	}
	var uplink engine.Port // an *afxdp.Port in a real node
	_, err = engine.NewWorker(engine.WorkerConfig{
		Ports:  []engine.Port{uplink, slow},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{}, nh)}},
	})
	_ = err
	log.Printf("slow path: %+v", slow.Stats())
}
