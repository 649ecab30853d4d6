package fleet

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// StatusReport is the fleet's status as xdplbctl status shows it.
type StatusReport struct {
	Version     uint64    `json:"version"`
	Revision    int64     `json:"revision"`
	Committed   time.Time `json:"committed,omitzero"`
	CommittedBy string    `json:"committed_by,omitempty"`
	// Live says how many nodes of each role run the document's version,
	// e.g. "version 12: 9/10 Muxes, 40/40 hosts".
	Live  string      `json:"live"`
	Nodes []NodeRow   `json:"nodes"`
	VIPs  []VIPReport `json:"vips"`
	// Outbound is every outbound VIP's port pool and who holds what.
	Outbound []OutboundReport `json:"outbound,omitempty"`
}

// NodeRow is one node's status, with how long ago it wrote it.
type NodeRow struct {
	NodeStatus
	Age time.Duration `json:"age_ns"`
}

// VIPReport is one VIP and its backends.
type VIPReport struct {
	Name     string          `json:"name"`
	Service  string          `json:"service"`
	Backends []BackendReport `json:"backends"`
}

// BackendReport is one backend: the document's state and its health as
// the fleet sees it: "up", "down: <why>", "not probed" (its VIP has no
// probe), "no report" (its Host Agent publishes nothing: not running, or
// gone for longer than its lease), "probed by the Muxes (no Host Agent)"
// (a backend on a host not in hosts[]: only the Muxes can probe it).
type BackendReport struct {
	Name   string `json:"name"`
	DIP    string `json:"dip"`
	Host   string `json:"host"`
	State  string `json:"state"`
	Health string `json:"health"`
}

// Report summarises f at time now.
func Report(f FleetStatus, now time.Time) StatusReport {
	r := StatusReport{Nodes: []NodeRow{}, VIPs: []VIPReport{}}
	doc := f.Document.Doc
	if doc != nil {
		r.Version, r.Revision = doc.Version, f.Document.Revision
		r.Committed, r.CommittedBy = f.Document.Commit.CommittedAt, f.Document.Commit.By
		live := f.Live(doc.Version)
		var parts []string
		for _, role := range []struct{ role, plural string }{{RoleMux, "Muxes"}, {RoleHostAgent, "hosts"}} {
			c := live[role.role]
			parts = append(parts, fmt.Sprintf("%d/%d %s", c[0], c[1], role.plural))
		}
		r.Live = fmt.Sprintf("version %d: %s", doc.Version, strings.Join(parts, ", "))
	}
	for _, n := range f.Nodes {
		r.Nodes = append(r.Nodes, NodeRow{NodeStatus: n, Age: now.Sub(n.Updated)})
	}
	if doc == nil {
		return r
	}
	hostName := map[netip.Addr]string{} // hosts with a Host Agent
	for _, h := range doc.Hosts {
		hostName[h.Address] = h.Name
	}
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		vr := VIPReport{Name: v.Name, Service: describeVIP(v)}
		for _, b := range v.Backends {
			host, agent := hostName[b.Host]
			if !agent {
				host = b.Host.String()
			}
			br := BackendReport{Name: b.Name, DIP: netip.AddrPortFrom(b.Address, b.Port).String(), Host: host,
				State: stateName(b.State), Health: "not probed"}
			switch {
			case v.Probe != nil && !agent:
				br.Health = "probed by the Muxes (no Host Agent)"
			case v.Probe != nil:
				br.Health = f.health(host, v, &b)
			}
			vr.Backends = append(vr.Backends, br)
		}
		r.VIPs = append(r.VIPs, vr)
	}
	r.Outbound = outboundReports(f, doc)
	return r
}

func stateName(s flow.BackendState) string {
	switch s {
	case flow.BackendActive:
		return "active"
	case flow.BackendDraining:
		return "draining"
	case flow.BackendDown:
		return "down"
	}
	return fmt.Sprint(s)
}

// health is a probed backend's health as its host reports it.
func (f FleetStatus) health(host string, v *control.VIP, b *control.Backend) string {
	if f.Health == nil {
		return "no report"
	}
	h, ok := f.Health[HealthKey{Host: host, VerdictKey: health.VerdictKey{VNI: v.VNI, Addr: b.Address, Port: probePort(v, b)}}]
	switch {
	case !ok:
		return "no report"
	case h.Up:
		return "up"
	case h.Reason != "":
		return "down: " + h.Reason
	}
	return "down"
}

// probePort is the port a backend is probed on (control's rule: the
// probe's port, else the backend's, else the VIP's).
func probePort(v *control.VIP, b *control.Backend) uint16 {
	switch {
	case v.Probe != nil && v.Probe.Port != 0:
		return v.Probe.Port
	case b.Port != 0:
		return b.Port
	}
	return v.Port
}
