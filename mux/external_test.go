package mux

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// extDoc: host-1 has 198.19.1.1 in VNI 100 (web100/a) and in VNI 200
// (web200/c), both probed on port 8080; host-2 has web100/b; kv/k sits behind a host with no Host
// Agent (not in hosts[]), so the Mux still probes it; dns is not probed.
const extDoc = `
version: 1
vips:
  - name: web100
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    probe: {type: http, port: 8080, interval: 2s, timeout: 5s, rise: 3, fall: 3}
    backends:
      - {name: a, address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}
      - {name: b, address: 198.19.1.2, mac: "02:00:00:00:01:02", host: 198.19.0.2}
  - name: web200
    address: 198.18.100.2
    protocol: tcp
    port: 443
    vni: 200
    probe: {type: tcp, port: 8080}
    backends:
      - {name: c, address: 198.19.1.1, mac: "02:00:00:00:02:01", host: 198.19.0.1}
  - name: kv
    address: 198.18.100.3
    protocol: tcp
    port: 6379
    vni: 100
    probe: {type: tcp}
    backends:
      - {name: k, address: 198.19.9.1, mac: "02:00:00:00:09:01", host: 198.19.0.9}
  - name: dns
    address: 198.18.100.4
    protocol: udp
    port: 53
    vni: 100
    backends:
      - {name: d, address: 198.19.1.2, mac: "02:00:00:00:01:02", host: 198.19.0.2}
hosts:
  - name: host-1
    address: 198.19.0.1
    vms:
      - {vni: 100, address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm1}
      - {vni: 200, address: 198.19.1.1, mac: "02:00:00:00:02:01", interface: vm1t}
  - name: host-2
    address: 198.19.0.2
    vms:
      - {vni: 100, address: 198.19.1.2, mac: "02:00:00:00:01:02", interface: vm2}
`

func extRig(t *testing.T) (*Controller, *fakeChecker, *fakeAnnouncer) {
	t.Helper()
	chk := &fakeChecker{states: map[string]health.State{"kv/k": health.Up}}
	ann := &fakeAnnouncer{}
	c, err := NewController(ControllerConfig{Rules: flow.NewRules(), Checker: chk, Announcer: ann, Logger: quietLog,
		ExternalHealth: true})
	require.NoError(t, err)
	require.NoError(t, c.Apply(mustParse(t, extDoc)))
	return c, chk, ann
}

var (
	dipA = netip.MustParseAddr("198.19.1.1") // web100/a in VNI 100, web200/c in VNI 200
	dipB = netip.MustParseAddr("198.19.1.2")
)

func up(vni uint32, a netip.Addr, port uint16) health.Verdict {
	return health.Verdict{VNI: vni, Addr: a, Port: port, Up: true, Since: time.Unix(1, 0)}
}

func down(vni uint32, a netip.Addr, port uint16) health.Verdict {
	return health.Verdict{VNI: vni, Addr: a, Port: port, Reason: "connection refused"}
}

