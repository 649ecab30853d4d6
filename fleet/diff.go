package fleet

import (
	"fmt"
	"reflect"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
)

// Diff says, one line each, what applying next over cur changes: the
// version, the fleet-wide settings, each VIP and backend added, removed
// or changed (and in what), each host and VM, each node's own settings.
// cur may be nil (nothing applied yet).
func Diff(cur, next *control.Document) []string {
	var out []string
	say := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if cur == nil {
		cur = &control.Document{}
	}
	say("version %d -> %d", cur.Version, next.Version)
	if cur.HashSeed != next.HashSeed {
		say("~ hash_seed %#x -> %#x (moves every flow without a connection entry)", cur.HashSeed, next.HashSeed)
	}
	if cur.MaglevMinTableSize != next.MaglevMinTableSize {
		say("~ maglev_min_table_size %d -> %d", cur.MaglevMinTableSize, next.MaglevMinTableSize)
	}
	if !reflect.DeepEqual(cur.InfraPrefixes, next.InfraPrefixes) {
		say("~ infra_prefixes %v -> %v", cur.InfraPrefixes, next.InfraPrefixes)
	}
	if !reflect.DeepEqual(cur.MuxPrefixes, next.MuxPrefixes) {
		say("~ mux_prefixes %v -> %v", cur.MuxPrefixes, next.MuxPrefixes)
	}
	if !reflect.DeepEqual(cur.BGP, next.BGP) {
		say("~ bgp (every Mux)")
	}
	// Nodes.
	oldNodes := map[string]control.NodeConfig{}
	for _, n := range cur.Nodes {
		oldNodes[n.Name] = n
	}
	for _, n := range next.Nodes {
		o, ok := oldNodes[n.Name]
		switch {
		case !ok:
			say("+ node %s", n.Name)
		case !reflect.DeepEqual(o, n):
			say("~ node %s: bgp", n.Name)
		}
		delete(oldNodes, n.Name)
	}
	for _, n := range cur.Nodes {
		if _, gone := oldNodes[n.Name]; gone {
			say("- node %s", n.Name)
		}
	}
	// VIPs and backends.
	oldVIPs := map[string]*control.VIP{}
	for i := range cur.VIPs {
		oldVIPs[cur.VIPs[i].Name] = &cur.VIPs[i]
	}
	for i := range next.VIPs {
		v := &next.VIPs[i]
		o, ok := oldVIPs[v.Name]
		delete(oldVIPs, v.Name)
		if !ok {
			say("+ vip %s %s, %d backends", v.Name, describeVIP(v), len(v.Backends))
			continue
		}
		if describeVIP(o) != describeVIP(v) {
			say("~ vip %s: %s -> %s", v.Name, describeVIP(o), describeVIP(v))
		}
		if o.Distribution != v.Distribution || o.TableSize != v.TableSize {
			say("~ vip %s: distribution or table size", v.Name)
		}
		if !reflect.DeepEqual(o.Probe, v.Probe) {
			say("~ vip %s: probe", v.Name)
		}
		oldBEs := map[string]control.Backend{}
		for _, b := range o.Backends {
			oldBEs[b.Name] = b
		}
		for _, b := range v.Backends {
			ob, ok := oldBEs[b.Name]
			delete(oldBEs, b.Name)
			switch {
			case !ok:
				say("+ vip %s backend %s %v:%d on %v", v.Name, b.Name, b.Address, b.Port, b.Host)
			case ob.State != b.State:
				say("~ vip %s backend %s: %v -> %v", v.Name, b.Name, ob.State, b.State)
			case ob.Weight != b.Weight:
				say("~ vip %s backend %s: weight %d -> %d", v.Name, b.Name, ob.Weight, b.Weight)
			case ob != b:
				say("~ vip %s backend %s: %v:%d on %v -> %v:%d on %v", v.Name, b.Name, ob.Address, ob.Port, ob.Host, b.Address, b.Port, b.Host)
			}
		}
		for _, b := range o.Backends {
			if _, gone := oldBEs[b.Name]; gone {
				say("- vip %s backend %s", v.Name, b.Name)
			}
		}
	}
	for i := range cur.VIPs {
		if _, gone := oldVIPs[cur.VIPs[i].Name]; gone {
			say("- vip %s", cur.VIPs[i].Name)
		}
	}
	// Hosts and VMs.
	oldHosts := map[string]*control.Host{}
	for i := range cur.Hosts {
		oldHosts[cur.Hosts[i].Name] = &cur.Hosts[i]
	}
	for i := range next.Hosts {
		h := &next.Hosts[i]
		o, ok := oldHosts[h.Name]
		delete(oldHosts, h.Name)
		switch {
		case !ok:
			say("+ host %s %v, %d VMs", h.Name, h.Address, len(h.VMs))
		case !reflect.DeepEqual(o, h):
			say("~ host %s: %d VMs -> %d", h.Name, len(o.VMs), len(h.VMs))
		}
	}
	for i := range cur.Hosts {
		if _, gone := oldHosts[cur.Hosts[i].Name]; gone {
			say("- host %s", cur.Hosts[i].Name)
		}
	}
	return out
}

func describeVIP(v *control.VIP) string {
	proto := "tcp"
	if v.Protocol == flow.ProtoUDP {
		proto = "udp"
	}
	return fmt.Sprintf("%v %s/%d vni %d", v.Address, proto, v.Port, v.VNI)
}
