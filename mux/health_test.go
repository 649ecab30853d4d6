package mux

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/bgp"
	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// healthDoc is six VIPs of four backends: vip0..vip4 probed, vip5 not;
// vip3 and vip4 share an address (one announcement for both).
func healthDoc() *control.Document {
	doc := scaleDocument(6, 4, true)
	doc.VIPs[4].Address, doc.VIPs[4].Port = doc.VIPs[3].Address, 443
	doc.VIPs[5].Probe = nil
	return doc
}

// healthRig is a Controller that has applied doc, with a fake checker in
// which every target starts in the given state.
func healthRig(t *testing.T, doc *control.Document, st health.State) (*Controller, *fakeChecker, *fakeAnnouncer) {
	t.Helper()
	chk := &fakeChecker{states: map[string]health.State{}}
	for _, tg := range targets(doc) {
		chk.states[tg.Key] = st
	}
	ann := &fakeAnnouncer{}
	c, err := NewController(ControllerConfig{Rules: flow.NewRules(), Checker: chk, Announcer: ann, Logger: quietLog})
	require.NoError(t, err)
	require.NoError(t, c.Apply(doc))
	return c, chk, ann
}

// requireSameRules checks that got serves what want serves: every rule's
// name, VIP, backends (IDs and states included) and Maglev table.
func requireSameRules(t *testing.T, want, got *flow.Snapshot) {
	t.Helper()
	require.Equal(t, want.Version, got.Version)
	require.Equal(t, want.Len(), got.Len())
	for i, w := range want.Rules() {
		g := got.Rule(uint32(i))
		require.Equal(t, w.Name, g.Name)
		require.Equal(t, w.VIP, g.VIP)
		require.Equal(t, w.Backends, g.Backends, "rule %s", w.Name)
		require.Equal(t, w.Maglev().Size(), g.Maglev().Size(), "rule %s", w.Name)
		require.Equal(t, w.Maglev().Fingerprint(), g.Maglev().Fingerprint(), "rule %s", w.Name)
	}
}

