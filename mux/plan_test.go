package mux

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/flow"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden plans in testdata")

func exampleDoc(t *testing.T) *control.Document {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "control", "testdata", "example.yaml"))
	require.NoError(t, err)
	doc, err := control.Parse(data)
	require.NoError(t, err)
	return doc
}

// TestPlanGolden: the plan of the documented example, as text, is the
// golden one (go test -run TestPlanGolden ./mux/ -update rewrites it).
func TestPlanGolden(t *testing.T) {
	p, err := NewPlan(exampleDoc(t), "")
	require.NoError(t, err)
	golden := filepath.Join("testdata", "plan_example.golden")
	if *updateGolden {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(golden, []byte(p.String()), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	assert.Equal(t, string(want), p.String())
	d := p.Diff(p)
	assert.True(t, d.Empty(), "a plan differs from itself: %+v", d)
}

// TestPlanDiff: the diff of two plans for typical edits says exactly what
// changes.
func TestPlanDiff(t *testing.T) {
	base := exampleDoc(t)
	edit := func(f func(d *control.Document)) *control.Document {
		data, err := base.Marshal()
		require.NoError(t, err)
		d, err := control.Parse(data)
		require.NoError(t, err)
		f(d)
		return d
	}
	web := func(d *control.Document) *control.VIP {
		for i := range d.VIPs {
			if d.VIPs[i].Name == "web" {
				return &d.VIPs[i]
			}
		}
		t.Fatal("no VIP web in the example")
		return nil
	}
	newDIP := control.Backend{Name: "vm-new", Address: netip.MustParseAddr("198.19.1.9"), Port: 8080,
		MAC: [6]byte{2, 0, 0, 0, 1, 9}, Host: netip.MustParseAddr("198.19.0.1"), Weight: 1}
	newVIP := control.VIP{Name: "api", Address: netip.MustParseAddr("198.18.100.9"), Protocol: flow.ProtoTCP, Port: 443, VNI: 100,
		Backends: []control.Backend{newDIP}}
	cases := []struct {
		name string
		edit func(d *control.Document)
		want func(t *testing.T, d PlanDiff)
	}{
		{"add a DIP", func(d *control.Document) { v := web(d); v.Backends = append(v.Backends, newDIP) }, func(t *testing.T, d PlanDiff) {
			assert.Equal(t, []string{"web"}, d.ChangedVIPs)
			assert.Equal(t, []string{"web"}, d.Tables)
			assert.Equal(t, []string{"web/vm-new"}, d.ProbesAdded)
			assert.Empty(t, d.SteerAdded)
			assert.Empty(t, d.AnnounceAdded)
			assert.False(t, d.BGP || d.VNIs || d.Sources || d.HashSeed)
		}},
		{"drain one", func(d *control.Document) { web(d).Backends[0].State = flow.BackendDraining }, func(t *testing.T, d PlanDiff) {
			assert.Equal(t, []string{"web"}, d.ChangedVIPs)
			assert.Equal(t, []string{"web"}, d.Tables)
			assert.Empty(t, d.ProbesAdded)
			assert.Empty(t, d.ProbesRemoved)
			assert.Empty(t, d.ProbesChanged, "draining keeps probing")
		}},
		{"change a DIP's port", func(d *control.Document) { web(d).Backends[0].Port = 9090 }, func(t *testing.T, d PlanDiff) {
			assert.Equal(t, []string{"web"}, d.ChangedVIPs)
			assert.Empty(t, d.Tables, "a port is not an input of the Maglev table")
		}},
		{"add a VIP", func(d *control.Document) { d.VIPs = append(d.VIPs, newVIP) }, func(t *testing.T, d PlanDiff) {
			assert.Equal(t, []string{"api"}, d.AddedVIPs)
			assert.Empty(t, d.ChangedVIPs)
			assert.Equal(t, []steer.DstRule{
				{Addr: newVIP.Address, Proto: flow.ProtoTCP, Port: 443},
				{Addr: newVIP.Address, Proto: flow.ProtoICMP},
			}, d.SteerAdded)
			assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("198.18.100.9/32")}, d.AnnounceAdded)
			assert.True(t, d.VNIs)
		}},
		{"remove a VIP", func(d *control.Document) { d.VIPs = d.VIPs[1:] }, func(t *testing.T, d PlanDiff) {
			assert.Equal(t, []string{base.VIPs[0].Name}, d.RemovedVIPs)
			assert.NotEmpty(t, d.SteerRemoved)
		}},
		{"change BGP", func(d *control.Document) { d.BGP.HoldTime *= 2 }, func(t *testing.T, d PlanDiff) {
			assert.True(t, d.BGP)
			assert.Empty(t, d.ChangedVIPs)
			assert.Empty(t, d.SteerAdded)
		}},
	}
	p0, err := NewPlan(base, "")
	require.NoError(t, err)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p1, err := NewPlan(edit(c.edit), "")
			require.NoError(t, err)
			d := p0.Diff(p1)
			t.Logf("%+v", d)
			require.False(t, d.Empty())
			c.want(t, d)
		})
	}
	// From nothing: everything is added.
	d := (*Plan)(nil).Diff(p0)
	assert.Len(t, d.AddedVIPs, len(base.VIPs))
	assert.Equal(t, p0.Announce, d.AnnounceAdded)
}

