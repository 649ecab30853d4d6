// Command bgpafterdrop drops every capability but a Mux's
// (node.MuxCaps), as a Mux does once its data path forwards, then starts
// a BGP speaker listening on port 179, as a Mux does when a later
// document is the first with a bgp section. It exits with status 1 when
// the speaker does not start. TestMuxCapsStartBGP runs it, as root, in a
// network namespace of its own.
//
//go:debug multipathtcp=0
package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"

	"github.com/xdplb/xdplb/bgp"
	"github.com/xdplb/xdplb/internal/node"
)

func main() {
	if err := node.DropCapabilities(node.MuxCaps...); err != nil {
		fmt.Println("drop capabilities:", err)
		os.Exit(2)
	}
	a, err := bgp.New(bgp.Config{ASN: 65010, RouterID: netip.MustParseAddr("198.18.0.11"), ListenPort: 179,
		Peers: []bgp.Peer{{Address: netip.MustParseAddr("198.18.0.1"), ASN: 65000}}})
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	if err := a.Start(context.Background()); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("bgp: started")
	_ = a.Shutdown(context.Background())
}
