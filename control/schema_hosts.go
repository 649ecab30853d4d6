package control

import (
	"math"
	"net/netip"
	"strings"

	"go.yaml.in/yaml/v3"
)

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
	list := d.list(n, "hosts", "hosts")
	// Sized for the whole section (growing them was a tenth of a parse
	// at 1,000 hosts with 10 VMs each); a hint only: aliases are not
	// followed here (nor charged to the alias budget).
	vms := 0
	for _, hn := range list {
		if hn != nil && hn.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(hn.Content); i += 2 {
				if k, v := hn.Content[i], hn.Content[i+1]; k.Kind == yaml.ScalarNode && k.Value == "vms" && v.Kind == yaml.SequenceNode {
					vms += len(v.Content)
				}
			}
		}
	}
	hs := hostSet{vms: make(map[vniAddr]vmSite, vms)}
	names := make(map[string]site, len(list))
	addrs := make(map[netip.Addr]site, len(list))
	macs := make(map[vniMAC]vmSite, vms)
	for i, hn := range list {
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
		for j, vn := range d.list(o.val("vms"), path+".vms", "VMs") {
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
				d.errorf(at(vo.val("address"), vo.n), vp+".address", "VM address %v is already used in VNI %d (at %v)", vm.Address, vm.VNI, first.at)
			} else {
				hs.vms[ka] = here
			}
			// A MAC names one VM port in a VNI; a dual-stack VM lists the
			// same MAC and interface once per family.
			km := vniMAC{vm.VNI, vm.MAC}
			if first, dup := macs[km]; dup && !(first.host == here.host && first.vm.Interface == vm.Interface && first.vm.Address.Is4() != vm.Address.Is4()) {
				d.errorf(at(vo.val("mac"), vo.n), vp+".mac", "MAC %s is already used in VNI %d by another VM (at %v); a MAC may repeat only for the other address family of the same VM and interface", formatMAC(vm.MAC), vm.VNI, first.at)
			} else if !dup {
				macs[km] = here
			}
			if first, dup := ifaces[vm.Interface]; dup && first.vm.MAC != vm.MAC {
				d.errorf(at(vo.val("interface"), vo.n), vp+".interface", "interface %q already belongs to the VM with MAC %s (at %v)", vm.Interface, formatMAC(first.vm.MAC), first.at)
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
