package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/xdplb/xdplb/flow"
)

// PortAllocatorConfig configures a PortAllocator.
type PortAllocatorConfig struct {
	Client *clientv3.Client // required
	Prefix string           // default DefaultPrefix
	// Host is the host's name in hosts[] (required): claims name it, and
	// a restarted Host Agent gets back the ranges that name it.
	Host string
	// TTL is the claims' lease (default 10s): a Host Agent gone, its
	// claims are deleted this long after.
	TTL time.Duration
	// MaxConnTimeout is the longest a connection of a dead Host Agent may
	// still see packets (the NAT's longest idle timeout, default 1h). A
	// range whose holder's lease expired is claimable by another DIP only
	// Guard = TTL + MaxConnTimeout after a claimer first saw it free.
	MaxConnTimeout time.Duration
	// MinRanges is how many ranges every DIP holds (its own static ones
	// count) before its first connection (default 1).
	MinRanges int
	// HighWater is the share of a DIP's ports in use above which it claims
	// more (default 0.75).
	HighWater float64
	// Idle is how long a range must have had no connection before it is
	// returned, as long as the DIP keeps MinRanges (default 5m).
	Idle time.Duration
	// Interval is how often usage is read and claims made (default 1s);
	// SetDIPs makes one at once.
	Interval time.Duration
	// Sweep is how often, on average, the fleet's sweeper looks through
	// every pool of the fleet for guards whose claim is gone and whose
	// guard time nobody started — pools nobody claims from any more (its
	// section or its holder's host removed from the document), where no
	// claim would ever find them — and starts it (default 10m). One
	// allocator of the fleet sweeps, elected in etcd under its lease
	// (ports.sweeper); another is elected when it stops or its lease is
	// lost. A sweep reads every claim and guard key, without values: at
	// 1,000 hosts of 10 DIPs ~20,000 keys, ~1 MB; with one sweeper that
	// is one sweep per Sweep fleet-wide, whatever the number of hosts
	// (benchmarks/README.md, BenchmarkAllocatorSweep).
	Sweep time.Duration
	// Usage returns the use of every outbound range the Host Agent
	// translates with, and of every range it was given before that still
	// holds a connection, appended to dst (nat computes it; nil: no use is
	// ever seen, so only the minimum is claimed). A range is returned only
	// when Usage, called after OnChange withdrew it, shows no connection
	// on it.
	Usage func(dst []flow.PortRangeUse) []flow.PortRangeUse
	// OnChange is called with every range this host holds whenever that
	// changes (the Host Agent's SetOutboundAllocations), one call at a
	// time, from Run's goroutine.
	OnChange func([]flow.PortAllocation)
	// Now is the clock idleness is measured by (default time.Now; tests
	// drive it). Nothing else in allocation reads a clock: the guard's
	// time is etcd's (a lease).
	Now    func() time.Time
	Logger *slog.Logger
}

// PortAllocatorCounters count what a PortAllocator did.
type PortAllocatorCounters struct {
	// Claims are ranges claimed; Reclaims ranges of this host taken back
	// under a new lease (a restart); Returns ranges given back idle.
	Claims, Reclaims, Returns uint64
	// Conflicts are claims or returns another writer won (the
	// compare-and-swap failed): the allocator reads again and tries
	// another range.
	Conflicts uint64
	// Exhausted counts claims a DIP needed that found no free range in
	// the pool (every unit claimed, static or guarded): once per attempt,
	// every Interval while the pool stays full.
	Exhausted uint64
	// Cooling counts ranges whose holder's lease was found gone and whose
	// guard this allocator started cooling.
	Cooling uint64
	// Swept counts those of Cooling that a sweep found (Sweep): guards
	// left in a pool no claim needed a range of.
	Swept uint64
	// Sweeps are the sweeps made; Sweeper says whether this allocator is
	// the fleet's sweeper now (only the sweeper sweeps).
	Sweeps  uint64
	Sweeper bool
}

// rangeID names one range: its VIP and first port.
type rangeID struct {
	vip   netip.Addr
	first uint16
}

// dipKey names one outbound DIP of a host.
type dipKey struct {
	vip, dip netip.Addr
	vni      uint32
}

