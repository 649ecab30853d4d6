package hostagent

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/xdplb/xdplb/health"
)

// DIPHealth is one probed DIP's verdict as its host sees it: (VNI, DIP,
// probed port), up or not, since when, the last failure. It is
// health.Verdict, which the Muxes apply (mux.Mux.SetDIPHealth) without
// importing this package.
type DIPHealth = health.Verdict

// dipProber probes the host's own DIPs (Plan.Probes) with a
// health.Checker whose connections leave through each DIP's VM port
// (SO_BINDTODEVICE) from the host's address, and reports verdicts.
type dipProber struct {
	checker *health.Checker
	notify  func([]DIPHealth)

	mu     sync.Mutex
	source netip.Addr // the host's address: probes of its family come from it

	notifyMu sync.Mutex // serialises notify: the checker's events and Set's additions
}

// newDIPProber returns a prober that calls notify with verdicts. prober
// replaces the probes through the VM ports (tests); nil for those.
func newDIPProber(notify func([]DIPHealth), log *slog.Logger, prober health.Prober) (*dipProber, error) {
	p := &dipProber{notify: notify}
	cfg := health.CheckerConfig{Logger: log, Prober: prober, OnChanges: p.changed}
	if prober == nil {
		cfg.DialContext = p.dial
	}
	c, err := health.NewChecker(cfg)
	if err != nil {
		return nil, fmt.Errorf("hostagent: %w", err)
	}
	p.checker = c
	return p, nil
}

// set makes plan's DIPs the probed ones (health.Checker.Set reconciles:
// unchanged DIPs keep their verdicts) and reports the DIPs it adds, not
// probed yet, as down.
func (p *dipProber) set(plan *Plan) error {
	p.mu.Lock()
	p.source = plan.Host.Address
	p.mu.Unlock()
	before := p.checker.Snapshot()
	ts := make([]health.Target, len(plan.Probes))
	for i, dp := range plan.Probes {
		ts[i] = health.Target{Key: dp.targetKey(), Addr: netip.AddrPortFrom(dp.Addr, dp.Port), Spec: dp.Spec}
	}
	if err := p.checker.Set(ts); err != nil {
		return err
	}
	var added []DIPHealth
	for key, st := range p.checker.Snapshot() {
		if _, ok := before[key]; !ok {
			if v, ok := verdictOf(key, st); ok {
				added = append(added, v)
			}
		}
	}
	if len(added) > 0 {
		sortVerdicts(added)
		p.notifyMu.Lock()
		p.notify(added)
		p.notifyMu.Unlock()
	}
	return nil
}

// changed is the checker's OnChanges: verdicts of DIPs still probed.
func (p *dipProber) changed(evs []health.Event) {
	var vs []DIPHealth
	for _, ev := range evs {
		if _, ok := p.checker.Status(ev.Key); !ok {
			continue // no longer probed
		}
		vni, ap, ok := parseTargetKey(ev.Key)
		if !ok {
			continue
		}
		v := DIPHealth{VNI: vni, Addr: ap.Addr(), Port: ap.Port(), Up: ev.New == health.Up, Since: ev.Time}
		if !v.Up {
			v.Reason = ev.Reason
			if ev.Err != nil {
				v.Reason += ": " + ev.Err.Error()
			}
		}
		vs = append(vs, v)
	}
	if len(vs) == 0 {
		return
	}
	p.notifyMu.Lock()
	defer p.notifyMu.Unlock()
	p.notify(vs)
}

// verdicts returns the verdict of every DIP probed, sorted by VNI, address
// and port.
func (p *dipProber) verdicts() []DIPHealth {
	snap := p.checker.Snapshot()
	vs := make([]DIPHealth, 0, len(snap))
	for key, st := range snap {
		if v, ok := verdictOf(key, st); ok {
			vs = append(vs, v)
		}
	}
	sortVerdicts(vs)
	return vs
}

func verdictOf(key string, st health.Status) (DIPHealth, bool) {
	vni, ap, ok := parseTargetKey(key)
	if !ok {
		return DIPHealth{}, false
	}
	v := DIPHealth{VNI: vni, Addr: ap.Addr(), Port: ap.Port(), Up: st.State == health.Up, Since: st.Since}
	switch {
	case st.State == health.Unknown:
		v.Reason = "not probed yet"
	case v.Up:
	case st.LastErr != nil:
		v.Reason = fmt.Sprintf("%d consecutive failures: %v", st.ConsecutiveFail, st.LastErr)
	default:
		v.Reason = fmt.Sprintf("recovering: %d of %d successes", st.ConsecutiveOK, st.Spec.Rise)
	}
	return v, true
}

func sortVerdicts(vs []DIPHealth) {
	slices.SortFunc(vs, func(a, b DIPHealth) int {
		return cmp.Or(cmp.Compare(a.VNI, b.VNI), a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
}

// parseTargetKey reads the VNI and address of a DIPProbe.targetKey.
func parseTargetKey(key string) (uint32, netip.AddrPort, bool) {
	parts := strings.SplitN(key, "/", 3)
	if len(parts) != 3 {
		return 0, netip.AddrPort{}, false
	}
	vni, err := strconv.ParseUint(parts[1], 10, 32)
	if err != nil {
		return 0, netip.AddrPort{}, false
	}
	ap, err := netip.ParseAddrPort(parts[2])
	if err != nil {
		return 0, netip.AddrPort{}, false
	}
	return uint32(vni), ap, true
}

// dial opens a probe connection through the VM port named in the probe's
// target key, from the host's address when the DIP is of its family.
func (p *dipProber) dial(ctx context.Context, network, address string) (net.Conn, error) {
	key := health.TargetKey(ctx)
	ifname, _, ok := strings.Cut(key, "/")
	if !ok || ifname == "" {
		return nil, fmt.Errorf("hostagent: probe of %s: no VM port in target key %q", address, key)
	}
	d := net.Dialer{Control: bindToDevice(ifname)}
	p.mu.Lock()
	src := p.source
	p.mu.Unlock()
	if ap, err := netip.ParseAddrPort(address); err == nil && src.IsValid() && ap.Addr().Unmap().Is4() == src.Unmap().Is4() {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
	}
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, fmt.Errorf("through %s: %w", ifname, err)
	}
	return c, nil
}
