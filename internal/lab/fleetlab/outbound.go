package fleetlab

import (
	"net/netip"
	"strings"

	"github.com/xdplb/xdplb/control"
)

// StaticOutbound returns an outbound section that lets vms (of VNI vni)
// use vip as their source, each with a static range of size ports: the
// first VM's from first, the next VM's right after it, and so on. size
// and first must be multiples of unit (0: control.DefaultOutboundUnit).
// The pool is computed from the document (Doc.Outbound).
func StaticOutbound(vip netip.Addr, vni uint32, vms []VM, first, size, unit uint16) control.Outbound {
	if unit == 0 {
		unit = control.DefaultOutboundUnit
	}
	ob := control.Outbound{Address: vip, VNI: vni, Unit: unit}
	for i, vm := range vms {
		ob.DIPs = append(ob.DIPs, vm.Addr)
		lo := first + uint16(i)*size
		ob.Static = append(ob.Static, control.StaticAllocation{DIP: vm.Addr,
			Ports: control.PortRange{First: lo, Last: lo + size - 1}})
	}
	return ob
}

// StaticRange returns the ports ob's static allocations give dip, and
// false when it has none.
func StaticRange(ob control.Outbound, dip netip.Addr) (control.PortRange, bool) {
	for _, s := range ob.Static {
		if s.DIP == dip {
			return s.Ports, true
		}
	}
	return control.PortRange{}, false
}

// SumMetric adds up the samples of metric name in m (as promtext.Parse
// returns them): the unlabelled sample and every labelled one.
func SumMetric(m map[string]float64, name string) float64 {
	var sum float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			sum += v
		}
	}
	return sum
}