func keyOfDIP(d OutboundDIP) dipKey { return dipKey{d.VIP, d.Owner.DIP, d.Owner.VNI} }

// held is a range this host holds.
type held struct {
	id       rangeID
	last     uint16
	dip      dipKey
	owner    flow.PortOwner
	lease    clientv3.LeaseID // the lease its claim is under (0: not retaken since the last one was lost)
	mod      int64            // the claim's ModRevision
	lastUsed time.Time
}

// PortAllocator claims outbound port ranges in etcd for a Host Agent's
// DIPs (see the package documentation, "Outbound port ranges"). SetDIPs
// says which DIPs; Run claims, grows and returns their ranges, and
// hands every change to OnChange.
type PortAllocator struct {
	cfg  PortAllocatorConfig
	k    keys
	poke chan struct{}

	mu   sync.Mutex
	want map[dipKey]OutboundDIP
	out  []flow.PortAllocation // what OnChange was last given

	// Run's own.
	held    map[rangeID]*held
	adopted map[dipKey]bool // DIPs whose ranges this lease has taken back
	// returning are ranges withdrawn from the Host Agent whose return
	// failed without an answer (it may have taken effect, and the range
	// be another host's already): neither held nor reported, their
	// return is tried again until etcd says what became of it.
	returning map[rangeID]*held
	exhausted map[dipKey]bool
	useBuf    []flow.PortRangeUse
	sweepDue  bool // the next step sweeps
	// coolingSeen are the guards without a claim that the last sweep
	// read cooling, or this allocator cooled since, with their
	// ModRevision (see sweep).
	coolingSeen map[rangeID]int64

	claims, reclaims, returns, conflicts, exhaustedN, cooling, swept atomic.Uint64
	sweeps                                                           atomic.Uint64
	leader                                                           atomic.Pointer[leadership] // nil: not the sweeper
}

