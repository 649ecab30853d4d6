//go:build linux

package nexthop

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// TestLinkErrorNotCached: a link the kernel could not describe (here: not
// there yet) is asked about again on the next resolve, not remembered as
// "not Ethernet" until that link's next event — which a link that fails a
// query only transiently may never send, leaving every destination
// through it failed (ErrNotEthernet) across refreshes.
func TestLinkErrorNotCached(t *testing.T) {
	netlab.EnterNetns(t)
	h, err := netlink.NewHandle()
	require.NoError(t, err)
	t.Cleanup(h.Close)
	st := &runState{h: h, links: map[int]linkInfo{}}
	const idx = 4242
	_, ok := st.link(idx)
	require.False(t, ok, "no link %d yet", idx)

	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lnk0", Index: idx}, PeerName: "lnk1"}
	require.NoError(t, h.LinkAdd(v))
	li, ok := st.link(idx)
	require.True(t, ok, "the link, asked about again, is Ethernet")
	l, err := h.LinkByIndex(idx)
	require.NoError(t, err)
	require.Equal(t, [6]byte(l.Attrs().HardwareAddr), li.mac)
}
