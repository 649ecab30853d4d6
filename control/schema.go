package control

import (
	"fmt"
	"math"
	"net/netip"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/xdplb/xdplb/flow"
)

// Known keys of each mapping, in the order Marshal writes them.
var (
	documentKeys = []string{"version", "written", "hash_seed", "maglev_min_table_size", "node", "infra_prefixes", "mux_prefixes", "bgp", "nodes", "vips", "inbound_nat", "outbound", "hosts", "vip_addresses", "checksum"}
	nodeKeys     = []string{"name"}
	nodeCfgKeys  = []string{"bgp"}
	nodeBGPKeys  = []string{"asn", "router_id", "listen_addresses", "next_hop", "next_hop6", "peers"}
	bgpKeys      = []string{"asn", "router_id", "listen_port", "listen_addresses", "hold_time", "withdraw_grace", "next_hop", "next_hop6", "peers"}
	peerKeys     = []string{"address", "asn", "port", "passive", "password", "ttl_security"}
	vipKeys      = []string{"name", "address", "protocol", "port", "vni", "distribution", "table_size", "probe", "backends"}
	probeKeys    = []string{"type", "port", "path", "method", "host", "expect_status", "interval", "timeout", "rise", "fall"}
	backendKeys  = []string{"name", "address", "port", "mac", "host", "weight", "state"}
	hostKeys     = []string{"name", "address", "vxlan_port", "vms"}
	vmKeys       = []string{"vni", "address", "mac", "interface"}
)

// Allowed values, as messages say them.
const (
	wantPort    = "1..65535"
	wantPort0   = "0..65535"
	wantVIPPort = `1..65535, or 0 or "all" for every port`
	wantBEPort  = "0..65535; 0 means the packet's destination port"
	wantVNI     = "0..16777215"
	wantASN     = "1..4294967295"
	wantAddr    = "an IPv4 or IPv6 address"
	// wantPassword and wantTTLSecurity describe a peer's password and
	// ttl_security.
	wantPassword    = "1..80 bytes, no NUL (the kernel's TCP-MD5 key limit)"
	wantTTLSecurity = "0..254: 0 = off, else the peer's distance in hops (1 = directly connected; GTSM, RFC 5082)"
	addrWords       = "IPv4 or IPv6 address"
	nameMax         = 63
	longNameMax     = 253
)

// site is where a value was first seen, for "first at" in messages.
type site struct {
	path string
	node *yaml.Node
}

func (s site) String() string {
	if s.node == nil {
		return s.path
	}
	return fmt.Sprintf("%s, line %d", s.path, s.node.Line)
}

// at returns n, or else fallback: where to point a message about a value
// that may have been defaulted.
func at(n, fallback *yaml.Node) *yaml.Node {
	if n != nil {
		return n
	}
	return fallback
}

// vipMeta and backendMeta remember node positions and which fields decoded
// cleanly, for the checks across VIPs and hosts.
type vipMeta struct {
	path     string
	node     *yaml.Node // the mapping
	nameN    *yaml.Node
	addrN    *yaml.Node
	nameOK   bool // Name decoded
	keyOK    bool // Address, Protocol, Port, VNI decoded
	backends []backendMeta
}

type backendMeta struct {
	path               string
	item               *yaml.Node // the backend's mapping
	node, mac, host    *yaml.Node // node: the address if given, else the mapping
	addrOK, macOK, hOK bool
}

