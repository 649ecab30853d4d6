package mux

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/guard"
	"github.com/xdplb/xdplb/health"
)

type fakeChecker struct {
	mu      sync.Mutex
	targets []health.Target
	states  map[string]health.State
}

func (f *fakeChecker) Set(ts []health.Target) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.targets = ts
	return nil
}

func (f *fakeChecker) State(key string) (health.State, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.states[key]
	return s, ok
}

func (f *fakeChecker) set(key string, s health.State) {
	f.mu.Lock()
	f.states[key] = s
	f.mu.Unlock()
}

type fakeAnnouncer struct {
	calls [][]netip.Prefix
	fail  error // returned by Sync instead of taking the set
}

func (f *fakeAnnouncer) Sync(want []netip.Prefix) error {
	if f.fail != nil {
		return f.fail
	}
	f.calls = append(f.calls, append([]netip.Prefix(nil), want...))
	return nil
}

type fakeSteering struct {
	cfg  steer.Config
	fail error // returned by Sync instead of taking the configuration
	// midway, once: Sync deletes the stale entries, as steer.Program.Sync
	// does first, then fails adding the new ones with this error.
	midway error
}

func (f *fakeSteering) Sync(c steer.Config) error {
	if f.fail != nil {
		return f.fail
	}
	if err := f.midway; err != nil {
		f.midway = nil
		var kept []steer.DstRule
		for _, r := range f.cfg.Dst {
			if slices.Contains(c.Dst, r) {
				kept = append(kept, r)
			}
		}
		f.cfg.Dst = kept
		return err
	}
	f.cfg = c
	return nil
}

const doc1 = `
version: 1
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    probe: {type: tcp}
    backends:
      - {name: a, address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}
      - {name: b, address: 198.19.1.2, mac: "02:00:00:00:01:02", host: 198.19.0.2}
  - name: dns
    address: 198.18.100.2
    protocol: udp
    port: 53
    backends:
      - {name: c, address: 198.19.1.3, mac: "02:00:00:00:01:03", host: 198.19.0.2}
`

func TestControllerHealthAndAnnouncements(t *testing.T) {
	doc, err := control.Parse([]byte(doc1))
	require.NoError(t, err)
	chk := &fakeChecker{states: map[string]health.State{}}
	ann := &fakeAnnouncer{}
	st := &fakeSteering{}
	rules := flow.NewRules()
	c, err := NewController(ControllerConfig{Rules: rules, Checker: chk, Announcer: ann, Steering: st})
	require.NoError(t, err)
	require.NoError(t, c.Apply(doc))

	vipWeb := netip.MustParsePrefix("198.18.100.1/32")
	vipDNS := netip.MustParsePrefix("198.18.100.2/32")
	// Probed backends are down until their probes pass: only the unprobed
	// VIP is announced.
	require.Equal(t, []netip.Prefix{vipDNS}, c.Announced())
	require.Len(t, chk.targets, 2)
	require.Equal(t, "web/a", chk.targets[0].Key)
	require.Equal(t, netip.MustParseAddrPort("198.19.1.1:80"), chk.targets[0].Addr)
	require.Len(t, st.cfg.Dst, 4, "two VIP rules and ICMP to each VIP address")
	require.EqualValues(t, 1, rules.Load().Version)

	// One backend comes up: the VIP is announced, new flows go to it only.
	chk.set("web/a", health.Up)
	c.HealthChanged(health.Event{Key: "web/a"})
	require.Equal(t, []netip.Prefix{vipWeb, vipDNS}, c.Announced())
	web := rules.Load().LookupVIP(flow.VIP{Addr: vipWeb.Addr(), Proto: flow.ProtoTCP, Port: 80})
	require.Equal(t, flow.BackendActive, web.Backends[0].State)
	require.Equal(t, flow.BackendDown, web.Backends[1].State)

	// Both go down: withdrawn.
	chk.set("web/a", health.Down)
	c.HealthChanged(health.Event{Key: "web/a"})
	require.Equal(t, []netip.Prefix{vipDNS}, c.Announced())

	// Draining withdraws everything; undraining brings back the healthy.
	require.NoError(t, c.SetDraining(true))
	require.Empty(t, c.Announced())
	require.NoError(t, c.SetDraining(false))
	require.Equal(t, []netip.Prefix{vipDNS}, c.Announced())

	// An invalid document (as a whole) changes nothing. Built in code, so
	// it passes the parser but not the snapshot: a duplicated VIP.
	bad := *doc
	bad.Version = 2
	bad.VIPs = append(append([]control.VIP(nil), doc.VIPs...), doc.VIPs[0])
	bad.VIPs[2].Name = "web-again"
	require.Error(t, c.Apply(&bad))
	require.EqualValues(t, 1, c.Version())
	require.EqualValues(t, 1, rules.Load().Version)
}