// backendsUp returns the backends that take new flows, "vip/backend".
func backendsUp(snap *flow.Snapshot) []string {
	var out []string
	for _, r := range snap.Rules() {
		for _, b := range r.Backends {
			if b.State == flow.BackendActive {
				out = append(out, r.Name+"/"+b.Name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestExternalHealth: with ExternalHealth the hosts' reports decide the
// backends on hosts with a Host Agent, by (VNI, DIP, probed port) and by
// the host the document puts them on (by its hosts[] name); backends with
// no report are down;
// a host whose reports are gone takes its backends down; the Mux still
// probes the backend of a host with no agent. Each step's snapshot is
// what a full rebuild gives, and only the VIPs it changes are rebuilt.
func TestExternalHealth(t *testing.T) {
	c, chk, ann := extRig(t)
	require.Equal(t, []string{"kv/k"}, keysOf(chk.targets), "the Mux probes only the backend no agent reports on")
	require.Equal(t, []string{"dns/d", "kv/k"}, backendsUp(c.rules.Load()), "no report yet: down")

	steps := []struct {
		name    string
		reports map[string][]health.Verdict
		want    []string // backends up after the step
		rebuilt []string // VIPs whose rule is new
	}{
		{"host-1: VNI 100 up, VNI 200 down (same address)",
			map[string][]health.Verdict{"host-1": {up(100, dipA, 8080), down(200, dipA, 8080)}},
			[]string{"dns/d", "kv/k", "web100/a"}, []string{"web100"}},
		{"host-2 under its address, not its name, decides nothing",
			map[string][]health.Verdict{"198.19.0.2": {up(100, dipB, 8080)}},
			[]string{"dns/d", "kv/k", "web100/a"}, nil},
		{"host-2; a verdict for another port decides nothing",
			map[string][]health.Verdict{"host-2": {up(100, dipB, 8080), up(100, dipB, 53)}},
			[]string{"dns/d", "kv/k", "web100/a", "web100/b"}, []string{"web100"}},
		{"host-1: VNI 200 up too",
			map[string][]health.Verdict{"host-1": {up(100, dipA, 8080), up(200, dipA, 8080)}},
			[]string{"dns/d", "kv/k", "web100/a", "web100/b", "web200/c"}, []string{"web200"}},
		{"a verdict from the wrong host decides nothing",
			map[string][]health.Verdict{"host-2": {up(100, dipB, 8080), down(100, dipA, 8080)}},
			[]string{"dns/d", "kv/k", "web100/a", "web100/b", "web200/c"}, nil},
		{"host-1's reports gone (its agent died): its backends down",
			map[string][]health.Verdict{"host-1": nil},
			[]string{"dns/d", "kv/k", "web100/b"}, []string{"web100", "web200"}},
		{"two hosts at once",
			map[string][]health.Verdict{"host-1": {up(200, dipA, 8080)}, "host-2": {down(100, dipB, 8080)}},
			[]string{"dns/d", "kv/k", "web200/c"}, []string{"web100", "web200"}},
	}
	for _, st := range steps {
		before := c.rules.Load()
		require.NoError(t, c.SetDIPHealth(st.reports), st.name)
		after := c.rules.Load()
		assert.Equal(t, st.want, backendsUp(after), st.name)
		for i, r := range after.Rules() {
			if slices.Contains(st.rebuilt, r.Name) {
				assert.NotSame(t, before.Rule(uint32(i)), r, "%s: rule %s rebuilt", st.name, r.Name)
			} else {
				assert.Same(t, before.Rule(uint32(i)), r, "%s: rule %s shared", st.name, r.Name)
			}
		}
		ref, err := flow.NewSnapshot(c.doc.Version, c.doc.Rules(c.healthOf(c.doc, c.ext)), nil)
		require.NoError(t, err)
		requireSameRules(t, ref, after)
		assert.Equal(t, wantAnnounced(after), ann.calls[len(ann.calls)-1], st.name)
	}

	// The Mux's own verdicts still apply to the backend no agent reports on.
	chk.set("kv/k", health.Down)
	c.HealthChanged(health.Event{Key: "kv/k", New: health.Down})
	assert.Equal(t, []string{"dns/d", "web200/c"}, backendsUp(c.rules.Load()))

	// A new version keeps the reports: they decide its backends at once.
	doc2 := mustParse(t, extDoc)
	doc2.Version = 2
	require.NoError(t, c.Apply(doc2))
	assert.Equal(t, []string{"dns/d", "web200/c"}, backendsUp(c.rules.Load()))
}

func TestExternalHealthOff(t *testing.T) {
	c, chk, _ := healthRig(t, mustParse(t, extDoc), health.Up)
	require.ErrorIs(t, c.SetDIPHealth(map[string][]health.Verdict{"host-1": {up(100, dipA, 8080)}}), ErrNotExternalHealth)
	assert.Len(t, chk.targets, 4, "the Mux probes every backend")
	m, err := New(Config{Interface: "up", ConfigPath: "x", Logger: quietLog})
	require.NoError(t, err)
	assert.ErrorIs(t, m.SetDIPHealth("host-1", nil), ErrNotExternalHealth)
}

// TestMuxSetDIPHealthConcurrent: reports of many hosts from many
// goroutines at once all end up applied, whichever caller applied them.
func TestMuxSetDIPHealthConcurrent(t *testing.T) {
	m, err := New(Config{Interface: "up", ConfigPath: "x", Logger: quietLog, ExternalHealth: true})
	require.NoError(t, err)
	const hosts = 40
	doc := fmt.Sprintf("version: 1\nvips:\n  - name: web\n    address: 198.18.100.1\n    protocol: tcp\n    port: 80\n    vni: 7\n    probe: {type: tcp}\n    backends:\n")
	var hostsYAML string
	for i := range hosts {
		doc += fmt.Sprintf("      - {name: b%d, address: 198.19.1.%d, mac: \"02:00:00:00:01:%02x\", host: 198.19.0.%d}\n", i, i+1, i+1, i+1)
		hostsYAML += fmt.Sprintf("  - {name: h%d, address: 198.19.0.%d, vms: [{vni: 7, address: 198.19.1.%d, mac: \"02:00:00:00:01:%02x\", interface: vm}]}\n", i, i+1, i+1, i+1)
	}
	require.NoError(t, m.ctl.Apply(mustParse(t, doc+"hosts:\n"+hostsYAML)))
	var wg sync.WaitGroup
	for i := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := up(7, netip.AddrFrom4([4]byte{198, 19, 1, byte(i + 1)}), 80)
			v.Up = i%2 == 0
			require.NoError(t, m.SetDIPHealth(fmt.Sprintf("h%d", i), []health.Verdict{v}))
		}()
	}
	wg.Wait()
	got := backendsUp(m.rules.Load())
	require.Len(t, got, hosts/2)
	for i := 0; i < hosts; i += 2 {
		assert.Contains(t, got, fmt.Sprintf("web/b%d", i))
	}
}

func keysOf(ts []health.Target) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Key)
	}
	return out
}

func mustParse(t *testing.T, s string) *control.Document {
	t.Helper()
	doc, err := control.Parse([]byte(s))
	require.NoError(t, err)
	return doc
}