func (d *decoder) document(root *yaml.Node) *Document {
	n := root
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			d.errorf(n, "", "empty document (want at least \"version: 1\")")
			return nil
		}
		n = n.Content[0]
	}
	if r := d.deref(n); isNull(r) {
		d.errorf(n, "", "empty document (want at least \"version: 1\")")
		return nil
	}
	o := d.object(n, "", documentKeys)
	if o == nil {
		return nil
	}
	if k := o.key("checksum"); k != nil && k.Line != d.sumLine {
		d.errorf(k, "checksum", "a checksum must be the document's first key, on a line of its own, before any other key (as control.Seal writes it)")
	}
	doc := &Document{}
	if v := d.get(o, "version"); v != nil {
		doc.Version, _ = d.uint(v, "version", 1, math.MaxUint64, ">= 1; bump it on every change")
	} else {
		d.missing(o, "version", "an integer >= 1; bump it on every change")
	}
	if v := d.get(o, "written"); v != nil {
		doc.Written, _ = d.time(v, "written")
	}
	if v := d.get(o, "hash_seed"); v != nil {
		doc.HashSeed, _ = d.uint(v, "hash_seed", 0, math.MaxUint64, "0..2^64-1, decimal or 0x hex")
	}
	if v := d.get(o, "maglev_min_table_size"); v != nil {
		x, _ := d.uint(v, "maglev_min_table_size", 0, flow.MaglevMaxSize, "0..16777213; rounded up to the sizes table_size defaults to")
		doc.MaglevMinTableSize = uint32(x)
	}
	fleet := o.val("nodes") != nil
	if no := d.object(o.val("node"), "node", nodeKeys); no != nil {
		if v := d.get(no, "name"); v != nil {
			doc.Node.Name, _ = d.name(v, "node.name", longNameMax, false)
			if fleet {
				d.errorf(v, "node.name", "node.name says which node a per-node file is for, but this document has a nodes section and serves every node: drop node.name and start each node with its name (-node)")
			}
		}
	}
	doc.InfraPrefixes = d.prefixes(o.val("infra_prefixes"), "infra_prefixes")
	doc.MuxPrefixes = d.prefixes(o.val("mux_prefixes"), "mux_prefixes")
	if bo := d.object(o.val("bgp"), "bgp", bgpKeys); bo != nil {
		doc.BGP = d.bgp(bo, fleet)
	}
	doc.Nodes = d.nodes(o.val("nodes"), doc.BGP)
	var metas []vipMeta
	for i, vn := range d.list(o.val("vips"), "vips", "VIPs") {
		path := index("vips", i)
		vo := d.object(vn, path, vipKeys)
		if vo == nil {
			if d.over {
				break
			}
			if r := d.deref(vn); isNull(r) {
				d.errorf(vn, path, "empty VIP (want a mapping of %s)", keyList(vipKeys))
			}
			continue
		}
		v, m := d.vip(vo)
		doc.VIPs = append(doc.VIPs, v)
		metas = append(metas, m)
	}
	hosts := d.hosts(o.val("hosts"))
	doc.Hosts = hosts.list
	var natVIPs []VIP
	var natMetas []vipMeta
	doc.InboundNAT, natVIPs, natMetas = d.inboundNAT(o.val("inbound_nat"), hosts)
	doc.VIPs, metas = append(doc.VIPs, natVIPs...), append(metas, natMetas...)
	d.checkVIPs(doc, metas)
	doc.Outbound = d.outbound(o.val("outbound"), doc, hosts)
	d.checkDIPs(doc, metas, hosts)
	doc.VIPAddresses = d.vipAddresses(o.val("vip_addresses"))
	return doc
}

// vipAddresses decodes vip_addresses.
func (d *decoder) vipAddresses(n *yaml.Node) []netip.Addr {
	return d.addrs(n, "vip_addresses", "a VIP's address, IPv4 or IPv6")
}

// addrs decodes a list of unicast addresses without a zone, each listed
// once.
func (d *decoder) addrs(n *yaml.Node, path, want string) []netip.Addr {
	return listOnce(d, n, path, "addresses", "", func(an *yaml.Node, p string) (netip.Addr, bool) {
		return d.addr(an, p, want, 0, false)
	})
}

// listOnce decodes the list n of what (its items decoded by decode, which
// reports their problems), refusing an item listed twice ("<noun><item>
// is listed twice").
func listOnce[T comparable](d *decoder, n *yaml.Node, path, what, noun string, decode func(n *yaml.Node, path string) (T, bool)) []T {
	var out []T
	seen := map[T]site{}
	for i, in := range d.list(n, path, what) {
		p := index(path, i)
		if in = d.deref(in); in == nil {
			break
		}
		x, ok := decode(in, p)
		if !ok {
			continue
		}
		if first, dup := seen[x]; dup {
			d.errorf(in, p, "%s%v is listed twice (first at %v)", noun, x, first)
			continue
		}
		seen[x] = site{p, in}
		out = append(out, x)
	}
	return out
}

func (d *decoder) time(n *yaml.Node, path string) (time.Time, bool) {
	const want = "an RFC 3339 time, e.g. 2026-11-30T10:00:00Z"
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!timestamp" && n.ShortTag() != "!!str") {
		d.errorf(n, path, "want %s, got %s", want, describe(n))
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, n.Value)
	if err != nil {
		d.errorf(n, path, "%q is not an RFC 3339 time (want %s)", n.Value, want)
		return time.Time{}, false
	}
	return t.UTC(), true
}

func (d *decoder) prefixes(n *yaml.Node, path string) []netip.Prefix {
	const want = "a prefix like 198.18.0.0/24 or 2001:db8::/64"
	return listOnce(d, n, path, "prefixes", "prefix ", func(pn *yaml.Node, p string) (netip.Prefix, bool) {
		s, ok := d.str(pn, p, want)
		if !ok {
			return netip.Prefix{}, false
		}
		pfx, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			if a, aerr := netip.ParseAddr(s); aerr == nil && a.Zone() == "" {
				d.errorf(pn, p, "%q is an address (want a prefix: %v?)", s, netip.PrefixFrom(a, a.BitLen()))
			} else {
				d.errorf(pn, p, "%q is not a prefix (want %s)", s, want)
			}
		case pfx.Addr().Is4In6():
			d.errorf(pn, p, "%q is an IPv4-mapped IPv6 prefix (write it in IPv4 form)", s)
		case pfx.Masked() != pfx:
			d.errorf(pn, p, "%q has bits set past the prefix length (did you mean %v?)", s, pfx.Masked())
		default:
			return pfx, true
		}
		return netip.Prefix{}, false
	})
}