// TestPlanRefusesVNIConflict: one address in two VNIs is refused, naming
// both VIPs.
func TestPlanRefusesVNIConflict(t *testing.T) {
	doc := exampleDoc(t)
	v := doc.VIPs[0]
	v.Name, v.Port, v.VNI = "other", v.Port+1, v.VNI+1
	doc.VIPs = append(doc.VIPs, v)
	_, err := NewPlan(doc, "")
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), doc.VIPs[0].Name) && strings.Contains(err.Error(), "other"), err.Error())
}

// TestPlanRefusesView: a Host Agent's view (it has vip_addresses) is not
// a Mux's document.
func TestPlanRefusesView(t *testing.T) {
	doc := exampleDoc(t)
	_, err := NewPlan(doc, "")
	require.NoError(t, err)
	view := *doc
	view.VIPAddresses = []netip.Addr{doc.VIPs[0].Address}
	_, err = NewPlan(&view, "")
	require.ErrorContains(t, err, "Host Agent's view")
}

// TestPlanForNode: one fleet document gives each Mux its own BGP speaker
// and the same everything else; a name the document does not list is
// refused.
func TestPlanForNode(t *testing.T) {
	doc, err := control.Parse([]byte(`version: 1
bgp:
  asn: 65010
nodes:
  mux-1:
    bgp: {router_id: 198.18.0.11, peers: [{address: 198.18.0.1, asn: 65000}]}
  mux-2:
    bgp: {router_id: 198.18.0.12, peers: [{address: 198.18.0.2, asn: 65000}]}
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    backends:
      - {name: vm-a, address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}
`))
	require.NoError(t, err)
	p1, err := NewPlan(doc, "mux-1")
	require.NoError(t, err)
	p2, err := NewPlan(doc, "mux-2")
	require.NoError(t, err)
	assert.Equal(t, netip.MustParseAddr("198.18.0.11"), p1.BGP.RouterID)
	assert.Equal(t, netip.MustParseAddr("198.18.0.2"), p2.BGP.Peers[0].Address)
	d := p1.Diff(p2)
	assert.True(t, d.BGP)
	d.BGP = false
	assert.True(t, d.Empty(), "only BGP differs between two Muxes: %+v", d)
	_, err = NewPlan(doc, "mux-3")
	assert.ErrorIs(t, err, control.ErrUnknownNode)
	_, err = NewPlan(doc, "")
	assert.ErrorIs(t, err, control.ErrUnknownNode)
}
