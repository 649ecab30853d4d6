package fleet

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/control"
)

// PortRecord is one claim or guard key as read for status.
type PortRecord struct {
	VIP   netip.Addr `json:"vip"`
	First uint16     `json:"first"`
	PortClaim
	// Cooling is a guard put under a cooling lease: its holder is gone and
	// the range is claimable by others when the lease expires.
	Cooling bool `json:"cooling,omitempty"`
}

// readPorts reads every claim and guard (for ReadStatus).
func readPorts(ctx context.Context, c *clientv3.Client, k keys) (claims, guards []PortRecord, err error) {
	for i, prefix := range []string{k.portClaims(), k.portGuards()} {
		resp, err := c.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			return nil, nil, fmt.Errorf("fleet: read %s: %w", prefix, err)
		}
		for _, kv := range resp.Kvs {
			vip, first, ok1 := parsePortKey(prefix, string(kv.Key))
			pc, ok2 := decodeClaim(kv.Value)
			if !ok1 || !ok2 || pc.Last < first {
				continue
			}
			r := PortRecord{VIP: vip, First: first, PortClaim: pc}
			if i == 0 {
				claims = append(claims, r)
			} else {
				r.Cooling = kv.Lease != 0
				guards = append(guards, r)
			}
		}
	}
	return claims, guards, nil
}

// OutboundReport is one outbound VIP's port pool: how many units it has
// and in which state, and who holds what.
type OutboundReport struct {
	Address string `json:"address"`
	VNI     uint32 `json:"vni"`
	Unit    uint16 `json:"unit"`
	// Units is how many units the pool has; Static are fixed by the
	// document, Held claimed, Guarded unclaimed but not claimable yet
	// (their holder's lease ended less than a guard time ago, or nobody
	// has needed them since), Free claimable.
	Units   int            `json:"units"`
	Static  int            `json:"static"`
	Held    int            `json:"held"`
	Guarded int            `json:"guarded"`
	Free    int            `json:"free"`
	Holders []HolderReport `json:"holders"`
}

// HolderReport is one DIP's ranges of an outbound VIP.
type HolderReport struct {
	DIP    string   `json:"dip"`
	Host   string   `json:"host"`
	Ranges []string `json:"ranges"` // "1024-1087", "2048-2111 (static)"
	Ports  int      `json:"ports"`
}

// outboundReports summarises every outbound section of doc with the
// claims and guards in f.
func outboundReports(f FleetStatus, doc *control.Document) []OutboundReport {
	vmHost := map[netip.Addr]string{} // DIP → host name, for static ranges
	for _, h := range doc.Hosts {
		for _, vm := range h.VMs {
			vmHost[vm.Address] = h.Name
		}
	}
	var out []OutboundReport
	for i := range doc.Outbound {
		ob := &doc.Outbound[i]
		r := OutboundReport{Address: ob.Address.String(), VNI: ob.VNI, Unit: ob.Unit, Holders: []HolderReport{}}
		type span struct {
			first, last uint16
			static      bool
		}
		byDIP := map[string]*HolderReport{}
		spans := map[string][]span{}
		holder := func(dip netip.Addr, host string) string {
			key := dip.String() + " " + host
			if byDIP[key] == nil {
				byDIP[key] = &HolderReport{DIP: dip.String(), Host: host}
			}
			return key
		}
		var static, held, guarded [65536 / 64]uint64
		mark := func(set *[1024]uint64, first, last uint16) {
			for p := int(first); p <= int(last); p++ {
				set[p>>6] |= 1 << (p & 63)
			}
		}
		for _, s := range ob.Static {
			key := holder(s.DIP, vmHost[s.DIP])
			spans[key] = append(spans[key], span{s.Ports.First, s.Ports.Last, true})
			mark(&static, s.Ports.First, s.Ports.Last)
		}
		for _, c := range f.Claims {
			if c.VIP != ob.Address {
				continue
			}
			key := holder(c.DIP, c.Host)
			spans[key] = append(spans[key], span{c.First, c.Last, false})
			mark(&held, c.First, c.Last)
		}
		for _, g := range f.Guards {
			if g.VIP == ob.Address {
				mark(&guarded, g.First, g.Last)
			}
		}
		any := func(set *[1024]uint64, first, last int) bool {
			for p := first; p <= last; p++ {
				if set[p>>6]&(1<<(p&63)) != 0 {
					return true
				}
			}
			return false
		}
		u := int(ob.Unit)
		for _, p := range ob.Pool {
			for b := int(p.First); b+u-1 <= int(p.Last); b += u {
				r.Units++
				switch {
				case any(&static, b, b+u-1):
					r.Static++
				case any(&held, b, b+u-1):
					r.Held++
				case any(&guarded, b, b+u-1):
					r.Guarded++
				default:
					r.Free++
				}
			}
		}
		for key, h := range byDIP {
			ss := spans[key]
			slices.SortFunc(ss, func(x, y span) int { return cmp.Compare(x.first, y.first) })
			for _, s := range ss {
				txt := control.PortRange{First: s.first, Last: s.last}.String()
				if s.static {
					txt += " (static)"
				}
				h.Ranges = append(h.Ranges, txt)
				h.Ports += int(s.last) - int(s.first) + 1
			}
			r.Holders = append(r.Holders, *h)
		}
		slices.SortFunc(r.Holders, func(x, y HolderReport) int {
			return cmp.Or(netip.MustParseAddr(x.DIP).Compare(netip.MustParseAddr(y.DIP)), cmp.Compare(x.Host, y.Host))
		})
		out = append(out, r)
	}
	return out
}
