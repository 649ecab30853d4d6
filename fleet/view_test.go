package fleet_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/fleet"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/hostagent"
)

// TestHostView: every host's view of a document with two tenants whose
// VMs share addresses (testdata/two-tenants.yaml) is a valid document
// that parses back to itself, and gives the host's Host Agent what the
// whole document gives it: the same plan (VM ports, endpoints, DIPs,
// steering, probes), the same outbound DIPs with the same pools and
// static ranges, every VIP's address (its client filters), and for each
// VIP with its DIPs the same rule for them — and no other VIP, and
// nothing of other hosts' VMs beyond what its inbound NAT rules and
// outbound sections name.
func TestHostView(t *testing.T) {
	doc, err := control.Load("testdata/two-tenants.yaml")
	require.NoError(t, err)
	for _, tc := range []struct {
		host string
		// backends: each VIP's backends in the view (the document's
		// own VIPs); outbound: the sections' addresses; hosts: the
		// hosts entries with their VMs' interfaces.
		backends map[string][]string
		outbound []string
		hosts    map[string][]string
	}{
		{"h1",
			map[string][]string{"web": {"a"}, "api": {"x"}},
			[]string{"198.18.100.1"},
			map[string][]string{"h1": {"vm-a", "vm-x"}, "h2": {"vm-b"}, "h3": {"vm-c"}}},
		{"h2",
			map[string][]string{"web": {"b"}, "api": {"y", "z"}},
			[]string{"198.18.100.1", "198.18.100.3"},
			map[string][]string{"h1": {"vm-a"}, "h2": {"vm-b", "vm-y", "vm-z"}, "h3": {"vm-c"}}},
		{"h3",
			map[string][]string{"web": {"c"}, "only-h3": {"198.19.1.3:0"}},
			nil,
			map[string][]string{"h2": {"vm-b"}, "h3": {"vm-c"}}},
		{"h4",
			map[string][]string{},
			nil,
			map[string][]string{"h2": {"vm-b"}, "h3": {"vm-c"}, "h4": nil}},
	} {
		t.Run(tc.host, func(t *testing.T) {
			view, err := fleet.HostView(doc, tc.host)
			require.NoError(t, err)
			text, err := view.Marshal()
			require.NoError(t, err)
			parsed, err := control.Parse(text)
			require.NoError(t, err, "the view parses:\n%s", text)
			again, err := parsed.Marshal()
			require.NoError(t, err)
			assert.Equal(t, string(text), string(again), "the view parses back to itself")
			assert.Equal(t, doc.Version, parsed.Version)
			assert.Nil(t, parsed.BGP, "a Muxes' setting")
			assert.Empty(t, parsed.Nodes, "a Muxes' setting")

			// What the test expects, by name.
			got := map[string][]string{}
			for _, v := range parsed.VIPs {
				if v.InboundNAT != "" {
					continue
				}
				got[v.Name] = nil
				for _, b := range v.Backends {
					got[v.Name] = append(got[v.Name], b.Name)
				}
			}
			assert.Equal(t, tc.backends, got, "backends")
			var obs []string
			for _, ob := range parsed.Outbound {
				obs = append(obs, ob.Address.String())
			}
			assert.Equal(t, tc.outbound, obs, "outbound sections")
			hosts := map[string][]string{}
			for _, h := range parsed.Hosts {
				hosts[h.Name] = nil
				for _, vm := range h.VMs {
					hosts[h.Name] = append(hosts[h.Name], vm.Interface)
				}
			}
			assert.Equal(t, tc.hosts, hosts, "hosts")

			// What the Host Agent runs.
			want, err := hostagent.NewPlan(doc, tc.host, nil)
			require.NoError(t, err)
			plan, err := hostagent.NewPlan(parsed, tc.host, nil)
			require.NoError(t, err)
			assert.Equal(t, want, plan, "the Host Agent's plan")
			assert.Equal(t, fleet.OutboundDIPs(doc, tc.host), fleet.OutboundDIPs(parsed, tc.host), "outbound DIPs")
			var addrs []netip.Addr
			for _, v := range doc.VIPs {
				addrs = append(addrs, v.Address)
			}
			slices.SortFunc(addrs, netip.Addr.Compare)
			addrs = slices.Compact(addrs)
			assert.Equal(t, addrs, parsed.VIPAddresses, "every VIP's address, sorted, once")
			snap, err := flow.NewSnapshotAddrs(1, parsed.Rules(nil), parsed.VIPAddresses, nil)
			require.NoError(t, err)
			for _, a := range addrs {
				k := flow.KeyFrom(0, flow.ProtoUDP, netip.AddrPortFrom(a, 1), netip.AddrPortFrom(a, 1))
				assert.True(t, snap.HasVIPAddr(&k.Src, k.Family), "the client filters drop %v", a)
			}
			assert.Equal(t, localRules(doc, want), localRules(parsed, want), "each VIP's rule for the host's DIPs")
		})
	}
	_, err = fleet.HostView(doc, "198.19.0.1")
	assert.ErrorIs(t, err, fleet.ErrNoView, "a host is named by its name")
	_, err = fleet.HostView(doc, "h9")
	assert.ErrorIs(t, err, fleet.ErrNoView)
}

// localRules is doc's rules with only the backends that are plan's DIPs,
// and without their table size (sized by the pool), without the rules
// left with no backend.
func localRules(doc *control.Document, plan *hostagent.Plan) []flow.Rule {
	type vniAddr struct {
		vni  uint32
		addr netip.Addr
	}
	local := map[vniAddr]bool{}
	for _, d := range plan.DIPs {
		local[vniAddr{d.VNI, d.Addr}] = true
	}
	rules := doc.Rules(nil)
	for i := range rules {
		r := &rules[i]
		var bs []flow.Backend
		for _, b := range r.Backends {
			if local[vniAddr{r.VIP.VNI, b.Addr}] {
				bs = append(bs, b)
			}
		}
		r.Backends, r.TableSize = bs, 0
	}
	return slices.DeleteFunc(rules, func(r flow.Rule) bool { return len(r.Backends) == 0 })
}
