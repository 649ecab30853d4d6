package mux

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// A probed backend that a new version moves — to another address, or to
// another port — is a new probe target: the checker starts it over,
// Unknown, and the backend takes no new flows until its first probe at
// the new place passes, as any backend the Mux has not probed yet. (The
// snapshot used to take the verdict on the old place, Up, and kept it
// until the new place had failed Fall probes.)
func TestMovedBackendIsDownUntilProbed(t *testing.T) {
	const dead = "198.19.99.99" // never answers: its probes hang
	tests := []struct {
		name string
		move func(b *control.Backend)
	}{
		{"another address", func(b *control.Backend) { b.Address = netip.MustParseAddr(dead) }},
		{"another port", func(b *control.Backend) { b.Port = 8080 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := func(version uint64) *control.Document {
				d := scaleDocument(1, 2, true)
				d.Version = version
				s := health.Spec{Type: health.ProbeTCP, Interval: 10 * time.Millisecond, Rise: 1, Fall: 3}.WithDefaults()
				d.VIPs[0].Probe = &s
				return d
			}
			up := map[netip.AddrPort]bool{}
			for _, tg := range targets(doc(1)) {
				up[tg.Addr] = true
			}
			prober := health.ProberFunc(func(ctx context.Context, addr netip.AddrPort, _ health.Spec) error {
				if up[addr] {
					return nil
				}
				<-ctx.Done()
				return ctx.Err()
			})
			var ctl *Controller
			chk, err := health.NewChecker(health.CheckerConfig{Prober: prober,
				OnChanges: func(evs []health.Event) { ctl.HealthChanged(evs...) }})
			require.NoError(t, err)
			ctl, err = NewController(ControllerConfig{Rules: flow.NewRules(), Checker: chk, Announcer: &fakeAnnouncer{}, Logger: quietLog})
			require.NoError(t, err)
			require.NoError(t, ctl.Apply(doc(1)))
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			go func() { ran <- chk.Run(ctx) }()
			defer func() {
				cancel()
				<-ran
			}()
			active := func(i int) bool {
				r := ctl.rules.Load().Rule(0)
				return r.Backends[i].State == flow.BackendActive
			}
			deadline := time.Now().Add(10 * time.Second) // hang guard
			for !active(0) || !active(1) {
				require.False(t, time.Now().After(deadline), "backends never came up")
				time.Sleep(5 * time.Millisecond)
			}

			next := doc(2)
			tt.move(&next.VIPs[0].Backends[0])
			require.NoError(t, ctl.Apply(next))
			st, _ := chk.State("vip0/b0")
			require.Equal(t, health.Unknown, st, "the checker starts the moved target over")
			require.False(t, active(0), "the moved backend takes new flows before a probe at its new place passed")
			require.True(t, active(1), "the backend that stayed keeps its verdict")
		})
	}
}
