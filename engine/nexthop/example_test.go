package nexthop_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/xdplb/xdplb/engine/nexthop"
)

// A resolver for the node's own namespace, and the way a data-path stage
// uses it: one snapshot per batch, one Lookup per packet, a drop on a miss.
// It talks to the kernel (and needs CAP_NET_ADMIN for managed neighbours),
// so it is compiled but not run by go test; the tests in this package run
// the same calls inside network namespaces.
func Example() {
	r, err := nexthop.NewResolver(nexthop.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		if err := r.Run(ctx); err != nil {
			log.Print(err)
		}
	}()

	// Setup code may wait for a destination it is about to use.
	wait, cancelWait := context.WithTimeout(ctx, 5*time.Second)
	defer cancelWait()
	if hop, err := r.Resolve(wait, netip.MustParseAddr("198.18.0.2")); err == nil {
		fmt.Printf("via ifindex %d to %x\n", hop.IfIndex, hop.DstMAC)
	}

	// The data path never waits.
	batch := []netip.Addr{netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.7.9")}
	snap := r.Snapshot()
	for _, dst := range batch {
		hop, ok := snap.Lookup(dst)
		if !ok {
			continue // count a nexthop_unresolved drop; Run is resolving dst
		}
		_ = hop // write hop.SrcMAC and hop.DstMAC into the frame, send on hop.IfIndex
	}
}
