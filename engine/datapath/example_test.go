package datapath_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/datapath"
	"github.com/xdplb/xdplb/engine/steer"
)

// A spec is checked and numbered before anything is opened: here a node
// with an uplink and one VM port, and the slow path after them.
func ExampleSpec_Layout() {
	spec := datapath.Spec{
		Interfaces: []datapath.Interface{
			{Name: "eth0", Steer: steer.Config{VXLAN: []steer.VXLANRule{{Local: netip.MustParseAddr("198.18.0.1")}}}},
			{Name: "vm1", DropNoSocket: true},
		},
		SlowPath: true,
		Pipeline: func(datapath.Input) (*engine.Pipeline, error) { return engine.NewPipeline(engine.Parse{}), nil },
	}
	if err := spec.Validate(); err != nil {
		log.Fatal(err)
	}
	l := spec.Layout()
	vm, _ := l.Port("vm1")
	slow, _ := l.Slow()
	fmt.Println(l)
	fmt.Println("vm1:", vm, "slow path:", slow)

	spec.Interfaces[1].Name = "eth0"
	fmt.Println(spec.Validate())
	// Output:
	// 0:eth0 1:vm1 2:slow
	// vm1: 1 slow path: 2
	// datapath: invalid spec: interfaces[0] and [1] are both "eth0": an interface's queue takes one socket
}

// Open makes a spec live (Linux, root): a Mux-like node steering one VIP
// of eth0's traffic into its sockets, one worker per RX queue, each with
// its own pipeline, frames it cannot address going to the slow path.
func ExampleOpen() {
	spec := datapath.Spec{
		Interfaces: []datapath.Interface{{Name: "eth0", Steer: steer.Config{
			Dst: []steer.DstRule{{Addr: netip.MustParseAddr("198.18.100.1"), Proto: steer.ProtoTCP, Port: 80}}}}},
		SlowPath: true,
		Pipeline: func(in datapath.Input) (*engine.Pipeline, error) {
			// Stages that forward out of eth0 use port in.Interface;
			// unresolved next hops go to in.Layout.Slow().
			return engine.NewPipeline(engine.Parse{} /*, balance, encap, next hop */), nil
		},
	}
	dp, err := datapath.Open(spec, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer dp.Close() // after the engine has stopped
	if err := dp.Engine().Run(context.Background()); err != nil {
		log.Print(err)
	}
}