// NewPortAllocator returns a PortAllocator; nothing is claimed until Run.
func NewPortAllocator(cfg PortAllocatorConfig) (*PortAllocator, error) {
	if cfg.Client == nil {
		return nil, errors.New("fleet: PortAllocatorConfig.Client is nil")
	}
	if cfg.Host == "" || strings.Contains(cfg.Host, "/") {
		return nil, fmt.Errorf("fleet: host %q: want a name without '/'", cfg.Host)
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.MaxConnTimeout <= 0 {
		cfg.MaxConnTimeout = time.Hour
	}
	if cfg.MinRanges <= 0 {
		cfg.MinRanges = 1
	}
	if cfg.HighWater <= 0 || cfg.HighWater > 1 {
		cfg.HighWater = 0.75
	}
	if cfg.Idle <= 0 {
		cfg.Idle = 5 * time.Minute
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Sweep <= 0 {
		cfg.Sweep = 10 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &PortAllocator{cfg: cfg, k: newKeys(cfg.Prefix), poke: make(chan struct{}, 1),
		want: map[dipKey]OutboundDIP{}, held: map[rangeID]*held{}, adopted: map[dipKey]bool{},
		returning: map[rangeID]*held{}, exhausted: map[dipKey]bool{}}, nil
}

// Guard is how long a range whose holder's lease is gone stays
// unclaimable by other DIPs once a claimer has seen it free: TTL +
// MaxConnTimeout.
func (a *PortAllocator) Guard() time.Duration { return a.cfg.TTL + a.cfg.MaxConnTimeout }

// SetDIPs sets the host's outbound DIPs (from each applied document);
// Run claims for new ones at once and returns a removed DIP's ranges once
// no connection holds them. It does not wait.
func (a *PortAllocator) SetDIPs(dips []OutboundDIP) {
	m := make(map[dipKey]OutboundDIP, len(dips))
	for _, d := range dips {
		m[keyOfDIP(d)] = d
	}
	a.mu.Lock()
	a.want = m
	a.mu.Unlock()
	a.Poke()
}

// Poke makes Run read usage and claim now, not at the next Interval.
func (a *PortAllocator) Poke() {
	select {
	case a.poke <- struct{}{}:
	default:
	}
}

// Allocations are the ranges this host holds, as OnChange was last given
// them.
func (a *PortAllocator) Allocations() []flow.PortAllocation {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.out)
}

// Counters returns what the allocator has done so far.
func (a *PortAllocator) Counters() PortAllocatorCounters {
	return PortAllocatorCounters{Claims: a.claims.Load(), Reclaims: a.reclaims.Load(), Returns: a.returns.Load(),
		Conflicts: a.conflicts.Load(), Exhausted: a.exhaustedN.Load(), Cooling: a.cooling.Load(), Swept: a.swept.Load(),
		Sweeps: a.sweeps.Load(), Sweeper: a.Sweeper()}
}

// Run claims and returns ranges until ctx is done. While etcd is
// unreachable it keeps what it holds (OnChange is not called: the data
// path keeps translating) and retries; a lease lost meanwhile is replaced
// and this host's ranges taken back under the new one. Stopping does not
// revoke the lease: the claims live one TTL more, so that a Host Agent
// restarting within it keeps its ranges without the Muxes seeing a gap;
// it withdraws from the sweeper election (campaign), so that another
// allocator sweeps. Run returns once every goroutine it started is done.
func (a *PortAllocator) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(a.cfg.Client, concurrency.WithTTL(int((a.cfg.TTL+time.Second-1)/time.Second)),
			concurrency.WithContext(ctx))
		if err != nil {
			a.cfg.Logger.Warn("fleet: allocation lease", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		a.run(ctx, sess)
		sess.Orphan()
	}
	return nil
}

func (a *PortAllocator) run(ctx context.Context, sess *concurrency.Session) {
	clear(a.adopted) // a new lease: every DIP's ranges are taken back under it
	for _, h := range a.held {
		if h.lease != sess.Lease() {
			h.lease = 0
		}
	}
	tick := time.NewTicker(a.cfg.Interval)
	defer tick.Stop()
	sweep := time.NewTimer(a.sweepDelay())
	defer sweep.Stop()
	// The sweeper election, under this lease; ended (and waited for) with
	// this run.
	cctx, cancel := context.WithCancel(sess.Ctx())
	var wg sync.WaitGroup
	wg.Go(func() { a.campaign(cctx, ctx, sess) })
	defer wg.Wait()
	defer cancel()
	for {
		if leaseLost(ctx, sess, a.cfg.Logger, "allocation") {
			return
		}
		// Under the session's context: a step waiting for an etcd that is
		// gone ends when the lease is lost.
		sctx, cancel := context.WithTimeout(sess.Ctx(), 10*time.Second)
		err := a.step(sctx, sess.Lease())
		cancel()
		if err != nil && ctx.Err() == nil && sess.Ctx().Err() == nil {
			a.cfg.Logger.Warn("fleet: port allocation", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-sess.Done():
		case <-tick.C:
		case <-a.poke:
		case <-sweep.C:
			a.sweepDue = true
			sweep.Reset(a.sweepDelay())
		}
	}
}

// step takes back this host's ranges for DIPs not adopted yet under
// lease, claims what DIPs lack, returns idle ranges, and reports a
// change.
func (a *PortAllocator) step(ctx context.Context, lease clientv3.LeaseID) error {
	a.mu.Lock()
	want := a.want
	a.mu.Unlock()
	dips := make([]OutboundDIP, 0, len(want))
	for _, d := range want {
		dips = append(dips, d)
	}
	slices.SortFunc(dips, func(x, y OutboundDIP) int { return compareDIPKeys(keyOfDIP(x), keyOfDIP(y)) })
	defer a.report()
	for _, d := range dips {
		if k := keyOfDIP(d); !a.adopted[k] {
			done, err := a.adopt(ctx, lease, d)
			if err != nil {
				return err
			}
			a.adopted[k] = done
		}
	}
	// Ranges under a lost lease whose DIP is no longer wanted are not
	// taken back: their guards cool and free them (a claimer of their
	// pool, or a sweep, starts their guard time).
	for id, h := range a.held {
		if _, ok := want[h.dip]; !ok && h.lease != lease {
			delete(a.held, id)
		}
	}
	use := a.usage()
	now := a.cfg.Now()
	for _, h := range a.held {
		if use[h.id].Conns > 0 {
			h.lastUsed = now
		}
	}
	var idle []*held
	for _, d := range dips {
		k := keyOfDIP(d)
		if !a.adopted[k] {
			continue // its own ranges first: the next step tries again
		}
		mine := a.rangesOf(k)
		total, used := 0, 0
		for _, h := range mine {
			total += int(h.last) - int(h.id.first) + 1
			used += use[h.id].Ports
		}
		for _, r := range d.Own {
			total += r.Len()
			used += use[rangeID{d.VIP, r.First}].Ports
		}
		n := len(mine) + len(d.Own)
		need := 0
		switch {
		case n < a.cfg.MinRanges:
			need = a.cfg.MinRanges - n
		case total > 0 && float64(used) >= a.cfg.HighWater*float64(total):
			// Enough units to bring the use below the mark.
			need = int((float64(used)/a.cfg.HighWater-float64(total))/float64(max(d.Unit, 1))) + 1
		}
		for range need {
			ok, err := a.claim(ctx, lease, d)
			if err != nil {
				// The claim may have taken effect all the same: the next
				// step reads what etcd holds under this lease again.
				a.adopted[k] = false
				return err
			}
			if !ok {
				break
			}
		}
		if need > 0 {
			continue
		}
		for _, h := range mine {
			if n > a.cfg.MinRanges && use[h.id].Conns == 0 && now.Sub(h.lastUsed) >= a.cfg.Idle {
				idle = append(idle, h)
				n--
			}
		}
	}
	for _, h := range a.held {
		if _, ok := want[h.dip]; !ok && use[h.id].Conns == 0 {
			idle = append(idle, h)
		}
	}
	if err := a.giveBack(ctx, lease, idle); err != nil {
		return err
	}
	if a.sweepDue {
		if err := a.sweepAsSweeper(ctx, want); err != nil {
			return err
		}
		a.sweepDue = false
	}
	return nil
}

func compareDIPKeys(x, y dipKey) int {
	return cmp.Or(x.vip.Compare(y.vip), x.dip.Compare(y.dip), cmp.Compare(x.vni, y.vni))
}

// rangesOf are the ranges held for k, by first port.
func (a *PortAllocator) rangesOf(k dipKey) []*held {
	var out []*held
	for _, h := range a.held {
		if h.dip == k {
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(x, y *held) int { return cmp.Compare(x.id.first, y.id.first) })
	return out
}

func (a *PortAllocator) usage() map[rangeID]flow.PortRangeUse {
	m := map[rangeID]flow.PortRangeUse{}
	if a.cfg.Usage == nil {
		return m
	}
	a.useBuf = a.cfg.Usage(a.useBuf[:0])
	for _, u := range a.useBuf {
		m[rangeID{u.VIP, u.First}] = u
	}
	return m
}

// report hands the held ranges to OnChange if they changed.
func (a *PortAllocator) report() {
	out := make([]flow.PortAllocation, 0, len(a.held))
	for _, h := range a.held {
		out = append(out, flow.PortAllocation{VIP: h.id.vip, First: h.id.first, Last: h.last, Owner: h.owner})
	}
	slices.SortFunc(out, func(x, y flow.PortAllocation) int {
		return cmp.Or(x.VIP.Compare(y.VIP), cmp.Compare(x.First, y.First))
	})
	a.mu.Lock()
	same := slices.Equal(out, a.out)
	if !same {
		a.out = out
	}
	a.mu.Unlock()
	if !same && a.cfg.OnChange != nil {
		a.cfg.OnChange(out)
	}
}

// vipState is one consistent read of a VIP's claims and guards.
type vipState struct {
	claims, guards map[uint16]recordKV
}

type recordKV struct {
	PortClaim
	mod   int64
	lease int64
}

func (a *PortAllocator) read(ctx context.Context, vip netip.Addr) (vipState, error) {
	cp, gp := a.k.portClaimsOf(vip), a.k.portGuardsOf(vip)
	resp, err := a.cfg.Client.Txn(ctx).Then(clientv3.OpGet(cp, clientv3.WithPrefix()), clientv3.OpGet(gp, clientv3.WithPrefix())).Commit()
	if err != nil {
		return vipState{}, err
	}
	st := vipState{claims: map[uint16]recordKV{}, guards: map[uint16]recordKV{}}
	for i, m := range []map[uint16]recordKV{st.claims, st.guards} {
		prefix := []string{a.k.portClaims(), a.k.portGuards()}[i]
		for _, kv := range resp.Responses[i].GetResponseRange().Kvs {
			v, first, ok1 := parsePortKey(prefix, string(kv.Key))
			c, ok2 := decodeClaim(kv.Value)
			if ok1 && ok2 && v == vip && c.Last >= first {
				m[first] = recordKV{PortClaim: c, mod: kv.ModRevision, lease: kv.Lease}
			}
		}
	}
	return st, nil
}

func (a *PortAllocator) mine(c PortClaim, k dipKey) bool {
	return c.Host == a.cfg.Host && c.DIP == k.dip && c.VNI == k.vni
}

func (a *PortAllocator) claimOf(d OutboundDIP, last uint16, lease clientv3.LeaseID) string {
	c := PortClaim{Last: last, Host: a.cfg.Host, HostAddr: d.Owner.Host, DIP: d.Owner.DIP, VNI: d.Owner.VNI,
		Lease: int64(lease)}
	if d.Owner.MAC != ([6]byte{}) {
		c.MAC = net.HardwareAddr(d.Owner.MAC[:]).String()
	}
	b, _ := json.Marshal(c)
	return string(b)
}

// noKeys compares true when no key of vipPrefix lies in first..last.
func noKeys(vipPrefix string, first, last uint16) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(portKey(vipPrefix, int(first))), "=", 0).
		WithRange(portKey(vipPrefix, int(last)+1))
}

// put writes d's claim of first..last under lease and its guard (no
// lease) if cond holds.
func (a *PortAllocator) put(ctx context.Context, lease clientv3.LeaseID, d OutboundDIP, first, last uint16, cond ...clientv3.Cmp) (int64, bool, error) {
	v := a.claimOf(d, last, lease)
	resp, err := a.cfg.Client.Txn(ctx).If(cond...).Then(
		clientv3.OpPut(a.k.portClaim(d.VIP, first), v, clientv3.WithLease(lease)),
		clientv3.OpPut(a.k.portGuard(d.VIP, first), v)).Commit()
	if err != nil {
		return 0, false, err
	}
	return resp.Header.Revision, resp.Succeeded, nil
}

// adopt takes back, under lease, every range whose claim or guard names
// this host and d (a restart: the claims of the old lease may still
// live, or be gone with their guards left), and drops held ranges of d
// that are someone else's now. It is not done (false) when a take lost a
// race (another host started a guard's cooling meanwhile): the next
// step reads again and retries.
func (a *PortAllocator) adopt(ctx context.Context, lease clientv3.LeaseID, d OutboundDIP) (bool, error) {
	k := keyOfDIP(d)
	st, err := a.read(ctx, d.VIP)
	if err != nil {
		return false, err
	}
	found := map[uint16]bool{}
	raced := false
	hold := func(first uint16, c recordKV, rev int64) {
		found[first] = true
		h := a.held[rangeID{d.VIP, first}]
		if h == nil {
			h = &held{id: rangeID{d.VIP, first}, lastUsed: a.cfg.Now()}
			a.held[h.id] = h
		}
		h.last, h.dip, h.owner, h.lease, h.mod = c.Last, k, d.Owner, lease, rev
	}
	take := func(first uint16, c recordKV, cond ...clientv3.Cmp) error {
		rev, ok, err := a.put(ctx, lease, d, first, c.Last, cond...)
		switch {
		case err != nil:
			return err
		case !ok:
			a.conflicts.Add(1)
			raced = true
			return nil
		}
		a.reclaims.Add(1)
		hold(first, c, rev)
		return nil
	}
	for first, c := range st.claims {
		if _, r := a.returning[rangeID{d.VIP, first}]; r || !a.mine(c.PortClaim, k) {
			continue
		}
		if clientv3.LeaseID(c.lease) == lease {
			// Already under this lease: held, or claimed (or taken back)
			// by a write whose answer was lost.
			hold(first, c, c.mod)
			continue
		}
		if err := take(first, c, clientv3.Compare(clientv3.ModRevision(a.k.portClaim(d.VIP, first)), "=", c.mod)); err != nil {
			return false, err
		}
	}
	for first, g := range st.guards {
		_, r := a.returning[rangeID{d.VIP, first}]
		if _, claimed := st.claims[first]; claimed || r || !a.mine(g.PortClaim, k) {
			continue
		}
		// Its guard unchanged (cooling or not) and no claim in its ports:
		// the same host and DIP get their ports back at once.
		err := take(first, g, clientv3.Compare(clientv3.ModRevision(a.k.portGuard(d.VIP, first)), "=", g.mod),
			noKeys(a.k.portClaimsOf(d.VIP), first, g.Last))
		if err != nil {
			return false, err
		}
	}
	if raced {
		return false, nil
	}
	for id, h := range a.held {
		if h.dip == k && !found[id.first] {
			a.cfg.Logger.Warn("fleet: outbound range lost: another DIP holds it now", "vip", id.vip, "first", id.first, "dip", k.dip)
			delete(a.held, id)
		}
	}
	return true, nil
}

// claim claims one free range of d's pool; false when there is none.
func (a *PortAllocator) claim(ctx context.Context, lease clientv3.LeaseID, d OutboundDIP) (bool, error) {
	k := keyOfDIP(d)
	st, err := a.read(ctx, d.VIP)
	if err != nil {
		return false, err
	}
	var taken [65536 / 64]uint64
	mark := func(first, last uint16) {
		for p := int(first); p <= int(last); p++ {
			taken[p>>6] |= 1 << (p & 63)
		}
	}
	for _, r := range d.Static {
		mark(r.First, r.Last)
	}
	for first, c := range st.claims {
		mark(first, c.Last)
	}
	var orphans []uint16 // guards whose claim is gone, not cooling yet
	for first, g := range st.guards {
		mark(first, g.Last)
		if _, claimed := st.claims[first]; !claimed && g.lease == 0 && !a.mine(g.PortClaim, k) {
			orphans = append(orphans, first)
		}
	}
	if len(orphans) > 0 {
		if err := a.cool(ctx, d.VIP, st, orphans, false); err != nil {
			return false, err
		}
	}
	var free []uint16
	u := int(max(d.Unit, 1))
	for _, p := range d.Pool {
		for b := (int(p.First) + u - 1) / u * u; b+u-1 <= int(p.Last); b += u {
			isFree := true
			for q := b; q < b+u && isFree; q++ {
				isFree = taken[q>>6]&(1<<(q&63)) == 0
			}
			if isFree {
				free = append(free, uint16(b))
			}
		}
	}
	// Hosts claiming at once start at random places, so that they seldom
	// race for one range.
	off := 0
	if len(free) > 1 {
		off = rand.IntN(len(free))
	}
	for i := range free {
		first := free[(off+i)%len(free)]
		last := uint16(int(first) + u - 1)
		cp, gp := a.k.portClaimsOf(d.VIP), a.k.portGuardsOf(d.VIP)
		rev, ok, err := a.put(ctx, lease, d, first, last, noKeys(cp, first, last), noKeys(gp, first, last))
		if err != nil {
			return false, err
		}
		if !ok {
			a.conflicts.Add(1)
			continue
		}
		a.claims.Add(1)
		a.held[rangeID{d.VIP, first}] = &held{id: rangeID{d.VIP, first}, last: last, dip: k, owner: d.Owner,
			lease: lease, mod: rev, lastUsed: a.cfg.Now()}
		if a.exhausted[k] {
			delete(a.exhausted, k)
			a.cfg.Logger.Info("fleet: outbound pool has room again", "vip", d.VIP, "dip", d.Owner.DIP)
		}
		return true, nil
	}
	a.exhaustedN.Add(1)
	if !a.exhausted[k] {
		a.exhausted[k] = true
		a.cfg.Logger.Warn("fleet: outbound pool exhausted: no free range to claim", "vip", d.VIP, "dip", d.Owner.DIP,
			"claimed", len(st.claims), "guarded", len(st.guards)-len(st.claims))
	}
	return false, nil
}

// cool starts the guard time of ranges whose holder's claim is gone: each
// guard is put again under one new lease of Guard's length, which nobody
// keeps alive; etcd deletes the guards when it expires, and the ranges
// are free. A guard changed meanwhile (its holder took it back) or with
// a claim in its ports is left, and all are when cond, the sweeper's
// election, does not hold. swept says a sweep found them.
func (a *PortAllocator) cool(ctx context.Context, vip netip.Addr, st vipState, firsts []uint16, swept bool, cond ...clientv3.Cmp) error {
	ttl := int64(math.Ceil(a.Guard().Seconds()))
	g, err := a.cfg.Client.Grant(ctx, ttl)
	if err != nil {
		return err
	}
	used := false
	cp := a.k.portClaimsOf(vip)
	for _, first := range firsts {
		old := st.guards[first]
		b, _ := json.Marshal(old.PortClaim)
		key := a.k.portGuard(vip, first)
		resp, err := a.cfg.Client.Txn(ctx).If(append([]clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(key), "=", old.mod),
			noKeys(cp, first, old.Last)}, cond...)...,
		).Then(clientv3.OpPut(key, string(b), clientv3.WithLease(g.ID))).Commit()
		if err != nil {
			return err
		}
		if resp.Succeeded {
			used = true
			if a.coolingSeen == nil {
				a.coolingSeen = map[rangeID]int64{}
			}
			a.coolingSeen[rangeID{vip, first}] = resp.Header.Revision // the guard's ModRevision
			a.cooling.Add(1)
			if swept {
				a.swept.Add(1)
			}
			a.cfg.Logger.Info("fleet: outbound range's holder is gone; guarding it", "vip", vip, "first", first,
				"holder", old.Host, "dip", old.DIP, "guard", a.Guard(), "swept", swept)
		}
	}
	if !used {
		_, _ = a.cfg.Client.Revoke(ctx, g.ID)
	}
	return nil
}

