package nexthop

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Routes may use nexthop objects (`ip route add P nhid N`, as FRR installs
// them). With net.ipv4.nexthop_compat_mode=0 the kernel announces a
// change of nexthop N (RTM_NEWNEXTHOP) but no route notification for the
// routes using it, so the resolver, following route notifications only,
// kept the old gateway and its MAC until the next refresh.
func TestNexthopObjectChangeIsFollowed(t *testing.T) {
	l := newRouted(t)
	require.NoError(t, l.mux.SetSysctl("net.ipv4.nexthop_compat_mode", "0"))
	ip := func(args ...string) {
		t.Helper()
		out, err := l.mux.Command(context.Background(), "ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	fams := l.families()
	ip("nexthop", "add", "id", "10", "via", fams[0].gwA, "dev", "eth0")
	ip("nexthop", "add", "id", "11", "via", fams[1].gwA, "dev", "eth0")
	ip("route", "add", fams[0].remote, "nhid", "10")
	ip("-6", "route", "add", fams[1].remote, "nhid", "11")
	r := startResolver(t, l.mux, Config{RefreshInterval: time.Hour})
	for _, f := range fams {
		_, err := r.Resolve(testCtx(t), f.inRemote(1))
		require.NoError(t, err)
		waitHop(t, r, f.inRemote(1), f.hopA)
	}
	ip("nexthop", "replace", "id", "10", "via", fams[0].gwB, "dev", "eth1")
	ip("nexthop", "replace", "id", "11", "via", fams[1].gwB, "dev", "eth1")
	for _, f := range fams {
		waitHop(t, r, f.inRemote(1), f.hopB)
	}
}