// TestControllerApplyWholeOrNothing: a version whose steering sync fails
// changes nothing — rules (VIP addresses' VNIs included), steering and
// probe targets stay the running version's — and the next version
// applies.
func TestControllerApplyWholeOrNothing(t *testing.T) {
	doc, err := control.Parse([]byte(doc1))
	require.NoError(t, err)
	chk := &fakeChecker{states: map[string]health.State{}}
	st := &fakeSteering{}
	rules := flow.NewRules()
	c, err := NewController(ControllerConfig{Rules: rules, Checker: chk, Steering: st})
	require.NoError(t, err)
	require.NoError(t, c.Apply(doc))
	targets, steering, snap := chk.targets, st.cfg, c.snapshot.Load()

	doc2 := *doc
	doc2.Version = 2
	web := doc.VIPs[0] // keep web with one backend (one probe), drop dns
	web.Backends = web.Backends[:1]
	doc2.VIPs = []control.VIP{web}
	st.fail = errors.New("steering map full")
	require.ErrorContains(t, c.Apply(&doc2), "steering map full")
	require.Equal(t, targets, chk.targets, "probe targets of a refused version")
	require.Equal(t, steering, st.cfg)
	require.Same(t, snap, c.snapshot.Load(), "data-path snapshot of a refused version")
	require.EqualValues(t, 1, rules.Load().Version)

	st.fail = nil
	require.NoError(t, c.Apply(&doc2))
	require.Len(t, chk.targets, 1)
	require.EqualValues(t, 2, rules.Load().Version)

	// A sync that fails midway (a kernel error once the stale entries are
	// gone, steer.Program.Sync) leaves the running version's steering,
	// not one between the two: version 2's VIPs stay steered.
	steering = st.cfg
	doc3 := *doc
	doc3.Version = 3
	doc3.VIPs = doc.VIPs[1:] // dns only: web is stale
	st.midway = errors.New("bpf map update: cannot allocate memory")
	require.ErrorContains(t, c.Apply(&doc3), "cannot allocate memory")
	require.Equal(t, steering, st.cfg, "steering of a refused version")
	require.EqualValues(t, 2, rules.Load().Version)
}

// TestControllerSourcePrefixes: the source filter's set of a version is
// published in the same snapshot as its rules; a version whose set
// cannot be built is refused whole.
func TestControllerSourcePrefixes(t *testing.T) {
	doc, err := control.Parse([]byte(doc1))
	require.NoError(t, err)
	var fail error
	sets := map[uint64]*guard.Prefixes{}
	c, err := NewController(ControllerConfig{Rules: flow.NewRules(), Checker: &fakeChecker{states: map[string]health.State{}},
		SourcePrefixes: func(d *control.Document) (*guard.Prefixes, error) {
			if fail != nil {
				return nil, fail
			}
			set, err := guard.NewPrefixes(nil, d.InfraPrefixes)
			sets[d.Version] = set
			return set, err
		}})
	require.NoError(t, err)
	require.NoError(t, c.Apply(doc))
	snap := c.snapshot.Load()
	require.Same(t, sets[1], snap.SourcePrefixes())
	require.EqualValues(t, 1, snap.RuleSnapshot().Version)

	doc2 := *doc
	doc2.Version = 2
	fail = errors.New("bad prefix")
	require.ErrorContains(t, c.Apply(&doc2), "source prefixes: bad prefix")
	require.Same(t, snap, c.snapshot.Load(), "a refused version publishes nothing")
	fail = nil
	require.NoError(t, c.Apply(&doc2))
	snap = c.snapshot.Load()
	require.Same(t, sets[2], snap.SourcePrefixes(), "the set of the version of the rules")
	require.EqualValues(t, 2, snap.RuleSnapshot().Version)
}

