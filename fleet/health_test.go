package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/health"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
)

// overlapDoc has one DIP address in two tenants on one host.
const overlapDoc = `version: 1
vips:
  - name: a
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    probe: {type: tcp}
    backends:
      - {name: vm-a, address: 198.19.1.1, port: 8080, mac: "02:00:00:00:01:01", host: 198.19.0.1}
  - name: b
    address: 198.18.100.2
    protocol: tcp
    port: 80
    vni: 200
    probe: {type: tcp}
    backends:
      - {name: vm-b, address: 198.19.1.1, port: 8080, mac: "02:00:00:00:02:01", host: 198.19.0.1}
hosts:
  - name: host-1
    address: 198.19.0.1
    vms:
      - {vni: 100, address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm-a}
      - {vni: 200, address: 198.19.1.1, mac: "02:00:00:00:02:01", interface: vm-b}
`

// TestHealthPublishAndWatch: a host's verdicts on two tenants' DIPs with
// one address reach a watching Mux apart, follow changes, show apart in
// the fleet's status, and disappear when the host stops publishing.
func TestHealthPublishAndWatch(t *testing.T) {
	e := startEtcd(t)
	_, err := e.apply([]byte(overlapDoc))
	require.NoError(t, err)

	var mu sync.Mutex
	seen := map[string][]health.Verdict{}
	hw, err := NewHealthWatcher(HealthWatcherConfig{Client: e.client, OnReports: func(r map[string][]health.Verdict) {
		mu.Lock()
		defer mu.Unlock()
		for h, vs := range r {
			seen[h] = vs
		}
	}})
	require.NoError(t, err)
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	go hw.Run(wctx)
	<-hw.Ready()

	pub, err := NewHealthPublisher(HealthPublisherConfig{Client: e.client, Host: "host-1", TTL: 2 * time.Second})
	require.NoError(t, err)
	pctx, pcancel := context.WithCancel(context.Background())
	pdone := make(chan struct{})
	go func() { pub.Run(pctx); close(pdone) }()
	dip := netip.MustParseAddr("198.19.1.1")
	now := time.Now().UTC().Truncate(time.Second)
	pub.Publish([]health.Verdict{
		{VNI: 100, Addr: dip, Port: 8080, Up: false, Since: now, Reason: "connection refused"},
		{VNI: 200, Addr: dip, Port: 8080, Up: true, Since: now},
	})
	upOf := func(vni uint32) (up, known bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, v := range seen["host-1"] {
			if v.VNI == vni {
				return v.Up, true
			}
		}
		return false, false
	}
	eventually(t, "both tenants' verdicts, apart", func() bool {
		up100, k100 := upOf(100)
		up200, k200 := upOf(200)
		return k100 && k200 && !up100 && up200
	})

	f, err := ReadStatus(context.Background(), e.client, "")
	require.NoError(t, err)
	r := Report(f, time.Now())
	require.Len(t, r.VIPs, 2)
	assert.Equal(t, "down: connection refused", r.VIPs[0].Backends[0].Health)
	assert.Equal(t, "up", r.VIPs[1].Backends[0].Health)

	// VNI 100's DIP comes back; VNI 200's goes away from the set.
	pub.Publish([]health.Verdict{{VNI: 100, Addr: dip, Port: 8080, Up: true, Since: now}})
	eventually(t, "changes followed", func() bool {
		up100, k100 := upOf(100)
		_, k200 := upOf(200)
		return k100 && up100 && !k200
	})

	// The host stops: its verdicts are gone (revoked at once here; a
	// host that dies takes one lease TTL).
	pcancel()
	<-pdone
	eventually(t, "the host reports nothing", func() bool {
		mu.Lock()
		defer mu.Unlock()
		vs, ok := seen["host-1"]
		return ok && len(vs) == 0
	})
	f, err = ReadStatus(context.Background(), e.client, "")
	require.NoError(t, err)
	assert.Equal(t, "no report", Report(f, time.Now()).VIPs[0].Backends[0].Health)
}

// TestHealthExpiresWithTheHost: a Host Agent that dies (its client gone,
// nothing revoked) has its verdicts expire with its lease.
func TestHealthExpiresWithTheHost(t *testing.T) {
	e := startEtcd(t)
	c2, err := etcdlab.Client(e.cluster.Endpoints())
	require.NoError(t, err)
	pub, err := NewHealthPublisher(HealthPublisherConfig{Client: c2, Host: "host-1", TTL: 2 * time.Second})
	require.NoError(t, err)
	go pub.Run(context.Background()) // never cancelled: the host "dies"
	pub.Publish([]health.Verdict{{VNI: 100, Addr: netip.MustParseAddr("198.19.1.1"), Port: 8080, Up: true}})
	count := func() int {
		r, err := e.client.Get(context.Background(), DefaultPrefix+"health/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		return int(r.Count)
	}
	eventually(t, "published", func() bool { return count() == 1 })
	c2.Close() // no revoke, no keep-alive
	eventually(t, "expired with the lease", func() bool { return count() == 0 })
}

// TestHealthWatcherCoalesces: what changes while OnReports runs is handed
// over in the next call, all of it: twenty hosts publishing one by one
// (twenty transactions, twenty watch responses) while the Mux is busy
// cost it one more call, not twenty.
func TestHealthWatcherCoalesces(t *testing.T) {
	e := startEtcd(t)
	const hosts = 20
	gate := make(chan struct{})
	var mu sync.Mutex
	var calls []map[string][]health.Verdict
	hw, err := NewHealthWatcher(HealthWatcherConfig{Client: e.client, OnReports: func(r map[string][]health.Verdict) {
		mu.Lock()
		calls = append(calls, r)
		first := len(calls) == 1
		mu.Unlock()
		if first {
			<-gate // the Mux is busy
		}
	}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { hw.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	k := newKeys("")
	put := func(h int) {
		v := health.Verdict{VNI: 7, Addr: netip.AddrFrom4([4]byte{198, 19, 1, byte(h + 1)}), Port: 80, Up: true}
		b, _ := json.Marshal(v)
		_, err := e.client.Put(context.Background(), k.health(fmt.Sprintf("h%d", h), v.Key()), string(b))
		require.NoError(t, err)
	}
	put(0)
	eventually(t, "the first report, held", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 1 })
	for h := 1; h < hosts; h++ {
		put(h)
	}
	// Wait (bounded, not asserted) until the watch has read them all.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		hw.mu.Lock()
		n := len(hw.hosts)
		hw.mu.Unlock()
		if n == hosts {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(gate)
	seen := func() map[string]bool {
		mu.Lock()
		defer mu.Unlock()
		m := map[string]bool{}
		for _, c := range calls {
			for h, vs := range c {
				m[h] = len(vs) == 1 && vs[0].Up
			}
		}
		return m
	}
	eventually(t, "every host reported up", func() bool {
		m := seen()
		for h := range hosts {
			if !m[fmt.Sprintf("h%d", h)] {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 2, "one call while busy, one after with everything that came meanwhile")
	assert.Len(t, calls[1], hosts-1)
}
