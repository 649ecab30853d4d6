package nat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
)

// Drop reasons of the source NAT (SNAT).
var (
	// DropSNATExhausted: a new outbound connection found no free port in
	// its DIP's ranges (none allocated, or every candidate probed holds a
	// connection to the same remote endpoint).
	DropSNATExhausted = engine.RegisterDropReason("snat_exhausted")
	// DropSNATNoState: a packet to an outbound VIP's port without a rule
	// matches no outbound connection.
	DropSNATNoState = engine.RegisterDropReason("snat_no_state")
	// DropSNATTable: the SNAT's state table refused a new connection
	// (full of proven entries, or a bucket busy).
	DropSNATTable = engine.RegisterDropReason("snat_table_full")
)

// SNATConfig is the plain configuration of a SNAT.
type SNATConfig struct {
	// Capacity is the number of IPv4 outbound connections the state is
	// sized for; required. Each connection holds two entries (one per
	// direction), one in each of two flow.ConnTables of this capacity.
	Capacity int
	// IPv6Capacity is the number of IPv6 connections; 0 selects
	// Capacity/8.
	IPv6Capacity int
	// Timeouts are the idle timeouts per state class (flow.Timeouts; zero
	// fields take flow.DefaultTimeouts).
	Timeouts flow.Timeouts
	// Seed keys the hash that picks a new connection's first candidate
	// port. The pick is a function of the connection's 5-tuple and the
	// seed only, so an agent restarted with the same seed picks the same
	// port for a connection whose state it lost, when that port is still
	// free, and the connection survives the restart.
	Seed uint64
	// Clock returns the tables' tick, read once per batch; nil means the
	// tables' own (SNAT.Now). Tests inject synthetic time.
	Clock func() flow.Tick
}

// Outbound is one outbound section as the SNAT needs it: the DIPs of VNI
// that use VIP as their source, and the destinations (Local) that are
// east-west traffic, never translated.
type Outbound struct {
	VIP   netip.Addr
	VNI   uint32
	DIPs  []netip.Addr
	Local []netip.Prefix
}

// SNATStats are a SNAT's counters.
type SNATStats struct {
	Out       uint64 // packets translated DIP:sport → VIP:vport
	In        uint64 // packets translated VIP:vport → DIP:sport
	Local     uint64 // packets of outbound DIPs to local prefixes, passed on untranslated
	Passed    uint64 // packets of outbound DIPs of protocols the SNAT does not translate, passed on untranslated
	Created   uint64 // connections created (a port claimed)
	Reused    uint64 // of those, given a port another live connection (another remote endpoint) holds
	Exhausted uint64 // new connections dropped: no free port
	Closed    uint64 // connections moved to closing (FIN or RST)
	NoState   uint64 // packets to a pool port without state (dropped)
	Refused   uint64 // new connections the table refused (dropped)
	ICMP      uint64 // echo requests and replies translated, and ICMP errors about outbound connections (also in Out and In for echo)
	// Expired counts connections whose state expired or was evicted
	// (their port free again), from the returning table's counters.
	Expired uint64
	// Entries is the number of connections held (idle ones included
	// until aged out).
	Entries int
}

