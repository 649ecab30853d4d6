package fleet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// sweepDelay is the time to the next sweep: Sweep on average, spread
// over half of it to one and a half. Every allocator keeps this timer;
// only the fleet's sweeper sweeps when it fires (sweepAsSweeper), so a
// newly elected one sweeps at its next tick.
func (a *PortAllocator) sweepDelay() time.Duration {
	return a.cfg.Sweep/2 + rand.N(a.cfg.Sweep)
}

// leadership is the sweeper election an allocator won: its key under
// ports.sweeper/ and the key's create revision. The key is its own
// while that revision is the key's, and, being the first created then,
// it stays the first: a sweep's transactions compare it (cmp), so that
// no sweep reads or cools anything once the key is gone (the lease
// lost, the key deleted), whatever this allocator believes yet.
type leadership struct {
	key     string
	rev     int64
	deposed chan struct{} // closed by the sweep that found the key gone
}

func (l *leadership) cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev)
}

// errNotSweeper is a sweep's answer when its leadership's key was not
// its own any more.
var errNotSweeper = errors.New("fleet: not the sweeper any more")

// campaign runs for the fleet's sweeper (a concurrency.Election under
// ports.sweeper, with sess's lease: the allocator's own, so that a dead
// or cut-off Host Agent's candidacy ends with its claims) until ctx is
// done: run's end, when Run's context is canceled or the lease is lost.
// Elected, it is the sweeper (a.leader) until then, or until a sweep
// found its key gone, when it campaigns again. Stopping (stopping, Run's
// context, canceled) it withdraws its key, so that another allocator is
// elected at once rather than when the lease expires.
func (a *PortAllocator) campaign(ctx, stopping context.Context, sess *concurrency.Session) {
	// Election.Campaign, canceled, resigns under its client's context,
	// which must not wait on an etcd that may be gone: the election's
	// client is etcd's, under ctx. Its session is a second one on sess's
	// lease (the election takes its client from a session); orphaned, it
	// stops only its own keep-alive. Closing that client would close the
	// shared lessor and watcher: it is not closed, ctx ends it.
	c := clientv3.NewCtxClient(ctx)
	c.KV, c.Lease, c.Watcher = a.cfg.Client.KV, a.cfg.Client.Lease, a.cfg.Client.Watcher
	es, err := concurrency.NewSession(c, concurrency.WithLease(sess.Lease()), concurrency.WithContext(ctx))
	if err != nil { // the lessor is closed: so is the allocator's session
		a.cfg.Logger.Warn("fleet: sweeper election", "err", err)
		return
	}
	defer es.Orphan()
	e := concurrency.NewElection(es, a.k.portSweeper())
	for ctx.Err() == nil {
		if err := e.Campaign(ctx, a.cfg.Host); err != nil {
			switch {
			case ctx.Err() != nil:
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				// The lease is gone: the session's next keep-alive says
				// so and ends this run; a new lease campaigns again.
				a.cfg.Logger.Warn("fleet: sweeper election: the allocation lease is gone", "err", err)
				<-ctx.Done()
			default:
				a.cfg.Logger.Warn("fleet: sweeper election", "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		l := &leadership{key: e.Key(), rev: e.Rev(), deposed: make(chan struct{})}
		a.leader.Store(l)
		a.cfg.Logger.Info("fleet: this allocator is the fleet's sweeper", "host", a.cfg.Host, "key", l.key)
		why := "its election key is gone"
		select {
		case <-l.deposed:
		case <-ctx.Done():
			why = "its lease is lost"
			if stopping.Err() != nil {
				why = "it stops"
			}
		}
		a.leader.CompareAndSwap(l, nil)
		a.cfg.Logger.Info("fleet: this allocator is no longer the fleet's sweeper", "host", a.cfg.Host, "why", why)
	}
	if stopping.Err() != nil {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = a.cfg.Client.Delete(rctx, fmt.Sprintf("%s/%x", a.k.portSweeper(), sess.Lease()))
		cancel()
	}
}

// Sweeper says whether this allocator is the fleet's sweeper now.
func (a *PortAllocator) Sweeper() bool { return a.leader.Load() != nil }

// sweepAsSweeper sweeps if this allocator is the fleet's sweeper, on
// condition that it still is (the sweep's transactions compare its
// election key); a sweep that finds it is not any more deposes it, and
// campaign runs again. An allocator that is not the sweeper forgets the
// cooling guards it saw: a sweep of its own, if it is elected, reads
// them again.
func (a *PortAllocator) sweepAsSweeper(ctx context.Context, want map[dipKey]OutboundDIP) error {
	l := a.leader.Load()
	if l == nil {
		a.coolingSeen = nil
		return nil
	}
	err := a.sweep(ctx, want, l.cmp())
	if errors.Is(err, errNotSweeper) {
		if a.leader.CompareAndSwap(l, nil) {
			close(l.deposed)
		}
		return nil
	}
	return err
}

// sweep starts the guard time (cool) of every guard of the fleet whose
// claim is gone and which is not cooling yet, wherever it lies. A claimer
// starts it for the guards of the pool it claims from; a guard left in a
// pool nobody claims from any more — a pool removed from the document, a
// dead host removed from it while the pool's other DIPs hold what they
// need — would otherwise stay forever: the Muxes would keep its range as
// the dead host's, and a pool added back would find it guarded. The
// guard time is the same as a claimer's, started as late or later, so
// the sweep hands no port to another DIP sooner than a claimer would.
//
// Left alone are a guard with a claim in its ports (cool compares that
// in its write: a holder that takes its range back between the sweep's
// read and its write keeps it) and the guards of this host's own wanted
// DIPs, which it takes back (adopt).
//
// The sweep reads every claim and guard key without their values, and
// the values of the VIPs whose keys show such a guard. Keys alone do not
// say whether a guard cools: etcd answers a keys-only read from its
// index, without leases (Lease is 0 in every answer since etcd 3.7). So
// the sweep remembers the guards it read cooling, with their
// ModRevision: a guard's lease changes only with a put, which changes
// that, so a guard remembered and unchanged still cools and its VIP is
// not read again for it (else every sweep, fleet-wide, would read in
// full every VIP where a dead host's guards cool, for the guard time).
//
// The read of the keys and every write of the sweep are on condition
// that cond holds (the sweeper's election key is still its own:
// sweepAsSweeper): a read that finds it false is errNotSweeper, a write
// is left undone.
func (a *PortAllocator) sweep(ctx context.Context, want map[dipKey]OutboundDIP, cond ...clientv3.Cmp) error {
	resp, err := a.cfg.Client.Txn(ctx).If(cond...).Then(
		clientv3.OpGet(a.k.portClaims(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(a.k.portGuards(), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return errNotSweeper
	}
	a.sweeps.Add(1)
	claimed := map[rangeID]bool{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if vip, first, ok := parsePortKey(a.k.portClaims(), string(kv.Key)); ok {
			claimed[rangeID{vip, first}] = true
		}
	}
	var vips []netip.Addr
	seen := map[rangeID]int64{} // the cooling guards to remember
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		vip, first, ok := parsePortKey(a.k.portGuards(), string(kv.Key))
		id := rangeID{vip, first}
		if !ok || kv.Lease != 0 || claimed[id] {
			continue
		}
		if mod, ok := a.coolingSeen[id]; ok && mod == kv.ModRevision {
			seen[id] = mod
			continue
		}
		if !slices.Contains(vips, vip) {
			vips = append(vips, vip)
		}
	}
	a.coolingSeen = seen
	for _, vip := range vips {
		st, err := a.read(ctx, vip)
		if err != nil {
			return err
		}
		var orphans []uint16
		for first, g := range st.guards {
			if _, ok := st.claims[first]; ok {
				continue
			}
			if g.lease != 0 {
				seen[rangeID{vip, first}] = g.mod
				continue
			}
			if _, ok := want[dipKey{vip, g.DIP, g.VNI}]; ok && g.Host == a.cfg.Host {
				continue // this host's own: adopt takes it back
			}
			orphans = append(orphans, first)
		}
		slices.Sort(orphans)
		if len(orphans) > 0 {
			if err := a.cool(ctx, vip, st, orphans, true, cond...); err != nil {
				return err
			}
		}
	}
	return nil
}