// TestControllerApplyAnnouncementFails: Apply returns an error only for
// a version it did not apply. A version that is published, but whose
// announcements BGP does not take at once, is applied (Apply returns nil,
// Version reports it: the watcher must not call it refused while the data
// path runs it), and the announcements follow at the next change.
func TestControllerApplyAnnouncementFails(t *testing.T) {
	doc, err := control.Parse([]byte(doc1))
	require.NoError(t, err)
	tests := []struct {
		name string
		edit func(d *control.Document) // version 2, from version 1
	}{
		{"a VIP added", func(d *control.Document) {
			v := d.VIPs[1]
			v.Name, v.Address = "dns2", netip.MustParseAddr("198.18.100.3")
			d.VIPs = append(slices.Clone(d.VIPs), v)
		}},
		{"a VIP removed", func(d *control.Document) { d.VIPs = d.VIPs[:1] }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chk := &fakeChecker{states: map[string]health.State{}}
			ann := &fakeAnnouncer{}
			rules := flow.NewRules()
			c, err := NewController(ControllerConfig{Rules: rules, Checker: chk, Announcer: ann, Logger: quietLog})
			require.NoError(t, err)
			require.NoError(t, c.Apply(doc))

			doc2 := *doc
			doc2.Version = 2
			tt.edit(&doc2)
			ann.fail = errors.New("gobgp: add path failed")
			err = c.Apply(&doc2)
			require.EqualValues(t, 2, rules.Load().Version, "version 2 is published")
			require.NoError(t, err, "a published version reported refused")
			require.EqualValues(t, 2, c.Version())

			ann.fail = nil
			chk.set("web/a", health.Up)
			c.HealthChanged(health.Event{Key: "web/a"})
			require.Equal(t, wantAnnounced(rules.Load()), c.Announced(), "the announcements catch up")
		})
	}
}

// TestControllerApplyNotThisNode: a fleet document that does not serve
// the controller's node (not in its nodes section, or a node name missing)
// is refused with control.ErrUnknownNode, and the running version stays.
func TestControllerApplyNotThisNode(t *testing.T) {
	const fleet = "version: 2\nbgp:\n  asn: 65010\nnodes:\n  mux-1:\n    bgp:\n      router_id: 198.18.0.11\n"
	tests := []struct {
		name string
		node string
	}{
		{"another node", "mux-9"},
		{"no node name", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first, err := control.Parse([]byte(doc1))
			require.NoError(t, err)
			first.Node.Name = tt.node
			doc, err := control.Parse([]byte(fleet))
			require.NoError(t, err)
			rules := flow.NewRules()
			c, err := NewController(ControllerConfig{Node: tt.node, Rules: rules, Checker: &fakeChecker{states: map[string]health.State{}}, Logger: quietLog})
			require.NoError(t, err)
			require.NoError(t, c.Apply(first))
			require.NotPanics(t, func() { err = c.Apply(doc) })
			require.ErrorIs(t, err, control.ErrUnknownNode)
			require.EqualValues(t, 1, c.Version())
			require.EqualValues(t, 1, rules.Load().Version)
		})
	}
}
