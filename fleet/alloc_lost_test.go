package fleet

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/flow"
)

// lossyKV is etcd's KV whose conditional transactions that lose picks
// report an error once committed, up to limit of them, the first of them
// only once one succeeded: their responses were lost (a timeout, a
// connection reset, a leader change after the commit), so the caller
// cannot tell whether they took effect.
type lossyKV struct {
	clientv3.KV
	lose  func(ops []clientv3.Op) bool
	limit int

	mu   sync.Mutex
	lost int
}

func (l *lossyKV) setLimit(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.limit = n
}

func (l *lossyKV) Txn(ctx context.Context) clientv3.Txn {
	return &lossyTxn{Txn: l.KV.Txn(ctx), kv: l}
}

func (l *lossyKV) losses() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

type lossyTxn struct {
	clientv3.Txn
	kv   *lossyKV
	cond bool
	ops  []clientv3.Op
}

func (t *lossyTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cond = t.cond || len(cs) > 0
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *lossyTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.ops = append(t.ops, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *lossyTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *lossyTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err != nil || !t.cond {
		return resp, err
	}
	t.kv.mu.Lock()
	defer t.kv.mu.Unlock()
	if t.kv.lost < t.kv.limit && (t.kv.lost > 0 || resp.Succeeded) && t.kv.lose(t.ops) {
		t.kv.lost++
		return nil, errors.New("etcd: the response was lost (test)")
	}
	return resp, err
}

// runLossyHost is runHost with a client whose KV is lossy.
func runLossyHost(t *testing.T, e *etcd, name string, cfg PortAllocatorConfig, lossy *lossyKV, dips ...OutboundDIP) *host {
	return runHostVia(t, e, name, cfg, func(c *clientv3.Client) *clientv3.Client {
		lossy.KV = c.KV
		return &clientv3.Client{KV: lossy, Lease: c.Lease, Watcher: c.Watcher}
	}, dips...)
}

// firstOp picks the transactions whose first operation is a put (del:
// a delete) of a key under prefix.
func firstOp(prefix string, del bool) func([]clientv3.Op) bool {
	return func(ops []clientv3.Op) bool {
		return len(ops) > 0 && ops[0].IsDelete() == del && ops[0].IsPut() == !del &&
			strings.HasPrefix(string(ops[0].KeyBytes()), prefix)
	}
}

// TestAllocatorResponseLost: a claim or a return whose transaction took
// effect but whose response was lost leaves the host's ranges as etcd
// has them. Before, a claim whose response was lost stayed in etcd under
// the host's live lease but was never the host's (the allocator claimed
// another one, and the first was kept alive, unused, for as long as the
// Host Agent ran); and a range whose return's response was lost was
// given back to the Host Agent while etcd held it free, so another host
// claimed it and both translated with its ports.
func TestAllocatorResponseLost(t *testing.T) {
	k := newKeys("")
	t.Run("claim", func(t *testing.T) {
		e := startEtcd(t)
		lossy := &lossyKV{lose: firstOp(k.portClaims(), false), limit: 1}
		h := runLossyHost(t, e, "host-1", PortAllocatorConfig{}, lossy, outDIP(1, 1, 16))
		eventually(t, "a claim's response lost", func() bool { return lossy.losses() == 1 })
		eventually(t, "one range", func() bool { return len(h.nat.held()) == 1 })
		h.nat.settle(t, 5)
		assert.Equal(t, firsts(h.nat.held()), keysOf(claimsIn(t, e, k.portClaims())),
			"the host's claims in etcd are the ranges it holds")
	})
	t.Run("return", func(t *testing.T) {
		e := startEtcd(t)
		clk := &fakeClock{t: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
		// Every return's response is lost, the first return's having
		// taken effect: host-1 is cut off from etcd just then.
		lossy := &lossyKV{lose: firstOp(k.portClaims(), true), limit: 1 << 30}
		// A pool of two units: one kept busy, the other returned.
		h1 := runLossyHost(t, e, "host-1", PortAllocatorConfig{Idle: time.Minute, Now: clk.now}, lossy, outDIP(1, 1, 2))
		eventually(t, "one range", func() bool { return len(h1.nat.held()) == 1 })
		busy := h1.nat.held()[0].First
		h1.nat.set(busy, 64, 64)
		eventually(t, "two ranges", func() bool { return len(h1.nat.held()) == 2 })
		idle := slices.DeleteFunc(firsts(h1.nat.held()), func(f uint16) bool { return f == busy })[0]
		h1.nat.set(busy, 1, 1)
		clk.add(time.Minute)
		eventually(t, "a return's response lost", func() bool { return lossy.losses() >= 1 })
		// A connection takes a port of the returned range if the Host
		// Agent has it.
		for range 10 {
			h1.nat.settle(t, 1)
			if h1.nat.connectIfHeld(idle) {
				break
			}
		}
		lossy.setLimit(0) // etcd answers again
		h1.nat.settle(t, 3)

		h2 := runHost(t, e, "host-2", PortAllocatorConfig{}, outDIP(2, 2, 2))
		eventually(t, "host-2 claims the returned range", func() bool { return len(h2.nat.held()) == 1 })
		h1.nat.settle(t, 3)
		for _, a := range h1.nat.held() {
			assert.False(t, slices.ContainsFunc(h2.nat.held(), func(b flow.PortAllocation) bool { return a.First == b.First }),
				"range %d held by both hosts", a.First)
		}
		assert.Equal(t, []uint16{busy}, firsts(h1.nat.held()))
	})
}

// connectIfHeld gives the range of first port first a connection if the
// Host Agent translates with it now, and reports whether it did.
func (n *fakeNAT) connectIfHeld(first uint16) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !slices.Contains(firsts(n.allocs), first) {
		return false
	}
	n.use[first] = [2]int{1, 1}
	return true
}
