package control

import (
	"fmt"
	"net/netip"

	"github.com/xdplb/xdplb/flow"
)

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
	n := 0
	for i := range doc.VIPs {
		n += len(doc.VIPs[i].Backends)
	}
	seen := make(map[vniAddr]dip, n) // sized: growing it was a tenth of a parse at 10,000 DIPs
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
