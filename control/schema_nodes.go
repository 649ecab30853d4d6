package control

import (
	"net/netip"

	"go.yaml.in/yaml/v3"
)

// nodes decodes the nodes section: a mapping from node name to what that
// node sets for itself. fleetBGP is the top-level bgp section (nil when
// there is none); every node's merged BGP must be complete.
func (d *decoder) nodes(n *yaml.Node, fleetBGP *BGP) []NodeConfig {
	n = d.deref(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "nodes", "want a mapping from node name to its settings (e.g. mux-1: {bgp: {router_id: 198.18.0.10}}), got %s", describe(n))
		return nil
	}
	var out []NodeConfig
	seen := map[string]int{}
	routerIDs := map[netip.Addr]string{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.deref(n.Content[i]), n.Content[i+1]
		if k == nil || k.Kind != yaml.ScalarNode || k.ShortTag() == "!!merge" {
			d.errorf(n.Content[i], "nodes", "a node name must be a plain string, got %s", describe(n.Content[i]))
			continue
		}
		name, ok := d.name(k, "nodes", longNameMax, false)
		if !ok {
			continue
		}
		path := "nodes." + name
		if first, dup := seen[name]; dup {
			d.errorf(k, path, "node %q is listed twice (first at line %d)", name, first)
			continue
		}
		seen[name] = k.Line
		nc := NodeConfig{Name: name}
		no := d.object(v, path, nodeCfgKeys)
		if no != nil {
			if bo := d.object(no.val("bgp"), path+".bgp", nodeBGPKeys); bo != nil {
				b := &BGP{}
				if v := d.get(bo, "asn"); v != nil {
					b.ASN, _ = d.asn(v, path+".bgp.asn")
				}
				if v := d.get(bo, "router_id"); v != nil {
					if b.RouterID, ok = d.addr(v, path+".bgp.router_id", "an IPv4 address", 4, false); ok {
						if other, dup := routerIDs[b.RouterID]; dup {
							d.errorf(v, path+".bgp.router_id", "%v is node %s's router id too (a router id identifies one BGP speaker)", b.RouterID, other)
						}
						routerIDs[b.RouterID] = name
					}
				}
				d.bgpNode(bo, path+".bgp", b)
				nc.BGP = b
				if fleetBGP == nil {
					d.errorf(no.key("bgp"), path+".bgp", "a node's bgp completes the document's bgp section, and there is none: add bgp (asn, and what every node shares)")
				} else {
					m := mergeBGP(fleetBGP, b)
					if m.ASN == 0 {
						d.errorf(no.key("bgp"), path+".bgp", "no AS number: set bgp.asn for the fleet or %s.bgp.asn for this node", path)
					}
					if !m.RouterID.IsValid() {
						d.errorf(no.key("bgp"), path+".bgp", "no router_id (want this node's IPv4 router id, usually its own address)")
					}
					peers := map[netip.Addr]bool{}
					for _, p := range m.Peers {
						if peers[p.Address] {
							d.errorf(no.key("bgp"), path+".bgp.peers", "peer %v is in the fleet's bgp.peers too (a node's peers are added to the fleet's)", p.Address)
						}
						peers[p.Address] = true
					}
					if !m.NextHop6.IsValid() {
						for _, p := range m.Peers {
							if p.Address.Zone() != "" {
								d.errorf(no.key("bgp"), path+".bgp", "peer %v is link-local, which needs a next_hop6 (a global IPv6 address of this Mux on that link): set bgp.next_hop6 or %s.bgp.next_hop6; %s", p.Address, path, whyNextHop6)
							}
						}
					}
					if len(m.ListenAddresses) > 0 && m.ListenPort == 0 {
						d.errorf(no.key("bgp"), path+".bgp.listen_addresses", "set, but bgp.listen_port is 0 (do not listen): drop one of them")
					}
				}
			}
		}
		out = append(out, nc)
	}
	if len(out) == 0 {
		d.errorf(n, "nodes", "empty (want at least one node, or no nodes section)")
	}
	return out
}

// mergeBGP is a node's BGP: the fleet's, with what the node sets. The
// node's ASN, router id, listen addresses and next hops replace the
// fleet's; its peers are added to the fleet's.
func mergeBGP(fleet, node *BGP) *BGP {
	m := *fleet
	if node == nil {
		return &m
	}
	if node.ASN != 0 {
		m.ASN = node.ASN
	}
	if node.RouterID.IsValid() {
		m.RouterID = node.RouterID
	}
	if len(node.ListenAddresses) > 0 {
		m.ListenAddresses = node.ListenAddresses
	}
	if node.NextHop.IsValid() {
		m.NextHop = node.NextHop
	}
	if node.NextHop6.IsValid() {
		m.NextHop6 = node.NextHop6
	}
	m.Peers = append(append([]Peer(nil), fleet.Peers...), node.Peers...)
	return &m
}
