package mux

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// fusedPair is the Mux's stages over benchDocument twice, each with its
// own Controller and connection table and one shared clock: run as the
// separate stages of a pipeline (muxStages.stages), and fused (the
// stage the Mux runs). Both see the same frames in the same batches, so
// everything they do must be equal.
type fusedPair struct {
	sep, fus   *muxRig
	sepMS      muxStages
	fusMS      muxStages
	ctl1, ctl2 *Controller
	ct1, ct2   *flow.ConnTable
	f          *fused
	now        int64 // nanoseconds: every clock of both
}

func newFusedPair(tb testing.TB) *fusedPair {
	return newFusedPairWith(tb, muxStagesOpts{partial: true}, 1<<12)
}

// newFusedPairWith is newFusedPair with the options o, whose clock it
// sets, and connection tables for flows flows. The two tables share one
// placement key (flow.ConnTableConfig.Seed), so that they store, evict
// and refuse alike however full they get: with a random key each, a
// long FuzzFused run filled them until one evicted a flow the other
// kept, a difference of the tables and not of the pipelines.
func newFusedPairWith(tb testing.TB, o muxStagesOpts, flows int) *fusedPair {
	doc := benchDocument(tb)
	fp := &fusedPair{now: int64(time.Hour)}
	o.clock = func() int64 { return fp.now }
	seed := rand.Uint64() | 1 // each run its own, both tables the same
	tb.Logf("the connection tables' seed: %#x", seed)
	fp.ct1, fp.ct2 = muxConnTableSeeded(tb, flows, false, seed), muxConnTableSeeded(tb, flows, false, seed)
	fp.sepMS, fp.ctl1 = newTestMuxStages(tb, doc, fp.ct1, o)
	fp.fusMS, fp.ctl2 = newTestMuxStages(tb, doc, fp.ct2, o)
	f, err := newFused(fp.fusMS)
	require.NoError(tb, err)
	fp.sep = newMuxRigSnapshot(tb, true, fp.ctl1.Snapshot, fp.sepMS.stages()...)
	fp.fus = newMuxRigSnapshot(tb, true, fp.ctl2.Snapshot, f)
	fp.f = f
	return fp
}

// batch sends frames (at most engine.MaxBatch: one batch) through both
// and requires the same transmitted frames, byte for byte and in order,
// and the same worker counters (RX, TX, batches, drops by reason).
func (fp *fusedPair) batch(t testing.TB, frames ...[]byte) {
	t.Helper()
	require.LessOrEqual(t, len(frames), engine.MaxBatch)
	var out [2][][]byte
	var st [2]engine.Stats
	for i, r := range []*muxRig{fp.sep, fp.fus} {
		r.port.Inject(frames...)
		for r.port.Stats().Queued > 0 {
			r.w.Poll()
		}
		out[i], st[i] = r.port.Transmitted(), r.stats()
	}
	require.Equal(t, len(out[0]), len(out[1]), "frames transmitted: stages %d, fused %d", len(out[0]), len(out[1]))
	for i := range out[0] {
		if !bytes.Equal(out[0][i], out[1][i]) {
			t.Fatalf("frame %d of %d: the stages and the fused stage differ\nstages %x\n fused %x", i, len(out[0]), out[0][i], out[1][i])
		}
	}
	require.Equal(t, st[0].DropsByName(), st[1].DropsByName(), "drops by reason: stages, fused")
	require.Equal(t, st[0], st[1], "worker counters: stages, fused")
}

// counters requires the stages' own counters to be equal: the balance
// stage's (connection table, by VIP), the accounts, the partial checksums
// completed, encap's ICMP errors.
func (fp *fusedPair) counters(t testing.TB) {
	t.Helper()
	a, b := &fp.sepMS, &fp.fusMS
	require.Equal(t, a.bal.Stats(), b.bal.Stats(), "balance stats")
	require.Equal(t, a.bal.VIPStats(), b.bal.VIPStats(), "balance stats by VIP")
	require.Equal(t, balance.SumAccounts(a.acct), balance.SumAccounts(b.acct), "accounts")
	require.Equal(t, a.partial.Completed(), b.partial.Completed(), "partial checksums completed")
	require.Equal(t, a.enc.Stats(), b.enc.Stats(), "encap stats")
	require.Equal(t, fp.ct1.Len(), fp.ct2.Len(), "connection-table entries")
}

