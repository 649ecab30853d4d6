package nexthop

import (
	"math"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
)

// A neighbour request that fails for a reason of its own says nothing
// about the kernel's support for managed entries. The resolver took any
// refusal of a managed request for missing support and used NTF_USE for
// good: after one request for a neighbour on a link deleted meanwhile
// (which Run makes when the kernel's deletion of the neighbour reaches it
// before that of the link), the neighbours of every other link stopped
// being managed, i.e. kept verified by the kernel.
func TestManagedSurvivesFailedRequest(t *testing.T) {
	if !managedSupported(kernelRelease()) {
		t.Skipf("kernel %s has no managed neighbour entries", kernelRelease())
	}
	l := newLAN(t)
	st := &runState{r: testResolver(t, Config{}), h: l.mux.Netlink(), managed: true,
		neigh: make(map[neighKey]neighInfo), ours: make(map[neighKey]struct{})}
	st.r.cfg = st.r.cfg.withDefaults()

	for _, tc := range []struct {
		name string
		nk   neighKey
	}{
		{"no such link", neighKey{math.MaxInt32, netip.MustParseAddr("198.18.0.99").As16()}},
		{"no such link v6", neighKey{math.MaxInt32, netip.MustParseAddr("2001:db8::99").As16()}},
	} {
		st.ask(tc.nk)
		assert.True(t, st.managed, "%s: managed entries given up", tc.name)
		assert.NotContains(t, st.ours, tc.nk, tc.name)
	}

	// A neighbour on a live link is still made managed.
	for _, dst := range []netip.Addr{netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("2001:db8::2")} {
		nk := neighKey{int32(l.muxLink.Index), dst.As16()}
		st.ask(nk)
		assert.Contains(t, st.ours, nk)
		n, ok := neighbor(t, l.mux, dst)
		require.True(t, ok, dst)
		assert.NotZero(t, n.FlagsExt&netlink.NTF_EXT_MANAGED, "%v not managed: %+v", dst, n)
	}
}
