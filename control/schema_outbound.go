package control

import (
	"fmt"
	"math"
	"net/netip"
	"slices"

	"go.yaml.in/yaml/v3"
)

var (
	outboundKeys = []string{"address", "vni", "dips", "ports", "unit", "static", "local"}
	staticKeys   = []string{"dip", "ports"}
)

// DefaultOutboundUnit is how many ports an outbound allocation holds when
// the document does not say.
const DefaultOutboundUnit = 64

// Outbound lets VMs open connections to the outside with a VIP as their
// source (source NAT): a DIP's connections get ports of the ranges
// allocated to it from the VIP's pool, and the replies, which reach a
// Mux, go to the DIP's host by the port.
type Outbound struct {
	// Address is the VIP used as the source.
	Address netip.Addr
	// VNI is the DIPs' tenant.
	VNI uint32
	// DIPs may use Address as their outbound source: VMs of VNI listed in
	// hosts[], in Address's family.
	DIPs []netip.Addr
	// Pool is the ports allocations come from, without the ports the
	// address serves inbound (its VIPs' and inbound NAT rules' ports,
	// every protocol), which are never handed out.
	Pool []PortRange
	// Unit is the size of one allocation (a power of two, 8..4096).
	Unit uint16
	// Static are allocations fixed by the document (without etcd): each
	// a DIP and its ranges, within Pool, unit-aligned, not overlapping.
	Static []StaticAllocation
	// Local are the destinations of the VNI's own network (east-west
	// traffic, other VMs): the DIPs' packets to them are never
	// translated, the Host Agent hands them to its host's kernel as they
	// are. Prefixes of Address's family.
	Local []netip.Prefix
}

// PortRange is the ports First..Last.
type PortRange struct{ First, Last uint16 }

// Len is the number of ports in r.
func (r PortRange) Len() int { return int(r.Last) - int(r.First) + 1 }