// TestFusedAgrees runs the same batches through the Mux's separate stages
// and through the fused stage and requires every output byte, drop reason
// and counter to be equal: batches of TCP and UDP flows only (the fused
// path: new flows, then established ones, VLAN tags and TOS, a quarter
// with partial checksums, time moving on so flows are promoted), every FuzzMuxPipeline seed alone, twice,
// twice in one batch (spoofed sources, malformed frames, expired TTLs,
// frames too big for the tunnel, no rule, replies to outbound connections,
// ICMP: the separate stages' path), a reload that removes backends and
// drains a VIP, and the seeds shuffled among flows in full batches: those
// without ICMP (the fused path, with drops at every step), then all.
func TestFusedAgrees(t *testing.T) {
	fp := newFusedPair(t)
	frames := benchTargets.Frames(benchFlows(1000, muxAgreeMix, 5, true))
	for i := 0; i < len(frames); i += 4 {
		frames[i] = gpkt.MakePartial(t, frames[i]) // as a sender on this machine leaves it
	}
	flows := func() {
		for i := 0; i < len(frames); i += engine.MaxBatch {
			fp.batch(t, frames[i:min(i+engine.MaxBatch, len(frames))]...)
		}
	}
	for range 3 {
		flows()
		fp.now += int64(2 * time.Second) // past ProveAfter: the next packets promote
	}
	fp.counters(t)
	require.NotZero(t, fp.fusMS.partial.Completed(), "no partial checksum completed")
	require.NotZero(t, fp.f.fast.stats().images, "no packet encapsulated from a tunnel image")

	// A reload: web4 loses a third of its backends (their flows are
	// placed again), dns4's are all drained (its new flows: no_backend).
	doc := benchDocument(t)
	doc.VIPs = slices.Clone(doc.VIPs)
	doc.VIPs[0].Backends = slices.Clone(doc.VIPs[0].Backends[benchBackends/3:])
	doc.VIPs[1].Backends = slices.Clone(doc.VIPs[1].Backends)
	for i := range doc.VIPs[1].Backends {
		doc.VIPs[1].Backends[i].Weight = 0
	}
	require.NoError(t, fp.ctl1.Apply(doc))
	require.NoError(t, fp.ctl2.Apply(doc))
	frames = append(frames, benchTargets.Frames(benchFlows(500, muxAgreeMix, 6, true))...) // and new flows
	flows()
	fp.now += int64(time.Second)
	flows()
	fp.counters(t)
	require.NotZero(t, fp.fus.stats().Drops[engine.DropNoBackend], "no flow of the drained VIP dropped")

	var seeds [][]byte
	for _, s := range muxFuzzSeeds(t) {
		if len(s.frame) > muxFuzzMaxFrame {
			continue
		}
		seeds = append(seeds, s.frame)
		fp.batch(t, s.frame)
		fp.batch(t, s.frame, s.frame)
		fp.now += int64(time.Millisecond)
	}
	fp.counters(t)

	// The seeds without ICMP among flows: batches the fused path takes
	// whole, with drops in every pass; then all of them.
	var noICMP [][]byte
	for _, fr := range seeds {
		pkt := gopacket.NewPacket(fr, layers.LayerTypeEthernet, gopacket.Default)
		if pkt.Layer(layers.LayerTypeICMPv4) == nil && pkt.Layer(layers.LayerTypeICMPv6) == nil {
			noICMP = append(noICMP, fr)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 40 {
		some := noICMP
		if round >= 20 {
			some = seeds
		}
		all := append(append([][]byte(nil), frames[:300]...), some...)
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		for i := 0; i < len(all); i += engine.MaxBatch {
			fp.batch(t, all[i:min(i+engine.MaxBatch, len(all))]...)
		}
		fp.now += int64(round) * int64(100*time.Millisecond)
	}
	fp.counters(t)
}

// FuzzFused is TestFusedAgrees for arbitrary frames: a batch of a, and by
// mode's bits b, a again, and a bench flow (a TCP or UDP frame the fused
// path takes), through both; the clock moves by mode's top bits between
// inputs. The pair is built once per process, so state carries over
// between inputs, alike in both (and Go's minimization of each new input
// runs to its 60 s limit: fuzz with -fuzzminimizetime 3s, see README).
func FuzzFused(f *testing.F) {
	seeds := muxFuzzSeeds(f)
	for i, s := range seeds {
		f.Add(s.frame, seeds[(i+1)%len(seeds)].frame, uint8(i))
	}
	fp := newFusedPair(f)
	flows := benchTargets.Frames(benchFlows(64, muxAgreeMix, 9, true))
	n := 0
	f.Fuzz(func(t *testing.T, a, b []byte, mode uint8) {
		if len(a) > muxFuzzMaxFrame || len(b) > muxFuzzMaxFrame {
			return // the port would not receive it
		}
		batch := [][]byte{a}
		if mode&1 != 0 {
			batch = append(batch, b)
		}
		if mode&2 != 0 {
			batch = append(batch, a)
		}
		if mode&4 != 0 {
			batch = append(batch, flows[n%len(flows)])
			n++
		}
		fp.batch(t, batch...)
		fp.now += int64(mode>>3) * int64(50*time.Millisecond)
		fp.counters(t)
	})
}