// wantAnnounced is what a Mux running snap announces: the addresses of
// the rules with a backend that takes new flows.
func wantAnnounced(snap *flow.Snapshot) []netip.Prefix {
	var ps []netip.Prefix
	for _, r := range snap.Rules() {
		if p := bgp.HostPrefix(r.VIP.Addr); servable(r) && !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	if ps == nil {
		ps = []netip.Prefix{}
	}
	return ps
}

type change struct {
	key string
	st  health.State
}

// TestHealthCoalesced: a batch of verdicts gives the snapshot and the
// announcements that the same verdicts one at a time give, and both are
// what a full rebuild from the document gives.
func TestHealthCoalesced(t *testing.T) {
	tests := []struct {
		name    string
		start   health.State
		changes []change
	}{
		{"one up", health.Unknown, []change{{"vip0/b1", health.Up}}},
		{"start-up: everything up", health.Unknown, func() []change {
			var cs []change
			for _, tg := range targets(healthDoc()) {
				cs = append(cs, change{tg.Key, health.Up})
			}
			return cs
		}()},
		{"one VIP down entirely", health.Up, []change{
			{"vip2/b0", health.Down}, {"vip2/b1", health.Down}, {"vip2/b2", health.Down}, {"vip2/b3", health.Down}}},
		{"a flap inside the batch", health.Up, []change{
			{"vip1/b0", health.Down}, {"vip1/b0", health.Up}, {"vip1/b2", health.Down}}},
		{"shared address: one of two VIPs down", health.Up, []change{
			{"vip3/b0", health.Down}, {"vip3/b1", health.Down}, {"vip3/b2", health.Down}, {"vip3/b3", health.Down}}},
		{"shared address: both down", health.Up, []change{
			{"vip3/b0", health.Down}, {"vip3/b1", health.Down}, {"vip3/b2", health.Down}, {"vip3/b3", health.Down},
			{"vip4/b0", health.Down}, {"vip4/b1", health.Down}, {"vip4/b2", health.Down}, {"vip4/b3", health.Down}}},
		{"stale and malformed keys", health.Up, []change{
			{"gone/b0", health.Down}, {"vip0", health.Down}, {"", health.Down}, {"vip0/b3", health.Down}}},
		{"many VIPs, some twice", health.Up, []change{
			{"vip4/b1", health.Down}, {"vip0/b0", health.Down}, {"vip2/b3", health.Down}, {"vip0/b1", health.Down},
			{"vip4/b1", health.Up}, {"vip1/b0", health.Unknown}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := healthDoc()
			one, chk1, ann1 := healthRig(t, doc, tt.start)
			all, chkN, annN := healthRig(t, doc, tt.start)
			var evs []health.Event
			for _, ch := range tt.changes {
				chk1.set(ch.key, ch.st)
				one.HealthChanged(health.Event{Key: ch.key, New: ch.st})
				chkN.set(ch.key, ch.st)
				evs = append(evs, health.Event{Key: ch.key, New: ch.st})
			}
			all.HealthChanged(evs...)

			ref, err := flow.NewSnapshot(doc.Version, doc.Rules(all.healthOf(doc, nil)), nil)
			require.NoError(t, err)
			requireSameRules(t, ref, all.rules.Load())
			requireSameRules(t, ref, one.rules.Load())
			require.Equal(t, wantAnnounced(ref), all.Announced())
			require.Equal(t, wantAnnounced(ref), one.Announced())
			require.Equal(t, annN.calls[len(annN.calls)-1], ann1.calls[len(ann1.calls)-1])
			require.LessOrEqual(t, len(annN.calls), 2, "one BGP update at most for the batch")
		})
	}
}

// TestHealthKeepsUnaffectedTables: a verdict on one VIP leaves every
// other VIP's rule, Maglev table included, as it was (the same pointers),
// and builds a new table only for its own.
func TestHealthKeepsUnaffectedTables(t *testing.T) {
	tests := []struct {
		name     string
		changes  []change
		affected []int // rule IDs that must be new
		rebuilt  []int // of those, the ones whose table must be new
	}{
		{"one backend down", []change{{"vip2/b1", health.Down}}, []int{2}, []int{2}},
		{"two VIPs", []change{{"vip0/b0", health.Down}, {"vip4/b3", health.Down}}, []int{0, 4}, []int{0, 4}},
		{"verdict that changes nothing", []change{{"vip1/b0", health.Up}}, []int{1}, nil},
		{"unprobed VIP named", []change{{"vip5/b0", health.Down}}, []int{5}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, chk, _ := healthRig(t, healthDoc(), health.Up)
			before := c.rules.Load()
			var evs []health.Event
			for _, ch := range tt.changes {
				chk.set(ch.key, ch.st)
				evs = append(evs, health.Event{Key: ch.key, New: ch.st})
			}
			c.HealthChanged(evs...)
			after := c.rules.Load()
			require.NotSame(t, before, after, "a new snapshot is published")
			for i, r := range after.Rules() {
				old := before.Rule(uint32(i))
				if !slices.Contains(tt.affected, i) {
					require.Same(t, old, r, "rule %s is shared", r.Name)
					require.Same(t, old.Maglev(), r.Maglev(), "rule %s keeps its table", r.Name)
					continue
				}
				if slices.Contains(tt.rebuilt, i) {
					require.NotSame(t, old.Maglev(), r.Maglev(), "rule %s gets a new table", r.Name)
				} else {
					require.Same(t, old.Maglev(), r.Maglev(), "rule %s: same weights, same table", r.Name)
				}
			}
		})
	}
}

// TestHealthBackendIDsResolve: the backend IDs a connection table stores
// resolve, in every snapshot health publishes, to the same VIP and backend
// and to the running snapshot's rule, whatever changed elsewhere.
func TestHealthBackendIDsResolve(t *testing.T) {
	doc := healthDoc()
	c, chk, _ := healthRig(t, doc, health.Up)
	type stored struct {
		vip  flow.VIP
		name string
		id   uint32
	}
	var conns []stored // one flow to every backend
	for _, r := range c.rules.Load().Rules() {
		for _, b := range r.Backends {
			conns = append(conns, stored{r.VIP, b.Name, b.ID})
		}
	}
	ts := targets(doc)
	rnd := rand.New(rand.NewPCG(3, 4))
	for step := range 200 {
		evs := make([]health.Event, 1+rnd.IntN(4))
		for k := range evs {
			key := ts[rnd.IntN(len(ts))].Key
			st := health.State(rnd.IntN(3))
			chk.set(key, st)
			evs[k] = health.Event{Key: key, New: st}
		}
		c.HealthChanged(evs...)
		snap := c.rules.Load()
		for _, conn := range conns {
			r, idx, ok := snap.Backend(conn.id)
			require.True(t, ok, "step %d: ID %d", step, conn.id)
			require.Same(t, snap.LookupVIP(conn.vip), r, "step %d: the running snapshot's rule", step)
			require.Equal(t, conn.name, r.Backends[idx].Name, "step %d", step)
			st, _ := chk.State(fmt.Sprintf("%s/%s", r.Name, conn.name))
			if r.Name != "vip5" {
				require.Equal(t, st == health.Up, r.Backends[idx].State == flow.BackendActive, "step %d: %s/%s", step, r.Name, conn.name)
			}
		}
	}
}
