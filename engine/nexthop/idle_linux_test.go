package nexthop

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/header"
)

// frameTo returns an untagged Ethernet frame holding an IPv4 header to dst,
// as the Encap stage hands it to a Stage in OuterDst mode.
func frameTo(dst netip.Addr) []byte {
	f := make([]byte, header.EthernetSize+header.IPv4MinSize)
	binary.BigEndian.PutUint16(f[12:], header.EtherTypeIPv4)
	ip := f[header.EthernetSize:]
	ip[0] = 0x45
	d := dst.As4()
	copy(ip[16:], d[:])
	return f
}

// A destination a Stage keeps sending to is in use, however few batches
// carry it: the Stage answers from its per-worker cache without calling
// Lookup for up to hopCacheRefresh batches, so the resolver's idle sweep
// must not take that silence for idleness. It did: at a few batches per
// IdleTimeout the sweep evicted the destination, which bumped the version,
// and the next packet missed and was dropped as nexthop_unresolved.
func TestIdleSweepSparesDestinationsInStageCache(t *testing.T) {
	for _, mode := range modes() {
		t.Run(mode.name, func(t *testing.T) {
			l := newLAN(t)
			cfg := mode.cfg
			cfg.IdleTimeout, cfg.RetryInterval = 200*time.Millisecond, 10*time.Millisecond
			r := startResolver(t, l.mux, cfg)
			dst := netip.MustParseAddr("198.18.0.2")
			want, err := r.Resolve(testCtx(t), dst)
			require.NoError(t, err)
			s, err := NewStage(StageConfig{Mode: OuterDst, Ports: map[int]uint16{l.muxLink.Index: 0}}, r)
			require.NoError(t, err)

			frame := frameTo(dst)
			buf := make([]byte, 256)
			var b engine.Batch
			var p engine.Packet
			start := r.Version()
			deadline := time.Now().Add(20 * time.Second) // a hang guard only
			// Send a packet every few milliseconds, far fewer batches
			// than hopCacheRefresh, across several idle sweeps.
			for batches := 0; r.Version() < start+4 && time.Now().Before(deadline); batches++ {
				copy(buf, frame)
				p.SetBuffer(nil, 0, buf, 0, len(frame), 0)
				var ps Pass
				s.Begin(&b, &ps)
				reason := ps.Packet(&p)
				require.Zero(t, reason, "batch %d: a destination in use was dropped (%v); stats %+v", batches, reason, r.Stats())
				require.Equal(t, header.MAC(want.DstMAC), header.Ethernet(p.Data()).Dst())
				time.Sleep(2 * time.Millisecond)
			}
			require.GreaterOrEqual(t, r.Version(), start+4, "the resolver published too few snapshots to have swept")
			require.Zero(t, r.Stats().Evictions)
		})
	}
}
