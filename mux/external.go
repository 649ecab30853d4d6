package mux

import (
	"errors"
	"net/netip"
	"slices"
	"strings"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/health"
)

// ErrNotExternalHealth is returned by SetDIPHealth on a Mux (or
// Controller) that probes its backends itself.
var ErrNotExternalHealth = errors.New("mux: DIP health reports given, but ExternalHealth is off (the Mux probes its backends itself)")

// extTarget is a probed backend whose health its host reports.
type extTarget struct {
	host string // the reporting host: its hosts[].name
	key  health.VerdictKey
}

// extHealth maps a document's probed backends to the verdicts that decide
// them, in external-health mode.
type extHealth struct {
	targets map[string]extTarget // by target key, "vip/backend"
	byHost  map[string][]string  // host name → target keys
}

// externalTargets splits doc's probe targets: a backend on a host listed in
// hosts[] (a host with a Host Agent) is decided by its host's reports
// (ext); the others (a backend behind a kernel vxlan device, say: no agent
// probes it) stay the Mux's own checker's (self, in targets' order).
func externalTargets(doc *control.Document, probes []health.Target) (*extHealth, []health.Target) {
	ext := &extHealth{targets: make(map[string]extTarget, len(probes)), byHost: map[string][]string{}}
	hosts := make(map[netip.Addr]*control.Host, len(doc.Hosts))
	for i := range doc.Hosts {
		hosts[doc.Hosts[i].Address] = &doc.Hosts[i]
	}
	var self []health.Target
	// probes are targets(doc): walked here in the same order with their
	// VIP and backend at hand (looking each up by name was quadratic: a
	// third of an Apply at 10,000 backends).
	k := 0
	for i := range doc.VIPs {
		v := &doc.VIPs[i]
		if v.Probe == nil {
			continue
		}
		for j := range v.Backends {
			b := &v.Backends[j]
			t := probes[k]
			k++
			h, ok := hosts[b.Host]
			if !ok {
				self = append(self, t)
				continue
			}
			port := t.Addr.Port()
			if t.Spec.Port != 0 {
				port = t.Spec.Port
			}
			et := extTarget{host: h.Name, key: health.VerdictKey{VNI: v.VNI, Addr: b.Address, Port: port}}
			ext.targets[t.Key] = et
			ext.byHost[et.host] = append(ext.byHost[et.host], t.Key)
		}
	}
	return ext, self
}

func splitTargetKey(key string) (vip, backend string) {
	vip, backend, _ = strings.Cut(key, "/") // VIP names have no '/'
	return vip, backend
}

// probedUp reports whether the probed backend of vip is up: by its host's
// latest report when ext decides it, else by the checker. A backend whose
// host has reported nothing about it — no report yet, or the host's
// reports are gone — is down. Called with c.mu held.
func (c *Controller) probedUp(ext *extHealth, vip, backend string) bool {
	key := targetKey(vip, backend)
	if ext != nil {
		if t, ok := ext.targets[key]; ok {
			return c.reports[t.host][t.key]
		}
	}
	st, _ := c.checker.State(key)
	return st == health.Up
}

// SetDIPHealth applies Host Agents' health reports (ExternalHealth): for
// each host — by its name in the document's hosts[] (which is its address
// when the document gives no name) — reports holds that host's complete current set of verdicts,
// replacing what it reported before; a nil or empty set means the host
// reports nothing any more (its agent is gone, say: its keys expired), so
// its probed backends count as down. A backend is up when the host the
// document puts it on reports its (VIP's VNI, address, probed port) up;
// verdicts about anything else are kept but decide nothing until a
// document makes them relevant.
//
// The verdicts of all the hosts given are applied together, through the
// path the Mux's own checker's batches take (HealthChanged): only the VIPs
// whose backends change are rebuilt, published as one snapshot, and BGP
// is told only when a VIP address becomes servable or stops being. It
// returns ErrNotExternalHealth when the Controller probes itself.
func (c *Controller) SetDIPHealth(reports map[string][]health.Verdict) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.external {
		return ErrNotExternalHealth
	}
	var keys []string
	if c.ext != nil {
		for host := range reports {
			keys = append(keys, c.ext.byHost[host]...)
		}
		slices.Sort(keys)
		keys = slices.Compact(keys)
	}
	before := make([]bool, len(keys))
	for i, k := range keys {
		vip, backend := splitTargetKey(k)
		before[i] = c.probedUp(c.ext, vip, backend)
	}
	if c.reports == nil {
		c.reports = map[string]map[health.VerdictKey]bool{}
	}
	for host, vs := range reports {
		if len(vs) == 0 {
			delete(c.reports, host)
			continue
		}
		m := make(map[health.VerdictKey]bool, len(vs))
		for _, v := range vs {
			m[v.Key()] = v.Up
		}
		c.reports[host] = m
	}
	changed := keys[:0]
	for i, k := range keys {
		vip, backend := splitTargetKey(k)
		if c.probedUp(c.ext, vip, backend) != before[i] {
			changed = append(changed, k)
		}
	}
	c.healthChanged(changed)
	return nil
}

// SetDIPHealth applies one host's health report (Config.ExternalHealth):
// verdicts is the host's complete current set, replacing its previous
// one; nil or empty means the host reports nothing any more (its Host
// Agent is gone), and its probed backends count as down. host is the
// host's name in the document's hosts[] (its address when the document
// gives it no name): a report under another name decides nothing. Calls from
// several goroutines coalesce: while one applies, the reports of the
// others queue up and are applied together, in one snapshot
// (Controller.SetDIPHealth). It returns ErrNotExternalHealth unless
// Config.ExternalHealth is set.
func (m *Mux) SetDIPHealth(host string, verdicts []health.Verdict) error {
	if !m.cfg.ExternalHealth {
		return ErrNotExternalHealth
	}
	m.extMu.Lock()
	if m.extPending == nil {
		m.extPending = map[string][]health.Verdict{}
	}
	m.extPending[host] = slices.Clone(verdicts)
	m.extMu.Unlock()

	m.extApply.Lock()
	defer m.extApply.Unlock()
	m.extMu.Lock()
	batch := m.extPending
	m.extPending = nil
	m.extMu.Unlock()
	if len(batch) == 0 {
		return nil // applied by the caller before us, with its own
	}
	return m.ctl.SetDIPHealth(batch)
}
