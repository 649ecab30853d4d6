package control

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/xdplb/xdplb/flow"
)

var inboundNATKeys = []string{"name", "address", "protocol", "vni", "ports", "backend_port", "targets"}

// InboundNAT is an inbound NAT rule: each port of a range of a VIP's
// ports goes to one VM's port — e.g. VIP:50001 → vm11:22, VIP:50002 →
// vm12:22 — for reaching single VMs (SSH, RDP) through the VIP.
type InboundNAT struct {
	// Name names the rule; its VIPs are named "<name>-<port>".
	Name    string
	Address netip.Addr
	// Protocol is flow.ProtoTCP (default) or flow.ProtoUDP.
	Protocol uint8
	VNI      uint32
	// FirstPort..LastPort are the VIP's ports; port FirstPort+i goes to
	// Targets[i].
	FirstPort, LastPort uint16
	// BackendPort is the VMs' port.
	BackendPort uint16
	// Targets are VMs of the VNI listed in hosts[] (their MAC and host
	// come from there), one per port, in order.
	Targets []netip.Addr
}

// Ports returns how many ports the rule maps.
func (r *InboundNAT) Ports() int { return int(r.LastPort) - int(r.FirstPort) + 1 }

// inboundNAT decodes the inbound_nat list, resolving targets in hs; it
// returns the rules and the one-backend VIPs they stand for, with their
// metas for the checks across VIPs.
func (d *decoder) inboundNAT(n *yaml.Node, hs hostSet) ([]InboundNAT, []VIP, []vipMeta) {
	var rules []InboundNAT
	var vips []VIP
	var metas []vipMeta
	for i, rn := range d.list(n, "inbound_nat", "inbound NAT rules") {
		path := index("inbound_nat", i)
		o := d.object(rn, path, inboundNATKeys)
		if o == nil {
			if r := d.deref(rn); isNull(r) && !d.over {
				d.errorf(rn, path, "empty rule (want a mapping of %s)", keyList(inboundNATKeys))
			}
			continue
		}
		r := InboundNAT{Protocol: flow.ProtoTCP}
		ok := true
		var nameN, addrN *yaml.Node
		if nameN = d.get(o, "name"); nameN != nil {
			var good bool
			if r.Name, good = d.name(nameN, path+".name", nameMax-6, true); !good {
				ok = false
			}
		} else {
			d.missing(o, "name", "a name; its VIPs are named <name>-<port>")
			ok = false
		}
		if addrN = d.get(o, "address"); addrN != nil {
			var good bool
			r.Address, good = d.addr(addrN, path+".address", wantAddr, 0, false)
			ok = ok && good
		} else {
			d.missing(o, "address", "the VIP's "+addrWords)
			ok = false
		}
		if v := d.get(o, "protocol"); v != nil {
			if s, good := d.str(v, path+".protocol", "tcp or udp"); good {
				switch s {
				case "tcp":
				case "udp":
					r.Protocol = flow.ProtoUDP
				default:
					d.errorf(v, path+".protocol", "%q is not a protocol (want tcp or udp)", s)
					ok = false
				}
			}
		}
		if v := d.get(o, "vni"); v != nil {
			x, good := d.uint(v, path+".vni", 0, MaxVNI, wantVNI)
			r.VNI, ok = uint32(x), ok && good
		}
		portsN := d.get(o, "ports")
		if portsN != nil {
			first, last, good := d.portRange(portsN, path+".ports")
			r.FirstPort, r.LastPort, ok = first, last, ok && good
		} else {
			d.missing(o, "ports", `a port or a range, e.g. 50001-50100`)
			ok = false
		}
		if v := d.get(o, "backend_port"); v != nil {
			x, good := d.uint(v, path+".backend_port", 1, math.MaxUint16, wantPort)
			r.BackendPort, ok = uint16(x), ok && good
		} else {
			d.missing(o, "backend_port", "the VMs' port, "+wantPort)
			ok = false
		}
		targetsN := o.val("targets")
		if targetsN == nil {
			d.missing(o, "targets", "the VMs' addresses, one per port")
			ok = false
		}
		var sites []vmSite
		for j, tn := range d.list(targetsN, path+".targets", "addresses") {
			tp := index(path+".targets", j)
			a, good := d.addr(tn, tp, "a VM's "+addrWords, 0, false)
			if !good {
				ok = false
				continue
			}
			site, found := hs.vms[vniAddr{r.VNI, a}]
			switch {
			case !found:
				d.errorf(tn, tp, "%v is not a VM of VNI %d in hosts[] (an inbound NAT target must be: its MAC and host come from there)", a, r.VNI)
				ok = false
			case r.Address.IsValid() && a.Is4() != r.Address.Is4():
				d.errorf(tn, tp, "%v and the VIP %v are of different families (NAT rewrites the address in place)", a, r.Address)
				ok = false
			}
			r.Targets = append(r.Targets, a)
			sites = append(sites, site)
		}
		if ok && len(r.Targets) != r.Ports() {
			d.errorf(portsN, path+".ports", "%d ports for %d targets (want one port per target, in order)", r.Ports(), len(r.Targets))
			ok = false
		}
		rules = append(rules, r)
		if !ok {
			continue
		}
		for j, a := range r.Targets {
			port := r.FirstPort + uint16(j)
			vm, host := sites[j].vm, hs.list[sites[j].host]
			v := VIP{Name: fmt.Sprintf("%s-%d", r.Name, port), Address: r.Address, Protocol: r.Protocol, Port: port,
				VNI: r.VNI, InboundNAT: r.Name,
				Backends: []Backend{{Name: a.String(), Address: a, Port: r.BackendPort, MAC: vm.MAC, Host: host.Address,
					Weight: DefaultWeight, State: flow.BackendActive}}}
			vips = append(vips, v)
			metas = append(metas, vipMeta{path: path, node: o.n, nameN: nameN, addrN: addrN, nameOK: true, keyOK: true,
				backends: []backendMeta{{path: path + ".targets", item: targetsN, node: targetsN}}})
		}
	}
	return rules, vips, metas
}

// portRange decodes a port (50001) or a range ("50001-50100").
func (d *decoder) portRange(n *yaml.Node, path string) (uint16, uint16, bool) {
	const want = "a port or a range first-last, e.g. 50001-50100, within 1..65535"
	n = d.deref(n)
	if n == nil || n.Kind != yaml.ScalarNode {
		d.errorf(n, path, "want %s, got %s", want, describe(n))
		return 0, 0, false
	}
	lo, hi, isRange := strings.Cut(n.Value, "-")
	if !isRange {
		hi = lo
	}
	a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if err1 != nil || err2 != nil || a == 0 || b < a {
		d.errorf(n, path, "%q is not a port range (want %s)", n.Value, want)
		return 0, 0, false
	}
	return uint16(a), uint16(b), true
}

func marshalInboundNAT(r *InboundNAT) *yaml.Node {
	n := mapping()
	add(n, "name", strNode(r.Name))
	addAddr(n, "address", r.Address)
	if r.Protocol == flow.ProtoUDP {
		add(n, "protocol", strNode("udp"))
	} else {
		add(n, "protocol", strNode("tcp"))
	}
	add(n, "vni", uintNode(uint64(r.VNI)))
	ports := strconv.Itoa(int(r.FirstPort))
	if r.LastPort != r.FirstPort {
		ports += "-" + strconv.Itoa(int(r.LastPort))
	}
	add(n, "ports", strNode(ports))
	add(n, "backend_port", uintNode(uint64(r.BackendPort)))
	addAddrs(n, "targets", r.Targets)
	return n
}
