package benchmarks

import (
	"testing"

	"github.com/kkdai/maglev"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/flow/flowtest"
)

// TestPeersAgree checks that every benchmark compares like with like: the
// peers are given the same inputs as ours and compute the same results
// where the two should agree.
func TestPeersAgree(t *testing.T) {
	t.Run("parse", func(t *testing.T) {
		// Both parsers find, in every frame of both benchmark traffic
		// sets, the 5-tuple the frame was built from.
		g := newGopacketParser()
		for _, ts := range []*trafficSet{traffic(parseFrames, parseMix, 1), traffic(1024, pipelineMix, 3)} {
			var kinds [flowtest.NumKinds]int
			for i, fr := range ts.frames {
				want := targets.Key(ts.flows[i])
				kinds[ts.flows[i].Kind]++
				var p engine.Packet
				p.SetBuffer(nil, 0, fr, 0, len(fr), 0)
				require.Zero(t, engine.ParsePacket(&p, 0), "frame %d (%v)", i, ts.flows[i].Kind)
				require.Equal(t, want, p.Key, "ours, frame %d", i)
				var k flow.Key
				require.True(t, g.parse(fr, 0, &k), "gopacket, frame %d", i)
				require.Equal(t, want, k, "gopacket, frame %d", i)
				var v flow.Key
				require.True(t, viewsParse(fr, 0, &v), "views, frame %d", i)
				require.Equal(t, want, v, "views, frame %d", i)
			}
			for k, n := range kinds {
				assert.NotZero(t, n, "no %v frame in the set", flowtest.Kind(k))
			}
		}
	})

	t.Run("maglev", func(t *testing.T) {
		// Different algorithms pick different backends; both must give
		// every flow one of the backends, the same one every time, and
		// spread flows evenly (Maglev's promise).
		flows := genFlows(20000, flowtest.Mix{flowtest.TCP4: 100}, 2)
		h := flow.NewHasher(0x5eed)
		for _, n := range []int{10, 100} {
			names := backendNames(n)
			ours, err := flow.NewMaglev(ourMaglevInput(names), flow.MaglevDefaultSize)
			require.NoError(t, err)
			peer, err := maglev.NewMaglev(names, flow.MaglevDefaultSize)
			require.NoError(t, err)
			index := map[string]int{}
			for i, name := range names {
				index[name] = i
			}
			oursCount, peerCount := make([]int, n), make([]int, n)
			var buf [40]byte
			for _, f := range flows {
				k := targets.Key(f)
				a := ours.Lookup(h.Hash(&k, flow.Tuple5))
				require.Equal(t, a, ours.Lookup(h.Hash(&k, flow.Tuple5)))
				require.True(t, a >= 0 && a < n)
				oursCount[a]++
				name, err := peer.Get(peerKey(&k, &buf))
				require.NoError(t, err)
				again, _ := peer.Get(peerKey(&k, &buf))
				require.Equal(t, name, again)
				i, ok := index[name]
				require.True(t, ok, "peer returned unknown backend %q", name)
				peerCount[i]++
			}
			mean := len(flows) / n
			for i := range n {
				assert.InDelta(t, mean, oursCount[i], float64(mean)/2, "ours, backend %d of %d", i, n)
				assert.InDelta(t, mean, peerCount[i], float64(mean)/2, "peer, backend %d of %d", i, n)
			}
		}
	})

	t.Run("conntable", func(t *testing.T) {
		// The same fill and the same op stream leave every implementation
		// holding the same flow → backend mapping.
		set, err := newConnSet(1 << 12)
		require.NoError(t, err)
		keys := set.keys
		tables := make([]connTable, len(connImpls))
		for i, impl := range connImpls {
			tables[i], _ = set.table(i)
			s := newConnStream(0, 1, len(keys))
			for range 100000 {
				require.False(t, s.step(tables[i], keys), "%s: a lookup of a present flow missed", impl.name)
			}
		}
		for i, impl := range connImpls {
			require.Equal(t, len(keys), tables[i].len(), impl.name)
		}
		for j := range keys {
			want, ok := tables[0].lookup(&keys[j], 0)
			require.True(t, ok)
			for i, impl := range connImpls[1:] {
				got, ok := tables[i+1].lookup(&keys[j], 0)
				require.True(t, ok, "%s: key %d", impl.name, j)
				require.Equal(t, want, got, "%s: key %d", impl.name, j)
			}
		}
	})

	t.Run("pipeline", func(t *testing.T) {
		// Run through the benchmark's harness, ours and the peer forward
		// every packet, keep every flow on one backend, and end with the
		// same flows in their connection tables.
		const flows = 1024
		ts := traffic(flows, pipelineMix, 3)
		pools := pipelinePools(pipelineBackends)

		record := func(m map[flow.Key]int32, changed *int) engine.Stage {
			return engine.StageFunc(func(b *engine.Batch) {
				for _, p := range b.Packets() {
					if be, ok := m[p.Key]; ok && be != p.Backend {
						*changed++
					}
					m[p.Key] = p.Backend
				}
			})
		}

		ct, err := pipeConnTable(flows)
		require.NoError(t, err)
		ourStages, rules, err := ourBalance(pools, ct, func() flow.Tick { return 1 }) // one instant: see the class check below
		require.NoError(t, err)
		peer, err := newPeerBalancer(pools, true, flows)
		require.NoError(t, err)

		oursSeen, peerSeen := map[flow.Key]int32{}, map[flow.Key]int32{}
		var oursChanged, peerChanged int
		oursRig, err := newRig(ts.frames, append(ourStages, record(oursSeen, &oursChanged))...)
		require.NoError(t, err)
		peerRig, err := newRig(ts.frames, peer, record(peerSeen, &peerChanged))
		require.NoError(t, err)
		const pkts = 3 * flows
		require.Equal(t, pkts, oursRig.run(pkts))
		require.Equal(t, pkts, peerRig.run(pkts))

		for _, r := range []*rig{oursRig, peerRig} {
			s := r.stats()
			require.Zero(t, s.Dropped(), "drops: %v", s.DropsByName())
			require.Equal(t, uint64(pkts), s.TX)
		}
		require.Zero(t, oursChanged, "ours moved a flow to another backend")
		require.Zero(t, peerChanged, "the peer moved a flow to another backend")
		require.Len(t, oursSeen, flows)
		require.Len(t, peerSeen, flows)
		for _, f := range ts.flows {
			k := targets.Key(f)
			be, ok := oursSeen[k]
			require.True(t, ok, "ours never balanced %v", k)
			require.True(t, be >= 0 && be < pipelineBackends)
			be, ok = peerSeen[k]
			require.True(t, ok, "the peer never balanced %v", k)
			require.True(t, be >= 0 && be < pipelineBackends)
		}

		// Both connection tables hold exactly the flows, and ours maps
		// each to the backend it was sent to.
		require.Len(t, peer.conns, flows)
		snap := rules.Load()
		n := 0
		ct.Range(func(k flow.Key, id uint32, class flow.StateClass, _ flow.Tick) bool {
			n++
			_, inPeer := peer.conns[k]
			assert.True(t, inPeer, "ours holds %v, the peer does not", k)
			r, idx, ok := snap.Backend(id)
			if assert.True(t, ok, "unknown backend ID %d", id) {
				assert.Equal(t, oursSeen[k], int32(idx), "backend of %v", k)
				assert.Equal(t, k.DstPort, r.VIP.Port)
			}
			// Every packet of a flow came at the same tick, never
			// ProveAfter after its entry: not proven (flow.ConnTable.Next).
			assert.Equal(t, flow.ClassUntrusted, class, "class of %v", k)
			return true
		})
		require.Equal(t, flows, n)
	})
}
