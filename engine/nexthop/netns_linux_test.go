package nexthop

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Config.NetNSPath empty means the namespace of the thread calling
// NewResolver. The netlink handle was made there, but Run subscribed to
// the kernel's notifications in the namespace of whatever thread ran it:
// a Resolver made inside a namespace (a thread switched into it, as
// netlab's Do does) asked that namespace's kernel to resolve neighbours
// but listened to another's, so it never saw the answers, nor any route
// or neighbour change.
func TestResolverFollowsCallersNamespace(t *testing.T) {
	l := newLAN(t)
	var r *Resolver
	require.NoError(t, l.mux.Do(func() (err error) {
		r, err = NewResolver(Config{})
		return err
	}))
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }() // on a thread in the test's namespace
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-runErr)
		assert.NoError(t, r.Close())
	})

	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	for _, s := range []string{"198.18.0.2", "2001:db8::2"} {
		dst := netip.MustParseAddr(s)
		hop, err := r.Resolve(rctx, dst)
		require.NoError(t, err, "%v: the neighbour's resolution was not seen", dst)
		assert.Equal(t, mac(l.peerLink.MAC), hop.DstMAC)
		assert.Equal(t, l.muxLink.Index, hop.IfIndex)
	}
}