// SNAT is the Host Agent's source NAT for outbound connections: a VM
// whose DIP is listed in an outbound section opens connections with the
// section's VIP as their source. Each connection gets a port of the
// ranges allocated to its DIP (SetAllocations); the replies reach a Mux,
// whose range table sends them to this host, where they are translated
// back. It is shared by every worker and safe for concurrent use; the
// data path is lock-free.
//
// # State
//
// Two flow.ConnTables hold each connection once per direction:
//
//	out: (VNI, proto, DIP:sport → remote:rport)  → vipID<<16 | vport
//	ret: (VNI, proto, remote:rport → VIP:vport)  → dipID<<16 | sport
//
// IDs name the VIP and DIP addresses (with their VNI): they are handed
// out the first time an address is configured and never reused, so an
// entry stays right across configuration changes; a connection whose
// range was withdrawn keeps working until it ends. One whose DIP left the
// outbound sections does not: its Host Agent stops steering the DIP's
// outbound traffic (it leaves untranslated, as before it was steered), and
// a packet of it that still reaches the translator is dropped
// (nat_no_state); the remote's replies are still translated while the
// entries last.
//
// # Ports
//
// A port is unique per (VIP, vport, proto, remote address, remote port):
// the returning key is the lock. A new connection hashes its 5-tuple
// (SNATConfig.Seed) to a first candidate among its DIP's ports and claims
// the returning key of each candidate in turn (flow.ConnTable.
// ClaimPrepared, which never takes a live entry), up to maxProbes of
// them; when none is free the packet is dropped (DropSNATExhausted). A
// port is thus reused for connections to different remote endpoints, and
// a DIP holds many more concurrent connections than its ranges have
// ports.
//
// # Connection states
//
// Both entries are created untrusted, the class with the short timeout
// (flow.Timeouts.Untrusted), which lookups do not extend: a SYN that gets
// no answer frees its port soon. The first packet from the remote that
// is not a SYN (a SYN-ACK, a datagram) proves the connection: established
// for TCP, udp for the rest, with their idle timeouts. A FIN or RST from
// either side moves a proven connection to closing (the time-wait), a
// new SYN of the same 5-tuple after that starts it over. Each direction's
// packets refresh their own entry and, every 1/64 of the timeout, the
// other direction's, so a connection that sends one way only keeps both.
// An expired entry frees the port: the next claim of that key takes it.
type SNAT struct {
	out, ret *flow.ConnTable
	seed     uint64
	refresh  [4]flow.Tick // how stale a proven connection's entry may be before the other direction's is checked, by class
	reuse    flow.Tick    // a port stamped more recently than this holds a live connection (the Reused estimate)
	clock    func() flow.Tick

	mu        sync.Mutex // control plane
	sections  []Outbound
	allocs    []flow.PortAllocation
	withdrawn []flow.PortAllocation
	dipIDs    map[dipKey]uint16
	dipByID   []dipRef
	vipIDs    map[vipKey]uint16
	vipByID   [][16]byte
	stamps    []*portStamps // by VIP ID

	state atomic.Pointer[snatState]

	stripes []snatStripe
}

// maxProbes bounds the ports a new connection tries.
const maxProbes = 64

// maxIDs is the number of distinct DIPs (and VIP addresses) a SNAT can
// name over its life: IDs are 16 bits, 0 unused.
const maxIDs = 1<<16 - 1

type dipKey struct {
	addr [16]byte
	vni  uint32
	fam  uint8
}

type vipKey struct {
	addr [16]byte
	fam  uint8
}

// dipRef is a DIP as the returning path rewrites it.
type dipRef struct {
	addr [16]byte
	vni  uint32
	fam  uint8
}

// portStamps holds per port of a VIP the tick a connection last claimed
// it (0: never), for the Reused estimate.
type portStamps [1 << 16]atomic.Uint32

// snatState is the immutable configuration the data path reads, swapped
// atomically by SetOutbound and SetAllocations.
type snatState struct {
	dips    map[dipKey]*outDIP
	vips    map[vipKey]uint16 // outbound VIP addresses → ID
	dipByID []dipRef          // index = ID (a prefix of the SNAT's, never shrinking)
	vipByID [][16]byte
	stamps  []*portStamps
}

// outDIP is an outbound DIP's configuration.
type outDIP struct {
	id, vipID uint16
	vip       [16]byte
	local     prefixes
	spans     []portSpan // the DIP's ports, in order
	total     uint32     // sum of the spans' lengths
}

// portSpan is a run of ports: first .. first+n-1.
type portSpan struct {
	first uint16
	n     uint32
}

// port returns the i-th port of d's ranges (i < d.total).
func (d *outDIP) port(i uint32) uint16 {
	for _, s := range d.spans {
		if i < s.n {
			return s.first + uint16(i)
		}
		i -= s.n
	}
	return 0
}

