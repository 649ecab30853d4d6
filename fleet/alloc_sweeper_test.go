package fleet

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// runSweepers starts n allocators, host-1 to host-n, one DIP each, all
// sweeping every 20 ms if elected, under cfg otherwise.
func runSweepers(t *testing.T, e *etcd, n int, cfg PortAllocatorConfig) []*host {
	t.Helper()
	cfg.Sweep = 20 * time.Millisecond
	var hosts []*host
	for i := 1; i <= n; i++ {
		hosts = append(hosts, runHost(t, e, fmt.Sprintf("host-%d", i), cfg, outDIP(i, i, 8)))
	}
	return hosts
}

// theSweeper is the one of hosts that says it is the sweeper; nil when
// none or several do.
func theSweeper(hosts []*host) *host {
	var s *host
	for _, h := range hosts {
		if h.a.Sweeper() {
			if s != nil {
				return nil
			}
			s = h
		}
	}
	return s
}

// campaigning counts the goroutines in a PortAllocator's campaign.
func campaigning() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte("fleet.(*PortAllocator).campaign("))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestAllocatorOneSweeper: of three allocators on one etcd, all with a
// short Sweep, one is elected the fleet's sweeper and sweeps; the others
// never do. The fleet makes one sweep per Sweep, not one per host.
func TestAllocatorOneSweeper(t *testing.T) {
	e := startEtcd(t)
	hosts := runSweepers(t, e, 3, PortAllocatorConfig{})
	eventually(t, "every allocator a candidate", func() bool {
		r, err := e.client.Get(context.Background(), newKeys("").portSweeper()+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 3
	})
	eventually(t, "one sweeper", func() bool { return theSweeper(hosts) != nil })
	s := theSweeper(hosts)
	n := s.a.Counters().Sweeps
	eventually(t, "ten sweeps more", func() bool { return s.a.Counters().Sweeps >= n+10 })
	for _, h := range hosts {
		c := h.a.Counters()
		if h == s {
			assert.True(t, c.Sweeper)
			continue
		}
		assert.False(t, c.Sweeper, "%s", h.a.cfg.Host)
		assert.Zero(t, c.Sweeps, "%s never sweeps", h.a.cfg.Host)
	}
}

// TestAllocatorSweeperTakesOver: when the sweeper's allocator stops, or
// its lease is lost while it runs, another allocator is elected and
// sweeps, and the old one sweeps no more (its sweeps compare its
// election key, gone with its lease, whatever it believes yet). The
// leases are of a minute: a stopped sweeper withdraws its candidacy,
// the next one does not wait for its lease to expire. Every allocator
// stopped, no campaign goroutine is left.
func TestAllocatorSweeperTakesOver(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, e *etcd, h *host)
	}{
		{"stopped", func(t *testing.T, e *etcd, h *host) { h.stop() }},
		{"lease lost", func(t *testing.T, e *etcd, h *host) {
			// The sweeper's election key is under its allocator's lease.
			r, err := e.client.Get(context.Background(), newKeys("").portSweeper()+"/", clientv3.WithFirstCreate()...)
			require.NoError(t, err)
			require.Len(t, r.Kvs, 1)
			require.Equal(t, h.a.cfg.Host, string(r.Kvs[0].Value))
			_, err = e.client.Revoke(context.Background(), clientv3.LeaseID(r.Kvs[0].Lease))
			require.NoError(t, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEtcd(t)
			hosts := runSweepers(t, e, 3, PortAllocatorConfig{TTL: time.Minute})
			eventually(t, "a sweeper sweeping", func() bool {
				s := theSweeper(hosts)
				return s != nil && s.a.Counters().Sweeps > 0
			})
			old := theSweeper(hosts)
			require.NotNil(t, old)
			tc.end(t, e, old)

			// Another is elected and sweeps, whether or not the old one
			// has seen yet that it is not the sweeper any more.
			var next *host
			eventually(t, "another sweeper sweeping", func() bool {
				for _, h := range hosts {
					if c := h.a.Counters(); h != old && c.Sweeper && c.Sweeps > 0 {
						next = h
						return true
					}
				}
				return false
			})
			was, n := old.a.Counters().Sweeps, next.a.Counters().Sweeps
			eventually(t, "ten sweeps more", func() bool { return next.a.Counters().Sweeps >= n+10 })
			assert.Equal(t, was, old.a.Counters().Sweeps, "the old sweeper sweeps no more")
			eventually(t, "the old sweeper knows it", func() bool { return !old.a.Sweeper() })
			assert.Same(t, next, theSweeper(hosts))
			for _, h := range hosts {
				if h != old && h != next {
					assert.Zero(t, h.a.Counters().Sweeps, "%s never sweeps", h.a.cfg.Host)
				}
			}

			for _, h := range hosts {
				h.stop()
			}
			assert.Zero(t, campaigning(), "Run returned: its campaign is over")
		})
	}
}
