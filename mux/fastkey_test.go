package mux

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/flow/flowtest"
)

// TestFastKey: the fast path's key tells apart two flow keys that differ
// in any field but the VNI — every byte of either address, either port,
// the protocol, the family — and keys that differ only in the VNI are
// one fastKey, so a packet whose key has a VNI is not eligible.
func TestFastKey(t *testing.T) {
	base := flow.Key{Src: [16]byte{198, 18, 0, 1}, Dst: [16]byte{198, 18, 100, 1}, SrcPort: 40000, DstPort: 80,
		Proto: flow.ProtoTCP, Family: flow.FamilyIPv4}
	var b fastKey
	b.set(&base)
	seen := map[fastKey]string{b: "base"}
	change := []struct {
		name string
		edit func(k *flow.Key)
	}{
		{"src port", func(k *flow.Key) { k.SrcPort++ }},
		{"src port's high byte", func(k *flow.Key) { k.SrcPort ^= 0x100 }},
		{"dst port", func(k *flow.Key) { k.DstPort++ }},
		{"dst port's high byte", func(k *flow.Key) { k.DstPort ^= 0x100 }},
		{"protocol", func(k *flow.Key) { k.Proto = flow.ProtoUDP }},
		{"family", func(k *flow.Key) { k.Family = flow.FamilyIPv6 }},
	}
	for i := range 16 {
		change = append(change,
			struct {
				name string
				edit func(k *flow.Key)
			}{"src byte " + string(rune('a'+i)), func(k *flow.Key) { k.Src[i] ^= 0x80 }},
			struct {
				name string
				edit func(k *flow.Key)
			}{"dst byte " + string(rune('a'+i)), func(k *flow.Key) { k.Dst[i] ^= 1 }})
	}
	for _, c := range change {
		k := base
		c.edit(&k)
		var f fastKey
		f.set(&k)
		require.False(t, sameKey(&b, &f), c.name)
		require.NotContains(t, seen, f, c.name)
		seen[f] = c.name
	}

	k := base
	k.VNI = 100
	var f fastKey
	f.set(&k)
	require.True(t, sameKey(&b, &f), "the VNI is no part of the fast path's key")
	p := engine.Packet{Flags: engine.FlagIPv4 | engine.FlagL4, L4Proto: flow.ProtoTCP, Key: base}
	require.True(t, eligible(&p))
	p.Key.VNI = 100
	require.False(t, eligible(&p), "a key with a VNI is not eligible: its fastKey would match the key without")
}

// TestFastPathTellsKeysApart: two flows whose keys differ only in bits
// that the VIP's address also has set — here two clients differing in
// their address's third byte, to a VIP whose third byte is 255, from the
// same port — are two flows to the fast path, also when they share an
// entry of its cache: the second flow's packet runs the full pipeline,
// and does not take the first flow's decision (its backend). sameKey
// once folded its words as a^b|c^d…, which Go evaluates left to right
// (| and ^ bind alike): ((a^b)|c)^d keeps of a^b only the bits c does
// not have, so such keys compared equal, and the second client's
// packets went to the first one's backend.
func TestFastPathTellsKeysApart(t *testing.T) {
	fr := newFastRig(t, nil, 1<<10)
	f := fr.f
	a := flowtest.Flow{Kind: flowtest.TCP4, Src: netip.MustParseAddr("198.18.7.9"), SrcPort: 40000}
	b := a
	b.Src = netip.MustParseAddr("198.18.200.9")
	require.Equal(t, byte(255), benchTargets.TCP4.Addr().As4()[2], "the VIP's third byte")
	frames := benchTargets.Frames([]flowtest.Flow{a, b})
	fa, fb := frames[:1], frames[1:]
	fr.send(fa, 1) // makes the worker's cache
	c := f.fast.caches.Get(0)
	require.NotNil(t, c)

	// A seed under which the two keys share their entry of way 0, the
	// one a's decision goes to in an empty cache.
	var keys [2]fastKey
	for i, fr := range frames {
		var p engine.Packet
		p.SetBuffer(nil, 0, append([]byte(nil), fr...), 0, len(fr), 0)
		require.Zero(t, engine.ParsePacket(&p, 0))
		require.True(t, eligible(&p))
		keys[i].set(&p.Key)
	}
	seed := uint64(1)
	for slotsOf(&keys[0], seed)&0xffff != slotsOf(&keys[1], seed)&0xffff {
		seed += 2
	}
	c.seed = seed

	fr.send(fa, 1)
	fr.now += int64(2 * time.Second) // past ProveAfter
	fr.send(fa, 1)                   // proven
	fr.send(fa, 1)                   // a's decision is kept
	h0, m0 := f.fast.Stats()
	fr.send(fa, 1)
	h1, m1 := f.fast.Stats()
	require.Equal(t, [2]uint64{h0 + 1, m0}, [2]uint64{h1, m1}, "a's packet is a hit")
	fr.send(fb, 1)
	h2, m2 := f.fast.Stats()
	require.Equal(t, [2]uint64{h1, m1 + 1}, [2]uint64{h2, m2}, "b's packet took a's decision")
}

// TestFastCacheEpochWraps: the epoch count wraps after 2^16 epochs, and
// there the cache is emptied, so that a decision kept 2^16 epochs ago
// does not match its epoch's number again — whether begin starts the
// epoch that wraps, or a worker waking from a nap does and the same
// batch's begin starts another (a new next-hop version): awake once
// left the wrap to begin, which then saw the epoch past 0 and emptied
// nothing.
func TestFastCacheEpochWraps(t *testing.T) {
	snap := &flow.Snapshot{}
	var k fastKey
	k.set(&flow.Key{Src: [16]byte{198, 18, 0, 1}, Dst: [16]byte{198, 19, 255, 1}, SrcPort: 40000, DstPort: 80,
		Proto: flow.ProtoTCP, Family: flow.FamilyIPv4})
	for _, tc := range []struct {
		name string
		wrap func(c *fastCache)
	}{
		{"begin", func(c *fastCache) { c.begin(snap, nil, 2, 0, 0) }},
		{"waking, then begin", func(c *fastCache) {
			c.sleep = 1
			require.False(t, c.awake())
			c.begin(snap, nil, 2, 0, 0)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &fastCache{seed: 1, epoch: 1}
			c.begin(snap, nil, 1, 0, 0)
			s := slotsOf(&k, c.seed)
			e, _ := c.entries(s)
			e.key, e.epoch = k, 1 // kept in epoch 1, 2^16 epochs before the wrap
			c.epoch = 0xffff
			tc.wrap(c)
			require.NotZero(t, c.epoch)
			require.Nil(t, c.find(s, &k), "a decision of 2^16 epochs ago matches after the wrap (epoch %d)", c.epoch)
		})
	}
}