// ErrSNATConfig is wrapped by the errors of NewSNAT and SetOutbound.
var ErrSNATConfig = errors.New("nat: invalid SNAT config")

// NewSNAT validates cfg and allocates the state.
func NewSNAT(cfg SNATConfig) (*SNAT, error) {
	tc := flow.ConnTableConfig{Capacity: cfg.Capacity, IPv6Capacity: cfg.IPv6Capacity, Timeouts: cfg.Timeouts}
	out, err := flow.NewConnTable(tc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSNATConfig, err)
	}
	ret, err := flow.NewConnTable(tc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSNATConfig, err)
	}
	s := &SNAT{out: out, ret: ret, seed: cfg.Seed, clock: cfg.Clock,
		dipIDs: map[dipKey]uint16{}, vipIDs: map[vipKey]uint16{},
		dipByID: make([]dipRef, 1), vipByID: make([][16]byte, 1), stamps: make([]*portStamps, 1),
		stripes: make([]snatStripe, statStripes)}
	to := ret.Config().Timeouts
	for c, d := range []time.Duration{to.Untrusted, to.Established, to.Closing, to.UDP} {
		s.refresh[c] = flow.Ticks(d / 64)
	}
	s.reuse = flow.Ticks(max(to.Established, to.UDP))
	if s.clock == nil {
		s.clock = ret.Now
	}
	s.rebuild()
	return s, nil
}

// Timeouts returns the idle timeouts in force.
func (s *SNAT) Timeouts() flow.Timeouts { return s.ret.Config().Timeouts }

// MaxTimeout returns the longest idle timeout of a connection: how long a
// port may still be in use after its range stopped being this host's.
func (s *SNAT) MaxTimeout() time.Duration {
	t := s.Timeouts()
	return max(t.Untrusted, t.Established, t.Closing, t.UDP)
}

// Now returns the current tick of the SNAT's tables (SNATConfig.Clock's
// when set).
func (s *SNAT) Now() flow.Tick { return s.clock() }

// Age removes idle connections (see flow.ConnTable.Age), examining about
// budget slots of each table. Run it from a maintenance goroutine.
func (s *SNAT) Age(now flow.Tick, budget int) (scanned, expired int) {
	s1, e1 := s.ret.Age(now, budget)
	s2, _ := s.out.Age(now, budget)
	return s1 + s2, e1
}

// Tables returns the outgoing and the returning state tables (for metrics
// and debugging).
func (s *SNAT) Tables() (out, ret *flow.ConnTable) { return s.out, s.ret }