func (r PortRange) String() string {
	if r.First == r.Last {
		return fmt.Sprint(r.First)
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// StaticAllocation is a range of an outbound pool fixed to one DIP.
type StaticAllocation struct {
	DIP   netip.Addr
	Ports PortRange
}

// outbound decodes the outbound list after the VIPs and hosts, which it
// checks against.
func (d *decoder) outbound(n *yaml.Node, doc *Document, hs hostSet) []Outbound {
	var out []Outbound
	seen := map[netip.Addr]string{}
	for i, on := range d.list(n, "outbound", "outbound sections") {
		path := index("outbound", i)
		o := d.object(on, path, outboundKeys)
		if o == nil {
			if r := d.deref(on); isNull(r) && !d.over {
				d.errorf(on, path, "empty section (want a mapping of %s)", keyList(outboundKeys))
			}
			continue
		}
		ob := Outbound{Unit: DefaultOutboundUnit}
		ok := true
		if v := d.get(o, "address"); v != nil {
			var good bool
			if ob.Address, good = d.addr(v, path+".address", "the VIP's "+addrWords, 0, false); good {
				if first, dup := seen[ob.Address]; dup {
					d.errorf(v, path+".address", "%v has an outbound section already (%s)", ob.Address, first)
				}
				seen[ob.Address] = path
			}
			ok = ok && good
		} else {
			d.missing(o, "address", "the VIP whose address VMs use as their source")
			ok = false
		}
		if v := d.get(o, "vni"); v != nil {
			x, good := d.uint(v, path+".vni", 0, MaxVNI, wantVNI)
			ob.VNI, ok = uint32(x), ok && good
		}
		for j, dn := range d.list(o.val("dips"), path+".dips", "addresses") {
			dp := index(path+".dips", j)
			a, good := d.addr(dn, dp, "a VM's "+addrWords, 0, false)
			switch {
			case !good:
				ok = false
			case ob.Address.IsValid() && a.Is4() != ob.Address.Is4():
				d.errorf(dn, dp, "%v and the VIP %v are of different families", a, ob.Address)
				ok = false
			case !hasVM(hs, ob.VNI, a):
				d.errorf(dn, dp, "%v is not a VM of VNI %d in hosts[] (outbound NAT runs on its host's Host Agent)", a, ob.VNI)
				ok = false
			case slices.Contains(ob.DIPs, a):
				d.errorf(dn, dp, "%v is listed twice", a)
			default:
				ob.DIPs = append(ob.DIPs, a)
			}
		}
		if o.val("dips") == nil {
			d.missing(o, "dips", "the VMs that may use the VIP as their source")
			ok = false
		}
		if v := d.get(o, "unit"); v != nil {
			x, good := d.uint(v, path+".unit", 8, 4096, "a power of two, 8..4096")
			if good && x&(x-1) != 0 {
				d.errorf(v, path+".unit", "%d is not a power of two (want 8, 16, 32, 64, ... 4096)", x)
				good = false
			}
			ob.Unit, ok = uint16(x), ok && good
		}
		pool := PortRange{1024, math.MaxUint16}
		var poolN *yaml.Node
		if poolN = d.get(o, "ports"); poolN != nil {
			first, last, good := d.portRange(poolN, path+".ports")
			pool, ok = PortRange{first, last}, ok && good
		}
		if !ok {
			continue
		}
		// The pool: unit-aligned blocks of pool that hold no inbound port.
		inbound, all := inboundPorts(doc, ob.Address)
		if all {
			d.errorf(o.key("address"), path+".address", "%v serves every port inbound (a VIP with port all): no port is left for outbound connections", ob.Address)
			continue
		}
		ob.Pool = OutboundPool(pool, ob.Unit, inbound)
		if len(ob.Pool) == 0 {
			d.errorf(at(poolN, o.n), path+".ports", "no whole unit of %d ports left in %v once the address's inbound ports are left out", ob.Unit, pool)
			continue
		}
		ob.Static = d.staticAllocations(o.val("static"), path+".static", &ob)
		for j, p := range d.prefixes(o.val("local"), path+".local") {
			if p.Addr().Is4() != ob.Address.Is4() {
				d.errorf(o.val("local"), index(path+".local", j), "%v and the VIP %v are of different families", p, ob.Address)
				continue
			}
			ob.Local = append(ob.Local, p)
		}
		out = append(out, ob)
	}
	return out
}

// OutboundPool returns the ports of ports that outbound allocations of
// unit ports may come from: its unit-aligned blocks that hold none of the
// address's inbound ports, adjacent blocks merged. It is how the parser
// computes Outbound.Pool from a section's ports and unit.
func OutboundPool(ports PortRange, unit uint16, inbound []uint16) []PortRange {
	var out []PortRange
	u := int(unit)
	for b := (int(ports.First) + u - 1) / u * u; b+u-1 <= int(ports.Last); b += u {
		r := PortRange{uint16(b), uint16(b + u - 1)}
		if !slices.ContainsFunc(inbound, func(p uint16) bool { return p >= r.First && p <= r.Last }) {
			if k := len(out); k > 0 && int(out[k-1].Last)+1 == b {
				out[k-1].Last = r.Last
			} else {
				out = append(out, r)
			}
		}
	}
	return out
}

func hasVM(hs hostSet, vni uint32, a netip.Addr) bool {
	_, ok := hs.vms[vniAddr{vni, a}]
	return ok
}

// inboundPorts are the ports addr serves inbound (any protocol); all is
// true when a VIP of addr serves every port.
func inboundPorts(doc *Document, addr netip.Addr) (ps []uint16, all bool) {
	for i := range doc.VIPs {
		if v := &doc.VIPs[i]; v.Address == addr {
			ps = append(ps, v.Port)
			all = all || v.Port == 0
		}
	}
	return ps, all
}

func (d *decoder) staticAllocations(n *yaml.Node, path string, ob *Outbound) []StaticAllocation {
	var out []StaticAllocation
	for i, sn := range d.list(n, path, "allocations") {
		p := index(path, i)
		o := d.object(sn, p, staticKeys)
		if o == nil {
			continue
		}
		var s StaticAllocation
		ok := true
		dn := d.get(o, "dip")
		if dn != nil {
			var good bool
			s.DIP, good = d.addr(dn, p+".dip", "one of the section's dips", 0, false)
			if good && !slices.Contains(ob.DIPs, s.DIP) {
				d.errorf(dn, p+".dip", "%v is not in this section's dips", s.DIP)
				good = false
			}
			ok = ok && good
		} else {
			d.missing(o, "dip", "one of the section's dips")
			ok = false
		}
		pn := d.get(o, "ports")
		if pn != nil {
			first, last, good := d.portRange(pn, p+".ports")
			s.Ports, ok = PortRange{first, last}, ok && good
		} else {
			d.missing(o, "ports", "a range of the pool, whole units")
			ok = false
		}
		if !ok {
			continue
		}
		u := int(ob.Unit)
		switch {
		case int(s.Ports.First)%u != 0 || s.Ports.Len()%u != 0:
			d.errorf(pn, p+".ports", "%v is not whole units of %d ports (want it to start at a multiple of %d and hold a multiple of %d)", s.Ports, u, u, u)
		case !slices.ContainsFunc(ob.Pool, func(r PortRange) bool { return r.First <= s.Ports.First && s.Ports.Last <= r.Last }):
			d.errorf(pn, p+".ports", "%v is not within the pool %v (the address's inbound ports are left out of it)", s.Ports, ob.Pool)
		case slices.ContainsFunc(out, func(o StaticAllocation) bool { return o.Ports.First <= s.Ports.Last && s.Ports.First <= o.Ports.Last }):
			d.errorf(pn, p+".ports", "%v overlaps another static allocation", s.Ports)
		default:
			out = append(out, s)
		}
	}
	return out
}

func marshalOutbound(ob *Outbound) *yaml.Node {
	n := mapping()
	addAddr(n, "address", ob.Address)
	add(n, "vni", uintNode(uint64(ob.VNI)))
	addAddrs(n, "dips", ob.DIPs)
	if len(ob.Pool) > 0 {
		add(n, "ports", strNode(PortRange{ob.Pool[0].First, ob.Pool[len(ob.Pool)-1].Last}.String()))
	}
	add(n, "unit", uintNode(uint64(ob.Unit)))
	if len(ob.Static) > 0 {
		s := sequence()
		for _, a := range ob.Static {
			an := mapping()
			addAddr(an, "dip", a.DIP)
			add(an, "ports", strNode(a.Ports.String()))
			s.Content = append(s.Content, an)
		}
		add(n, "static", s)
	}
	if len(ob.Local) > 0 {
		s := sequence()
		for _, p := range ob.Local {
			s.Content = append(s.Content, strNode(p.String()))
		}
		add(n, "local", s)
	}
	return n
}
