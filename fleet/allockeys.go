package fleet

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
)

// The keys of outbound port allocation (the package documentation,
// "Outbound port ranges", says why each range has two):
//
//	ports/claims/<vip>/<first>  PortClaim: who holds the range now, under the holder's lease
//	ports/guards/<vip>/<first>  PortClaim: who held it last; no lease while the claim lives,
//	                            a cooling lease of PortAllocator.Guard's length once a
//	                            claimer has seen the claim gone
//	ports.sweeper/<lease>       the sweeper election (concurrency.Election): a
//	                            PortAllocator's host name under its lease; the
//	                            first created is the fleet's one sweeper
//
// <first> is the range's first port in five digits, so that a VIP's keys
// sort by port and a range of ports is a range of keys (what the
// create-only compare of a claim covers). The election is not under
// ports/, which the Muxes watch.
func (k keys) ports() string                      { return k.prefix + "ports/" }
func (k keys) portClaims() string                 { return k.ports() + "claims/" }
func (k keys) portGuards() string                 { return k.ports() + "guards/" }
func (k keys) portClaimsOf(vip netip.Addr) string { return k.portClaims() + vip.String() + "/" }
func (k keys) portGuardsOf(vip netip.Addr) string { return k.portGuards() + vip.String() + "/" }
func portKey(vipPrefix string, port int) string   { return fmt.Sprintf("%s%05d", vipPrefix, port) }
func (k keys) portSweeper() string                { return k.prefix + "ports.sweeper" } // the election's prefix, less its '/'
func (k keys) portClaim(vip netip.Addr, first uint16) string {
	return portKey(k.portClaimsOf(vip), int(first))
}
func (k keys) portGuard(vip netip.Addr, first uint16) string {
	return portKey(k.portGuardsOf(vip), int(first))
}

// parsePortKey reads a key written by portClaim or portGuard (under
// prefix, portClaims or portGuards).
func parsePortKey(prefix, key string) (vip netip.Addr, first uint16, ok bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return netip.Addr{}, 0, false
	}
	i := strings.LastIndexByte(rest, '/')
	if i < 0 {
		return netip.Addr{}, 0, false
	}
	a, err1 := netip.ParseAddr(rest[:i])
	p, err2 := strconv.ParseUint(rest[i+1:], 10, 16)
	if err1 != nil || err2 != nil {
		return netip.Addr{}, 0, false
	}
	return a, uint16(p), true
}

// PortClaim is what a claim key (and its guard) holds: the range's
// last port and its holder.
type PortClaim struct {
	Last uint16 `json:"last"`
	// Host is the holder's name in hosts[]; HostAddr its address, where
	// the Muxes send the replies.
	Host     string     `json:"host"`
	HostAddr netip.Addr `json:"host_addr"`
	DIP      netip.Addr `json:"dip"`
	VNI      uint32     `json:"vni"`
	MAC      string     `json:"mac,omitempty"`
	// Lease is the etcd lease the claim was made under (for a guard: the
	// holder's lease then, for the record).
	Lease int64 `json:"lease"`
}

func decodeClaim(b []byte) (PortClaim, bool) {
	var c PortClaim
	return c, json.Unmarshal(b, &c) == nil
}

func (c PortClaim) owner() flow.PortOwner {
	o := flow.PortOwner{DIP: c.DIP, Host: c.HostAddr, VNI: c.VNI}
	if hw, err := net.ParseMAC(c.MAC); err == nil && len(hw) == 6 {
		copy(o.MAC[:], hw)
	}
	return o
}

// allocation is the flow.PortAllocation a claim of vip:first stands for.
func (c PortClaim) allocation(vip netip.Addr, first uint16) flow.PortAllocation {
	return flow.PortAllocation{VIP: vip, First: first, Last: c.Last, Owner: c.owner()}
}

// OutboundDIP is one of a host's DIPs that may use a VIP as its outbound
// source: what a PortAllocator claims ranges for (from the Host Agent's
// plan, or OutboundDIPs).
type OutboundDIP struct {
	VIP netip.Addr
	// Owner is the DIP, its host's address, its VNI and MAC, as claims
	// record them for the Muxes.
	Owner flow.PortOwner
	// Pool is the VIP's pool (control.Outbound.Pool: unit-aligned, the
	// inbound ports left out); Unit the size of one claim.
	Pool []control.PortRange
	Unit uint16
	// Static are every static allocation of the VIP's section (every
	// DIP's): never claimed. Own are this DIP's: they count as ranges it
	// holds (for the minimum and the high-water mark) but are not claimed
	// nor reported (the document gives them).
	Static []control.PortRange
	Own    []control.PortRange
}

// OutboundDIPs are the DIPs of the host named host that the document's
// outbound sections list, with what a PortAllocator needs of each.
func OutboundDIPs(doc *control.Document, host string) []OutboundDIP {
	var h *control.Host
	for i := range doc.Hosts {
		if doc.Hosts[i].Name == host {
			h = &doc.Hosts[i]
		}
	}
	if h == nil {
		return nil
	}
	var out []OutboundDIP
	for _, ob := range doc.Outbound {
		var static []control.PortRange
		for _, s := range ob.Static {
			static = append(static, s.Ports)
		}
		for _, dip := range ob.DIPs {
			for _, vm := range h.VMs {
				if vm.VNI != ob.VNI || vm.Address != dip {
					continue
				}
				d := OutboundDIP{VIP: ob.Address, Owner: flow.PortOwner{DIP: dip, Host: h.Address, VNI: ob.VNI, MAC: vm.MAC},
					Pool: ob.Pool, Unit: ob.Unit, Static: static}
				for _, s := range ob.Static {
					if s.DIP == dip {
						d.Own = append(d.Own, s.Ports)
					}
				}
				out = append(out, d)
			}
		}
	}
	return out
}