// SetOutbound replaces the outbound sections. A DIP listed in two
// sections of one family uses the first.
func (s *SNAT) SetOutbound(sections []Outbound) error {
	for i, o := range sections {
		if !o.VIP.IsValid() || o.VNI > 1<<24-1 {
			return fmt.Errorf("%w: section %d: VIP %v, VNI %d", ErrSNATConfig, i, o.VIP, o.VNI)
		}
		if _, ok := compilePrefixes(o.Local); !ok {
			return fmt.Errorf("%w: section %d: invalid local prefix in %v", ErrSNATConfig, i, o.Local)
		}
		for _, d := range o.DIPs {
			if !d.IsValid() || d.Unmap().Is4() != o.VIP.Unmap().Is4() {
				return fmt.Errorf("%w: section %d: DIP %v for VIP %v", ErrSNATConfig, i, d, o.VIP)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if nd, nv := s.newIDs(sections); len(s.dipByID)-1+nd > maxIDs || len(s.vipByID)-1+nv > maxIDs {
		return fmt.Errorf("%w: more than %d distinct DIPs or VIPs over the SNAT's life", ErrSNATConfig, maxIDs)
	}
	s.sections = slices.Clone(sections)
	s.rebuild()
	return nil
}

// newIDs counts the DIPs and VIPs of sections without an ID yet (at
// most: duplicates count twice).
func (s *SNAT) newIDs(sections []Outbound) (nd, nv int) {
	for _, o := range sections {
		if _, ok := s.vipIDs[vipKeyOf(o.VIP)]; !ok {
			nv++
		}
		for _, d := range o.DIPs {
			if _, ok := s.dipIDs[dipKeyOf(o.VNI, d)]; !ok {
				nd++
			}
		}
	}
	return nd, nv
}

// SetAllocations replaces the port ranges the DIPs hold: allocs is the
// whole set (a Host Agent's static ranges and the ones it claimed). A
// range no longer listed is withdrawn: its connections keep their ports
// until they end, no new connection gets them, and Usage reports it
// while it holds connections.
func (s *SNAT) SetAllocations(allocs []flow.PortAllocation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := make([]flow.PortAllocation, 0, len(allocs))
	for _, a := range allocs {
		if a.VIP.IsValid() && a.First <= a.Last && a.Owner.DIP.IsValid() {
			a.VIP, a.Owner.DIP = a.VIP.Unmap(), a.Owner.DIP.Unmap()
			next = append(next, a)
		}
	}
	for _, a := range s.allocs {
		if !containsAlloc(next, a) && !containsAlloc(s.withdrawn, a) {
			s.withdrawn = append(s.withdrawn, a)
		}
	}
	s.withdrawn = slices.DeleteFunc(s.withdrawn, func(a flow.PortAllocation) bool { return containsAlloc(next, a) })
	s.allocs = next
	s.rebuild()
}

// containsAlloc reports whether as holds a (same VIP, ports and owner).
func containsAlloc(as []flow.PortAllocation, a flow.PortAllocation) bool {
	for _, x := range as {
		if sameAlloc(x, a) {
			return true
		}
	}
	return false
}

func sameAlloc(x, a flow.PortAllocation) bool {
	return x.VIP == a.VIP && x.First == a.First && x.Last == a.Last && x.Owner.DIP == a.Owner.DIP && x.Owner.VNI == a.Owner.VNI
}

// Allocations returns the ranges in force (a copy).
func (s *SNAT) Allocations() []flow.PortAllocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.allocs)
}

func vipKeyOf(a netip.Addr) vipKey {
	fam, b := keyAddr(a.Unmap())
	return vipKey{addr: b, fam: fam}
}

func dipKeyOf(vni uint32, a netip.Addr) dipKey {
	fam, b := keyAddr(a.Unmap())
	return dipKey{addr: b, vni: vni, fam: fam}
}

// vipID returns the ID of VIP address k, handing out a new one. Called
// with mu held.
func (s *SNAT) vipID(k vipKey) uint16 {
	if id, ok := s.vipIDs[k]; ok {
		return id
	}
	id := uint16(len(s.vipByID))
	s.vipIDs[k] = id
	s.vipByID = append(s.vipByID, k.addr)
	s.stamps = append(s.stamps, new(portStamps))
	return id
}

// dipID is vipID for a DIP.
func (s *SNAT) dipID(k dipKey) uint16 {
	if id, ok := s.dipIDs[k]; ok {
		return id
	}
	id := uint16(len(s.dipByID))
	s.dipIDs[k] = id
	s.dipByID = append(s.dipByID, dipRef(k))
	return id
}

// rebuild publishes the state of the sections and allocations. Called
// with mu held (or from NewSNAT).
func (s *SNAT) rebuild() {
	st := &snatState{dips: map[dipKey]*outDIP{}, vips: map[vipKey]uint16{}}
	for _, o := range s.sections {
		vk := vipKeyOf(o.VIP)
		vid := s.vipID(vk)
		st.vips[vk] = vid
		local, _ := compilePrefixes(o.Local)
		for _, a := range o.DIPs {
			dk := dipKeyOf(o.VNI, a)
			if _, dup := st.dips[dk]; dup {
				continue
			}
			d := &outDIP{id: s.dipID(dk), vipID: vid, vip: vk.addr, local: local}
			vip, dip := o.VIP.Unmap(), a.Unmap()
			var rs []flow.PortAllocation
			for _, al := range s.allocs {
				if al.VIP == vip && al.Owner.DIP == dip && al.Owner.VNI == o.VNI {
					rs = append(rs, al)
				}
			}
			slices.SortFunc(rs, func(x, y flow.PortAllocation) int { return int(x.First) - int(y.First) })
			for _, r := range rs {
				if n := len(d.spans); n > 0 && uint32(r.First) < uint32(d.spans[n-1].first)+d.spans[n-1].n {
					continue // overlaps the previous range
				}
				n := uint32(r.Last) - uint32(r.First) + 1
				d.spans = append(d.spans, portSpan{first: r.First, n: n})
				d.total += n
			}
			st.dips[dk] = d
		}
	}
	// The ID tables only grow: a slice of them is a stable snapshot.
	st.dipByID, st.vipByID, st.stamps = s.dipByID[:len(s.dipByID):len(s.dipByID)], s.vipByID[:len(s.vipByID):len(s.vipByID)], s.stamps[:len(s.stamps):len(s.stamps)]
	s.state.Store(st)
}

// snatBatch is what a stage reads of the SNAT once per batch.
type snatBatch struct {
	st  *snatState
	now flow.Tick
}

// batch returns the SNAT's state and tick for one batch; nil without a
// SNAT.
func (s *SNAT) batch(sb *snatBatch) *snatBatch {
	if s == nil {
		return nil
	}
	sb.st, sb.now = s.state.Load(), s.clock()
	return sb
}

// vipAt returns the VIP address of ID id, or nil when no configuration
// named it. An ID the batch's configuration does not list yet is one
// handed out since the batch began: another worker, under the newer
// configuration, made a connection through that address. IDs only grow
// and are never reused, so the current configuration's table names it.
func (s *SNAT) vipAt(sb *snatBatch, id uint32) *[16]byte {
	t := sb.st.vipByID
	if int(id) >= len(t) {
		t = s.state.Load().vipByID
	}
	if id == 0 || int(id) >= len(t) {
		return nil
	}
	return &t[id]
}

// dipAt is vipAt for a DIP.
func (s *SNAT) dipAt(sb *snatBatch, id uint32) *dipRef {
	t := sb.st.dipByID
	if int(id) >= len(t) {
		t = s.state.Load().dipByID
	}
	if id == 0 || int(id) >= len(t) {
		return nil
	}
	return &t[id]
}

// dip returns the outbound configuration of the packet source k.Src in
// k.VNI, or nil.
func (st *snatState) dip(k *flow.Key) *outDIP {
	if len(st.dips) == 0 {
		return nil
	}
	return st.dips[dipKey{addr: k.Src, vni: k.VNI, fam: k.Family}]
}

// Usage appends to dst how much of each range in force, and of each
// withdrawn range that still holds connections, the connections use; a
// withdrawn range without connections is forgotten. It walks the whole
// returning table: call it every few seconds, not per packet.
func (s *SNAT) Usage(dst []flow.PortRangeUse) []flow.PortRangeUse {
	s.mu.Lock()
	allocs, withdrawn := slices.Clone(s.allocs), slices.Clone(s.withdrawn)
	dips := slices.Clone(s.dipByID)
	s.mu.Unlock()

	type rng struct {
		use   flow.PortRangeUse
		dip   dipKey
		ports []uint64 // bitmap of ports in use
	}
	all := make([]rng, 0, len(allocs)+len(withdrawn))
	byVIP := map[vipKey][]int{}
	for _, a := range append(allocs, withdrawn...) {
		byVIP[vipKeyOf(a.VIP)] = append(byVIP[vipKeyOf(a.VIP)], len(all))
		all = append(all, rng{use: flow.PortRangeUse{PortAllocation: a}, dip: dipKeyOf(a.Owner.VNI, a.Owner.DIP),
			ports: make([]uint64, (int(a.Last)-int(a.First))/64+1)})
	}
	to := s.Timeouts()
	timeout := [4]flow.Tick{flow.Ticks(to.Untrusted), flow.Ticks(to.Established), flow.Ticks(to.Closing), flow.Ticks(to.UDP)}
	now := s.clock()
	s.ret.Range(func(k flow.Key, v uint32, class flow.StateClass, seen flow.Tick) bool {
		if age := now - seen; int32(age) > 0 && age > timeout[class&3] {
			return true // expired, not aged out yet
		}
		id := v >> 16
		if int(id) >= len(dips) {
			return true
		}
		dk := dipKey(dips[id])
		for _, i := range byVIP[vipKey{addr: k.Dst, fam: k.Family}] {
			r := &all[i]
			if r.dip != dk || k.DstPort < r.use.First || k.DstPort > r.use.Last {
				continue
			}
			r.use.Conns++
			b := int(k.DstPort - r.use.First)
			r.ports[b/64] |= 1 << (b % 64)
			break // the first: ranges in force before withdrawn ones
		}
		return true
	})
	var empty []flow.PortAllocation
	for i := range all {
		r := &all[i]
		for _, w := range r.ports {
			r.use.Ports += bits.OnesCount64(w)
		}
		if i >= len(allocs) && r.use.Conns == 0 {
			empty = append(empty, r.use.PortAllocation)
			continue
		}
		dst = append(dst, r.use)
	}
	if len(empty) > 0 {
		s.mu.Lock()
		s.withdrawn = slices.DeleteFunc(s.withdrawn, func(a flow.PortAllocation) bool { return containsAlloc(empty, a) })
		s.mu.Unlock()
	}
	return dst
}

// Stats sums the counters of all workers.
func (s *SNAT) Stats() SNATStats {
	var c [numSNATCounts]uint64
	for i := range s.stripes {
		for j := range c {
			c[j] += s.stripes[i].c[j].Load()
		}
	}
	rs := s.ret.Stats()
	return SNATStats{
		Out: c[sOut], In: c[sIn], Local: c[sLocal], Passed: c[sPassed], Created: c[sCreated], Reused: c[sReused],
		Exhausted: c[sExhausted], Closed: c[sClosed], NoState: c[sNoState], Refused: c[sRefused], ICMP: c[sICMP],
		Expired: rs.Expired + rs.Evictions + rs.Deletes, Entries: rs.Entries,
	}
}

// Indexes of the SNAT's counters, after the Translator's in counts.
const (
	sOut = iota
	sIn
	sLocal
	sPassed
	sCreated
	sReused
	sExhausted
	sClosed
	sNoState
	sRefused
	sICMP
	numSNATCounts
)

// snatStripe is one worker's SNAT counters on cache lines of their own.
type snatStripe struct {
	c [numSNATCounts]atomic.Uint64
	_ [128 - numSNATCounts*8%128]byte
}

// flushSNAT adds a batch's SNAT counts to the worker's stripe.
func (s *SNAT) flush(worker int, c *counts) {
	st := &s.stripes[uint(worker)%statStripes]
	for i, v := range c[cSNAT:] {
		if v != 0 {
			st.c[i].Add(v)
		}
	}
}

// portHash is the keyed hash of a connection's outgoing key that picks
// its first candidate port.
func (s *SNAT) portHash(k *flow.Key) uint64 {
	h := s.seed ^ 0x9e3779b97f4a7c15
	h = mix64(h ^ binary.LittleEndian.Uint64(k.Src[:8]))
	h = mix64(h ^ binary.LittleEndian.Uint64(k.Src[8:]))
	h = mix64(h ^ binary.LittleEndian.Uint64(k.Dst[:8]))
	h = mix64(h ^ binary.LittleEndian.Uint64(k.Dst[8:]))
	return mix64(h ^ uint64(k.SrcPort) ^ uint64(k.DstPort)<<16 ^ uint64(k.Proto)<<32 ^ uint64(k.VNI)<<40)
}

// mix64 is a bijective 64-bit finaliser (SplitMix64's).
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
