package control

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// Known keys of each mapping, in the order Marshal writes them.
var (
	documentKeys = []string{"version", "written", "hash_seed", "maglev_min_table_size", "node", "infra_prefixes", "mux_prefixes", "bgp", "vips", "hosts", "checksum"}
	nodeKeys     = []string{"name"}
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
	if k := o.keys["checksum"]; k != nil && k.Line != d.sumLine {
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
	if no := d.object(o.vals["node"], "node", nodeKeys); no != nil {
		if v := d.get(no, "name"); v != nil {
			doc.Node.Name, _ = d.name(v, "node.name", longNameMax, false)
		}
	}
	doc.InfraPrefixes = d.prefixes(o.vals["infra_prefixes"], "infra_prefixes")
	doc.MuxPrefixes = d.prefixes(o.vals["mux_prefixes"], "mux_prefixes")
	if bo := d.object(o.vals["bgp"], "bgp", bgpKeys); bo != nil {
		doc.BGP = d.bgp(bo)
	}
	var metas []vipMeta
	for i, vn := range d.list(o.vals["vips"], "vips", "VIPs") {
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
	hosts := d.hosts(o.vals["hosts"])
	doc.Hosts = hosts.list
	d.checkVIPs(doc, metas)
	d.checkDIPs(doc, metas, hosts)
	return doc
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
	var ps []netip.Prefix
	seen := map[netip.Prefix]site{}
	for i, pn := range d.list(n, path, "prefixes") {
		p := index(path, i)
		if pn = d.deref(pn); pn == nil {
			break
		}
		s, ok := d.str(pn, p, want)
		if !ok {
			continue
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
			if first, dup := seen[pfx]; dup {
				d.errorf(pn, p, "prefix %v is listed twice (first at %v)", pfx, first)
				continue
			}
			seen[pfx] = site{p, pn}
			ps = append(ps, pfx)
		}
	}
	return ps
}

func (d *decoder) bgp(o *object) *BGP {
	b := &BGP{ListenPort: DefaultListenPort, HoldTime: DefaultHoldTime, WithdrawGrace: DefaultWithdrawGrace}
	if v := d.get(o, "asn"); v != nil {
		b.ASN, _ = d.asn(v, "bgp.asn")
	} else {
		d.missing(o, "asn", "the local AS number, "+wantASN)
	}
	if v := d.get(o, "router_id"); v != nil {
		b.RouterID, _ = d.addr(v, "bgp.router_id", "an IPv4 address", 4, false)
	} else {
		d.missing(o, "router_id", "an IPv4 address, usually the node's own")
	}
	if v := d.get(o, "listen_port"); v != nil {
		p, _ := d.uint(v, "bgp.listen_port", 0, math.MaxUint16, "0..65535; 0 means do not listen")
		b.ListenPort = int32(p)
	}
	if v := d.get(o, "listen_addresses"); v != nil {
		seen := map[netip.Addr]site{}
		for i, an := range d.list(v, "bgp.listen_addresses", "addresses") {
			path := index("bgp.listen_addresses", i)
			a, ok := d.addr(an, path, "a local "+addrWords, 0, false)
			if !ok {
				continue
			}
			if first, dup := seen[a]; dup {
				d.errorf(an, path, "%v is listed twice (first at %v)", a, first)
				continue
			}
			seen[a] = site{path, an}
			b.ListenAddresses = append(b.ListenAddresses, a)
		}
		if len(b.ListenAddresses) > 0 && b.ListenPort == 0 {
			d.errorf(v, "bgp.listen_addresses", "set, but listen_port is 0 (do not listen): drop one of them")
		}
	}
	if v := d.get(o, "hold_time"); v != nil {
		if t, ok := d.duration(v, "bgp.hold_time", 0, math.MaxUint16*time.Second); ok {
			switch {
			case t%time.Second != 0:
				d.errorf(v, "bgp.hold_time", "%s is not a whole number of seconds (BGP carries seconds)", v.Value)
			case t > 0 && t < 3*time.Second:
				d.errorf(v, "bgp.hold_time", "%s is too short (want 0, meaning no keepalives, or at least 3s: RFC 4271)", v.Value)
			default:
				b.HoldTime = t
			}
		}
	}
	if v := d.get(o, "withdraw_grace"); v != nil {
		b.WithdrawGrace, _ = d.duration(v, "bgp.withdraw_grace", 0, time.Hour)
	}
	if v := d.get(o, "next_hop"); v != nil {
		b.NextHop, _ = d.addr(v, "bgp.next_hop", wantAddr, 0, false)
		if b.NextHop.IsValid() && !b.NextHop.Is4() {
			d.errorf(v, "bgp.next_hop", "%s is not an IPv4 address (next_hop is for IPv4 VIPs; use next_hop6 for IPv6 ones)", b.NextHop)
		}
	}
	if v := d.get(o, "next_hop6"); v != nil {
		b.NextHop6, _ = d.addr(v, "bgp.next_hop6", wantAddr, 0, false)
		if b.NextHop6.IsValid() && !b.NextHop6.Is6() {
			d.errorf(v, "bgp.next_hop6", "%s is not an IPv6 address (next_hop6 is the next hop of IPv6 VIPs)", b.NextHop6)
		}
	}
	seen := map[netip.Addr]site{}
	for i, pn := range d.list(o.vals["peers"], "bgp.peers", "peers") {
		path := index("bgp.peers", i)
		po := d.object(pn, path, peerKeys)
		if po == nil {
			if r := d.deref(pn); isNull(r) && !d.over {
				d.errorf(pn, path, "empty peer (want a mapping of %s)", keyList(peerKeys))
			}
			continue
		}
		p := Peer{Port: DefaultListenPort}
		if v := d.get(po, "address"); v != nil {
			if a, ok := d.addr(v, path+".address", wantAddr, 0, true); ok {
				p.Address = a
				if first, dup := seen[a]; dup {
					d.errorf(v, path+".address", "peer %v is listed twice (first at %v)", a, first)
				}
				seen[a] = site{path, v}
			}
		} else {
			d.missing(po, "address", "the peer's "+addrWords)
		}
		if v := d.get(po, "asn"); v != nil {
			p.ASN, _ = d.asn(v, path+".asn")
		} else {
			d.missing(po, "asn", "the peer's AS number, "+wantASN)
		}
		if v := d.get(po, "port"); v != nil {
			pp, _ := d.uint(v, path+".port", 1, math.MaxUint16, wantPort)
			p.Port = uint16(pp)
		}
		if v := d.get(po, "passive"); v != nil {
			p.Passive, _ = d.bool(v, path+".passive")
		}
		if v := d.get(po, "password"); v != nil {
			if pw, ok := d.str(v, path+".password", "the TCP-MD5 password, "+wantPassword); ok {
				switch {
				case pw == "" || len(pw) > MaxPasswordLen:
					d.errorf(v, path+".password", "%d bytes (want %s)", len(pw), wantPassword)
				case strings.ContainsRune(pw, 0):
					d.errorf(v, path+".password", "contains a NUL byte (want %s)", wantPassword)
				default:
					p.Password = pw
				}
			}
		}
		if v := d.get(po, "ttl_security"); v != nil {
			h, _ := d.uint(v, path+".ttl_security", 0, MaxTTLSecurityHops, wantTTLSecurity)
			p.TTLSecurity = uint8(h)
		}
		b.Peers = append(b.Peers, p)
	}
	return b
}

func (d *decoder) asn(n *yaml.Node, path string) (uint32, bool) {
	v, ok := d.uint(n, path, 1, math.MaxUint32, wantASN)
	if ok && v == 23456 {
		d.errorf(n, path, "23456 is AS_TRANS, reserved for 2-byte-only speakers (RFC 6793); use the real AS number")
		return 0, false
	}
	return uint32(v), ok
}

func (d *decoder) vip(o *object) (VIP, vipMeta) {
	path := o.path
	v := VIP{}
	m := vipMeta{path: path, node: o.n}
	if n := d.get(o, "name"); n != nil {
		m.nameN = n
		v.Name, m.nameOK = d.name(n, path+".name", nameMax, true)
	} else {
		d.missing(o, "name", "a unique name, e.g. web")
	}
	addrOK, protoOK, portOK, vniOK := false, false, true, true
	if n := d.get(o, "address"); n != nil {
		m.addrN = n
		v.Address, addrOK = d.addr(n, path+".address", wantAddr, 0, false)
	} else {
		d.missing(o, "address", "the VIP's "+addrWords)
	}
	if n := d.get(o, "protocol"); n != nil {
		if s, ok := d.str(n, path+".protocol", "tcp or udp"); ok {
			switch s {
			case "tcp":
				v.Protocol, protoOK = flow.ProtoTCP, true
			case "udp":
				v.Protocol, protoOK = flow.ProtoUDP, true
			default:
				d.errorf(n, path+".protocol", "%q is not a protocol (want tcp or udp)", s)
			}
		}
	} else {
		d.missing(o, "protocol", "tcp or udp")
	}
	if n := d.get(o, "port"); n != nil {
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && n.Value == "all" {
			v.Port = 0
		} else {
			p, ok := d.uint(n, path+".port", 0, math.MaxUint16, wantVIPPort)
			v.Port, portOK = uint16(p), ok
		}
	} else {
		d.missing(o, "port", wantVIPPort)
		portOK = false
	}
	if n := d.get(o, "vni"); n != nil {
		x, ok := d.uint(n, path+".vni", 0, MaxVNI, wantVNI)
		v.VNI, vniOK = uint32(x), ok
	}
	m.keyOK = addrOK && protoOK && portOK && vniOK
	if n := d.get(o, "distribution"); n != nil {
		if s, ok := d.str(n, path+".distribution", "5-tuple, 3-tuple or 2-tuple"); ok {
			mode, err := flow.ParseTupleMode(s)
			if err != nil {
				d.errorf(n, path+".distribution", "%q is not a distribution (want 5-tuple, 3-tuple or 2-tuple)", s)
			}
			v.Distribution = mode
		}
	}
	sizeN := d.get(o, "table_size")
	if sizeN != nil {
		const want = "a prime up to 16777213, at least the number of backends; 0 means sized by the pool"
		if x, ok := d.uint(sizeN, path+".table_size", 0, flow.MaglevMaxSize, want); ok {
			if x != 0 && !isPrime(x) {
				lo, hi := primesAround(x)
				if lo == 0 {
					d.errorf(sizeN, path+".table_size", "%d is not prime (Maglev needs a prime size; the smallest is %d)", x, hi)
				} else {
					d.errorf(sizeN, path+".table_size", "%d is not prime (Maglev needs a prime size; the nearest are %d and %d)", x, lo, hi)
				}
			} else {
				v.TableSize = uint32(x)
			}
		}
	}
	if n := d.get(o, "probe"); n != nil {
		v.Probe = d.probe(n, path+".probe")
	}
	names := map[string]site{}
	dips := map[netip.AddrPort]site{}
	for j, bn := range d.list(o.vals["backends"], path+".backends", "backends") {
		bp := index(path+".backends", j)
		bo := d.object(bn, bp, backendKeys)
		if bo == nil {
			if d.over {
				break
			}
			if r := d.deref(bn); isNull(r) {
				d.errorf(bn, bp, "empty backend (want a mapping of %s)", keyList(backendKeys))
			}
			continue
		}
		b, bm, nameN := d.backend(bo)
		if addrOK && bm.addrOK && b.Address.Is4() != v.Address.Is4() {
			d.errorf(bm.node, bp+".address", "%v is %s but the VIP %v is %s: a DIP must have the VIP's family, since DSR NAT rewrites the destination in place (the host address may be of either family)",
				b.Address, family(b.Address), v.Address, family(v.Address))
			bm.addrOK = false
		}
		if b.Name != "" {
			if first, dup := names[b.Name]; dup {
				d.errorf(at(nameN, bo.n), bp+".name", "backend name %q is used twice in this VIP (first at %v)", b.Name, first)
			} else {
				names[b.Name] = site{bp, bo.n}
			}
		}
		if bm.addrOK {
			ap := netip.AddrPortFrom(b.Address, b.Port)
			if first, dup := dips[ap]; dup {
				d.errorf(bm.node, bp, "backend %v is listed twice in this VIP (first at %v)", ap, first)
			} else {
				dips[ap] = site{bp, bo.n}
			}
		}
		v.Backends = append(v.Backends, b)
		m.backends = append(m.backends, bm)
	}
	size := uint64(v.TableSize)
	if size == 0 {
		size = uint64(flow.MaglevAutoSize(len(v.Backends), 0))
	}
	if uint64(len(v.Backends)) > size {
		d.errorf(at(sizeN, o.n), path+".table_size", "%d backends do not fit a Maglev table of %d slots (want a larger prime)", len(v.Backends), size)
	}
	if v.Probe != nil && v.Probe.Port == 0 && portOK && v.Port == 0 {
		for j := range v.Backends {
			if v.Backends[j].Port == 0 {
				d.errorf(at(o.vals["probe"], o.n), path+".probe.port", "missing: the VIP serves every port and backend %q has port 0, so there is no port to probe (want %s)", v.Backends[j].Name, wantPort)
				break
			}
		}
	}
	return v, m
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

func (d *decoder) backend(o *object) (Backend, backendMeta, *yaml.Node) {
	path := o.path
	b := Backend{Weight: DefaultWeight}
	m := backendMeta{path: path, item: o.n, node: o.n}
	if n := d.get(o, "address"); n != nil {
		m.node = n
		b.Address, m.addrOK = d.addr(n, path+".address", "the DIP's "+addrWords, 0, false)
	} else {
		d.missing(o, "address", "the DIP's "+addrWords)
	}
	portOK := true
	if n := d.get(o, "port"); n != nil {
		p, ok := d.uint(n, path+".port", 0, math.MaxUint16, wantBEPort)
		b.Port, portOK = uint16(p), ok
	}
	m.addrOK = m.addrOK && portOK
	nameN := d.get(o, "name")
	if nameN != nil {
		b.Name, _ = d.name(nameN, path+".name", longNameMax, false)
	} else if m.addrOK {
		b.Name = netip.AddrPortFrom(b.Address, b.Port).String()
	}
	if n := d.get(o, "mac"); n != nil {
		m.mac = n
		b.MAC, m.macOK = d.mac(n, path+".mac")
	} else {
		d.missing(o, "mac", `the DIP's MAC address, e.g. "02:00:00:00:01:01"`)
	}
	if n := d.get(o, "host"); n != nil {
		m.host = n
		b.Host, m.hOK = d.addr(n, path+".host", "the physical address of the DIP's host (VXLAN destination)", 0, false)
	} else {
		d.missing(o, "host", "the physical address of the DIP's host (VXLAN destination)")
	}
	if n := d.get(o, "weight"); n != nil {
		w, _ := d.uint(n, path+".weight", 0, MaxWeight, "0..65535; 0 drains")
		b.Weight = uint32(w)
	}
	if n := d.get(o, "state"); n != nil {
		if s, ok := d.str(n, path+".state", "active or draining"); ok {
			switch s {
			case "active":
				b.State = flow.BackendActive
			case "draining":
				b.State = flow.BackendDraining
			case "down":
				d.errorf(n, path+".state", `"down" is for health checks to decide (want active or draining; draining takes the backend out of new flows)`)
			default:
				d.errorf(n, path+".state", "%q is not a state (want active or draining)", s)
			}
		}
	}
	return b, m, nameN
}

func (d *decoder) probe(n *yaml.Node, path string) *health.Spec {
	o := d.object(n, path, probeKeys)
	if o == nil {
		return nil
	}
	var s health.Spec
	before := len(d.errs) + d.more
	if n := d.get(o, "type"); n != nil {
		if t, ok := d.str(n, path+".type", "tcp or http"); ok {
			pt, err := health.ParseProbeType(t)
			if err != nil {
				d.errorf(n, path+".type", "%q is not a probe type (want tcp or http)", t)
			}
			s.Type = pt
		}
	} else {
		d.missing(o, "type", "tcp or http")
	}
	if n := d.get(o, "port"); n != nil {
		p, _ := d.uint(n, path+".port", 0, math.MaxUint16, "1..65535; 0 or absent means the backend's port")
		s.Port = uint16(p)
	}
	if n := d.get(o, "path"); n != nil {
		s.Path, _ = d.str(n, path+".path", "an HTTP path starting with /, e.g. /healthz")
	}
	if n := d.get(o, "method"); n != nil {
		s.Method, _ = d.str(n, path+".method", "an HTTP method such as GET or HEAD")
	}
	if n := d.get(o, "host"); n != nil {
		s.Host, _ = d.str(n, path+".host", "an HTTP Host header value")
	}
	if n := d.get(o, "expect_status"); n != nil {
		st, _ := d.uint(n, path+".expect_status", 1, 999, "an HTTP status code such as 200")
		s.ExpectStatus = int(st)
	}
	// Explicit zeros are refused: a zero field means "default" to
	// WithDefaults, which would hide the mistake.
	if n := d.get(o, "interval"); n != nil {
		s.Interval, _ = d.duration(n, path+".interval", time.Nanosecond, time.Hour)
	}
	if n := d.get(o, "timeout"); n != nil {
		s.Timeout, _ = d.duration(n, path+".timeout", time.Nanosecond, time.Hour)
	}
	thresholds := fmt.Sprintf("1..%d", health.MaxThreshold)
	if n := d.get(o, "rise"); n != nil {
		r, _ := d.uint(n, path+".rise", 1, health.MaxThreshold, thresholds+" consecutive successes")
		s.Rise = int(r)
	}
	if n := d.get(o, "fall"); n != nil {
		f, _ := d.uint(n, path+".fall", 1, health.MaxThreshold, thresholds+" consecutive failures")
		s.Fall = int(f)
	}
	if len(d.errs)+d.more != before {
		return &s
	}
	s = s.WithDefaults()
	// health.Spec.Validate owns the rules; its errors name the field by
	// its key, which places them in the file.
	var errs []error
	if err := s.Validate(); err != nil {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		} else {
			errs = []error{err}
		}
	}
	prefix := health.ErrInvalidSpec.Error() + ": "
	for _, e := range errs {
		msg := strings.TrimPrefix(e.Error(), prefix)
		field, _, _ := strings.Cut(msg, " ")
		if slices.Contains(probeKeys, field) {
			d.errorf(at(d.get(o, field), o.n), path+"."+field, "%s", msg)
		} else {
			d.errorf(o.n, path, "%s", msg)
		}
	}
	return &s
}

// hostSet is the decoded hosts section with what the cross checks need.
type hostSet struct {
	list []Host
	// vms maps (VNI, address) to the host index and VM, for backends.
	vms map[vniAddr]vmSite
}

type vniAddr struct {
	vni  uint32
	addr netip.Addr
}

type vniMAC struct {
	vni uint32
	mac [6]byte
}

type vmSite struct {
	host int
	vm   VM
	at   site
}

func (d *decoder) hosts(n *yaml.Node) hostSet {
	hs := hostSet{vms: map[vniAddr]vmSite{}}
	names := map[string]site{}
	addrs := map[netip.Addr]site{}
	macs := map[vniMAC]vmSite{}
	for i, hn := range d.list(n, "hosts", "hosts") {
		path := index("hosts", i)
		o := d.object(hn, path, hostKeys)
		if o == nil {
			if d.over {
				break
			}
			if r := d.deref(hn); isNull(r) {
				d.errorf(hn, path, "empty host (want a mapping of %s)", keyList(hostKeys))
			}
			continue
		}
		h := Host{VXLANPort: DefaultVXLANPort}
		addrN := d.get(o, "address")
		addrOK := false
		if addrN != nil {
			h.Address, addrOK = d.addr(addrN, path+".address", "the host's physical "+addrWords, 0, false)
			if addrOK {
				if first, dup := addrs[h.Address]; dup {
					d.errorf(addrN, path+".address", "host address %v is listed twice (first at %v)", h.Address, first)
				}
				addrs[h.Address] = site{path, addrN}
			}
		} else {
			d.missing(o, "address", "the host's physical "+addrWords+" (where Muxes send VXLAN)")
		}
		nameN := d.get(o, "name")
		if nameN != nil {
			h.Name, _ = d.name(nameN, path+".name", longNameMax, false)
		} else if addrOK {
			h.Name = h.Address.String()
		}
		if h.Name != "" {
			if first, dup := names[h.Name]; dup {
				d.errorf(at(nameN, o.n), path+".name", "host name %q is used twice (first at %v)", h.Name, first)
			}
			names[h.Name] = site{path, at(nameN, o.n)}
		}
		if vn := d.get(o, "vxlan_port"); vn != nil {
			p, _ := d.uint(vn, path+".vxlan_port", 1, math.MaxUint16, wantPort)
			h.VXLANPort = uint16(p)
		}
		ifaces := map[string]vmSite{}
		for j, vn := range d.list(o.vals["vms"], path+".vms", "VMs") {
			vp := index(path+".vms", j)
			vo := d.object(vn, vp, vmKeys)
			if vo == nil {
				if d.over {
					break
				}
				if r := d.deref(vn); isNull(r) {
					d.errorf(vn, vp, "empty VM (want a mapping of %s)", keyList(vmKeys))
				}
				continue
			}
			vm, ok := d.vm(vo)
			h.VMs = append(h.VMs, vm)
			if !ok {
				continue
			}
			here := vmSite{host: len(hs.list), vm: vm, at: site{vp, vo.n}}
			ka := vniAddr{vm.VNI, vm.Address}
			if first, dup := hs.vms[ka]; dup {
				d.errorf(at(vo.vals["address"], vo.n), vp+".address", "VM address %v is already used in VNI %d (at %v)", vm.Address, vm.VNI, first.at)
			} else {
				hs.vms[ka] = here
			}
			// A MAC names one VM port in a VNI; a dual-stack VM lists the
			// same MAC and interface once per family.
			km := vniMAC{vm.VNI, vm.MAC}
			if first, dup := macs[km]; dup && !(first.host == here.host && first.vm.Interface == vm.Interface && first.vm.Address.Is4() != vm.Address.Is4()) {
				d.errorf(at(vo.vals["mac"], vo.n), vp+".mac", "MAC %s is already used in VNI %d by another VM (at %v); a MAC may repeat only for the other address family of the same VM and interface", formatMAC(vm.MAC), vm.VNI, first.at)
			} else if !dup {
				macs[km] = here
			}
			if first, dup := ifaces[vm.Interface]; dup && first.vm.MAC != vm.MAC {
				d.errorf(at(vo.vals["interface"], vo.n), vp+".interface", "interface %q already belongs to the VM with MAC %s (at %v)", vm.Interface, formatMAC(first.vm.MAC), first.at)
			} else if !dup {
				ifaces[vm.Interface] = here
			}
		}
		hs.list = append(hs.list, h)
	}
	return hs
}

func (d *decoder) vm(o *object) (VM, bool) {
	path := o.path
	var vm VM
	ok := true
	if n := d.get(o, "vni"); n != nil {
		x, vok := d.uint(n, path+".vni", 0, MaxVNI, wantVNI)
		vm.VNI, ok = uint32(x), vok
	}
	var aok, mok, iok bool
	if n := d.get(o, "address"); n != nil {
		vm.Address, aok = d.addr(n, path+".address", "the VM's "+addrWords, 0, false)
	} else {
		d.missing(o, "address", "the VM's "+addrWords)
	}
	if n := d.get(o, "mac"); n != nil {
		vm.MAC, mok = d.mac(n, path+".mac")
	} else {
		d.missing(o, "mac", `the VM's MAC address, e.g. "02:00:00:00:01:01"`)
	}
	if n := d.get(o, "interface"); n != nil {
		if s, sok := d.str(n, path+".interface", "a network interface name"); sok {
			if validIfName(s) {
				vm.Interface, iok = s, true
			} else {
				d.errorf(n, path+".interface", "%q is not a Linux interface name (want 1-15 characters, no '/', ':' or spaces)", s)
			}
		}
	} else {
		d.missing(o, "interface", "the VM's port on the host, a network interface name")
	}
	return vm, ok && aok && mok && iok
}

// validIfName follows the kernel's dev_valid_name: 1..15 bytes, not "." or
// "..", no '/', ':' or white space.
func validIfName(s string) bool {
	if s == "" || len(s) > 15 || s == "." || s == ".." {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool {
		return r == '/' || r == ':' || r <= ' ' || r >= 0x7f
	})
}

// checkVIPs checks across VIPs: unique names and unique (VNI, protocol,
// address, port).
func (d *decoder) checkVIPs(doc *Document, metas []vipMeta) {
	names := map[string]site{}
	type vipKey struct {
		vni   uint32
		proto uint8
		addr  netip.Addr
		port  uint16
	}
	keys := map[vipKey]int{}
	for i := range doc.VIPs {
		v, m := &doc.VIPs[i], &metas[i]
		if m.nameOK {
			if first, dup := names[v.Name]; dup {
				d.errorf(m.nameN, m.path+".name", "VIP name %q is used twice (first at %v)", v.Name, first)
			} else {
				names[v.Name] = site{m.path, m.nameN}
			}
		}
		if m.keyOK {
			k := vipKey{v.VNI, v.Protocol, v.Address, v.Port}
			if j, dup := keys[k]; dup {
				d.errorf(m.addrN, m.path, "%s is already served by %s %q (line %d): a VIP is unique by VNI, protocol, address and port",
					describeVIP(v), metas[j].path, doc.VIPs[j].Name, metas[j].node.Line)
			} else {
				keys[k] = i
			}
		}
	}
}

func describeVIP(v *VIP) string {
	proto := "tcp"
	if v.Protocol == flow.ProtoUDP {
		proto = "udp"
	}
	port := fmt.Sprint(v.Port)
	if v.Port == 0 {
		port = "all"
	}
	if v.Address.Is6() {
		return fmt.Sprintf("%s [%v]:%s in VNI %d", proto, v.Address, port, v.VNI)
	}
	return fmt.Sprintf("%s %v:%s in VNI %d", proto, v.Address, port, v.VNI)
}

// checkDIPs checks that a DIP (VNI, address) has one MAC and one host
// everywhere it appears, and agrees with the hosts section when that lists
// it.
func (d *decoder) checkDIPs(doc *Document, metas []vipMeta, hs hostSet) {
	type dip struct {
		b  *Backend
		at site
	}
	seen := map[vniAddr]dip{}
	for i := range doc.VIPs {
		v, m := &doc.VIPs[i], &metas[i]
		for j := range v.Backends {
			b, bm := &v.Backends[j], &m.backends[j]
			if !bm.addrOK {
				continue
			}
			k := vniAddr{v.VNI, b.Address}
			if vm, ok := hs.vms[k]; ok {
				h := &hs.list[vm.host]
				if bm.macOK && vm.vm.MAC != b.MAC {
					d.errorf(bm.mac, bm.path+".mac", "DIP %v in VNI %d has MAC %s here but %s in hosts (at %v)",
						b.Address, v.VNI, formatMAC(b.MAC), formatMAC(vm.vm.MAC), vm.at)
				}
				if bm.hOK && h.Address.IsValid() && h.Address != b.Host {
					d.errorf(bm.host, bm.path+".host", "DIP %v in VNI %d is on host %q (%v) according to hosts (at %v), not %v",
						b.Address, v.VNI, h.Name, h.Address, vm.at, b.Host)
				}
			}
			first, dup := seen[k]
			if !dup {
				if bm.macOK && bm.hOK {
					seen[k] = dip{b, site{bm.path, bm.item}}
				}
				continue
			}
			if bm.macOK && first.b.MAC != b.MAC {
				d.errorf(bm.mac, bm.path+".mac", "DIP %v in VNI %d has MAC %s here but %s at %v",
					b.Address, v.VNI, formatMAC(b.MAC), formatMAC(first.b.MAC), first.at)
			}
			if bm.hOK && first.b.Host != b.Host {
				d.errorf(bm.host, bm.path+".host", "DIP %v in VNI %d is on host %v here but %v at %v",
					b.Address, v.VNI, b.Host, first.b.Host, first.at)
			}
		}
	}
}