// giveBack returns idle ranges: first the Host Agent stops using them
// (OnChange without them), then, if usage still shows no connection on
// them, their claims and guards are deleted; a range a connection took
// meanwhile is kept. A return that failed without an answer (it may have
// taken effect) leaves its range withdrawn (returning) and is tried again
// by the next steps.
func (a *PortAllocator) giveBack(ctx context.Context, lease clientv3.LeaseID, idle []*held) error {
	var err error
	for id, h := range a.returning {
		if h.lease != lease {
			// Its claim went with the lease it was under; its guard, if
			// the return did not take effect, cools as any other.
			delete(a.returning, id)
			continue
		}
		if err = a.drop(ctx, h); err != nil {
			return err
		}
	}
	if len(idle) == 0 {
		return nil
	}
	for _, h := range idle {
		delete(a.held, h.id)
	}
	a.report()
	use := a.usage()
	for _, h := range idle {
		if use[h.id].Conns > 0 || err != nil || h.lease != lease {
			h.lastUsed = a.cfg.Now()
			a.held[h.id] = h
			continue
		}
		err = a.drop(ctx, h)
	}
	return err
}

// drop deletes the claim and guard of h, withdrawn from the Host Agent,
// on condition that the claim is as h last saw it. When etcd gives no
// answer, h is returning: the Host Agent must not have it back, since
// the delete may have taken effect and the range be claimed by another
// host already.
func (a *PortAllocator) drop(ctx context.Context, h *held) error {
	delete(a.returning, h.id)
	ck := a.k.portClaim(h.id.vip, h.id.first)
	resp, err := a.cfg.Client.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ck), "=", h.mod)).
		Then(clientv3.OpDelete(ck), clientv3.OpDelete(a.k.portGuard(h.id.vip, h.id.first))).Commit()
	switch {
	case err != nil:
		a.returning[h.id] = h
		return err
	case !resp.Succeeded:
		a.conflicts.Add(1)
	default:
		a.returns.Add(1)
	}
	return nil
}
