package fleet

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// sweepDelay is the time to the next sweep: Sweep on average, spread
// over half of it to one and a half, so that a fleet's Host Agents
// started together do not sweep together.
func (a *PortAllocator) sweepDelay() time.Duration {
	return a.cfg.Sweep/2 + rand.N(a.cfg.Sweep)
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
func (a *PortAllocator) sweep(ctx context.Context, want map[dipKey]OutboundDIP) error {
	a.sweeps.Add(1)
	resp, err := a.cfg.Client.Txn(ctx).Then(
		clientv3.OpGet(a.k.portClaims(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(a.k.portGuards(), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return err
	}
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
			if err := a.cool(ctx, vip, st, orphans, true); err != nil {
				return err
			}
		}
	}
	return nil
}
