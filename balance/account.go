package balance

import (
	"encoding/binary"
	"iter"
	"sync"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// AccountConfig is the plain configuration of an Account stage.
type AccountConfig struct {
	// Encapsulated says the stage runs after VXLAN encapsulation (in the
	// Mux: after encap.Encap and nexthop.Stage), so the client's packet
	// is the tunnelled one and its length is read from the outer UDP
	// header. Otherwise the stage reads the IP header the parser found.
	// Either way the same packet counts the same bytes.
	Encapsulated bool
	// Rules, if set, is looked at once per batch: when it publishes a new
	// snapshot the stage makes room for every backend ID in it, so the
	// first packets to new backends do not grow the counters. Without it
	// the counters grow when a packet shows an ID past their end.
	Rules *flow.Rules
}

// Account is a stage that counts, per backend, the packets the balancing
// stage placed (Packet.Backend set): packets, bytes and new flows. Bytes
// are the client's IP packet as received — IP header and payload, without
// Ethernet, VLAN tags, padding or the encapsulation — whatever the stage's
// place in the pipeline. A new flow is a packet flagged engine.FlagNewFlow:
// one the balancing stage placed on a connection-table miss (so a stateless
// Stage, without Conns, counts none, and a flow the full table refused to
// store counts at each of its packets). Packets without a decision
// (Backend < 0) are not counted: drops are counted by reason by the engine.
// Replies to outbound connections (Returns: a backend ID of
// flow.ReservedID) are counted by their address, under the counter index
// their rule's ID carries (AccountStats.Returns).
//
// Put it last in the pipeline, after every stage that may still drop a
// packet, so that it counts what was handed to the port; a packet the port
// then refuses (tx_full) stays counted, and is also counted as a drop.
//
// Counters are keyed by flow.Backend.ID, which is stable across reloads
// for the same (VIP, backend name), in a slice indexed by ID. A backend's
// counts outlive it: a backend removed by a reload keeps its slot, which is
// how per-VIP totals (AccountStats.VIP) never decrease. The slice grows
// with the largest ID seen, not with the live backends (IDs are handed out
// from 1 and not reused), at 32 bytes per ID; it grows by doubling, off
// the steady state, which allocates nothing.
//
// An Account belongs to one worker: Process must not be called
// concurrently. SumAccounts reads it from any goroutine while the worker
// runs, and never makes the worker wait; see accountHalf.
type Account struct {
	cfg    AccountConfig
	halves [2]accountHalf
	readMu sync.Mutex // one reader at a time: it holds at most one half
}

// accountHalf is a whole set of counters behind a lock; an Account's counts
// are the sum of its two halves. The worker locks a half for a batch and
// counts with plain increments; a reader locks one half at a time. The
// worker takes whichever half is free (TryLock, half 0 first), so a reader
// — even one descheduled while it holds a lock — never stalls the data
// path, and the per-packet cost is that of plain increments: per-packet
// atomic counters (a locked instruction each on amd64) cost twice as much
// in the Mux's pipeline. Each half only grows, so the sum a reader sees
// never decreases, and is exact once the worker is idle.
type accountHalf struct {
	mu     sync.Mutex
	seen   *flow.Snapshot      // last snapshot made room for (cfg.Rules)
	slots  []accountSlot       // indexed by backend ID
	vips   []flow.VIP          // slot.vip-1 → VIP
	vipIdx map[flow.VIP]uint32 // VIP → index+1 in vips
	// returns counts the replies to outbound connections (Returns), by
	// their address's counter index.
	returns []Counts
}

// accountSlot is one backend ID's counters, two to a cache line. vip is the
// index+1 in the half's VIP list of the VIP the ID belongs to (an ID is
// given to one (VIP, name) for its whole life), set by its first packet; 0
// means the slot never counted.
type accountSlot struct {
	packets, bytes, newFlows uint64
	vip                      uint32
	_                        uint32
}

// minAccountSlots is the smallest counter slice.
const minAccountSlots = 64

// NewAccount returns an Account stage for one worker.
func NewAccount(cfg AccountConfig) *Account {
	a := &Account{cfg: cfg}
	for i := range a.halves {
		h := &a.halves[i]
		h.vipIdx = map[flow.VIP]uint32{}
		h.resize(minAccountSlots)
	}
	if cfg.Rules != nil {
		a.halves[0].fit(cfg.Rules.Load())
	}
	return a
}

// Process implements engine.Stage. It counts and never drops.
func (a *Account) Process(b *engine.Batch) {
	ap := a.Begin(b)
	defer ap.End()
	for _, p := range b.Packets() {
		ap.Packet(p)
	}
}

// AccountPass is an Account's counting of one batch, for a caller that
// runs the stage packet by packet among other stages' work (the Mux's
// fused stage): Process is Begin, Packet for every packet, then End.
// Between Begin and End the counters are locked for the worker.
type AccountPass struct {
	a *Account
	h *accountHalf
}

// Begin locks a half of the counters for batch b and makes room for the
// backends of its snapshot.
func (a *Account) Begin(b *engine.Batch) AccountPass {
	h := a.lock()
	if a.cfg.Rules != nil {
		if s := b.Rules(a.cfg.Rules); s != h.seen {
			h.fit(s)
		}
	}
	return AccountPass{a: a, h: h}
}

// End unlocks the counters Begin locked.
func (ap AccountPass) End() { ap.h.mu.Unlock() }

// Packet counts p if the balancing stage placed it.
func (ap AccountPass) Packet(p *engine.Packet) {
	r := p.Rule
	if r == nil || uint32(p.Backend) >= uint32(len(r.Backends)) {
		return
	}
	ap.count(r, r.Backends[p.Backend].ID, ap.a.packetLen(p), p.Flags&engine.FlagNewFlow != 0)
}

// Add counts a packet of n bytes (the client's IP packet, as Packet
// measures it) that the balancing stage placed on backend i of rule r,
// not as a new flow: Packet's work for a caller that knows the length
// (AddID, for one that also kept the backend's ID).
func (ap AccountPass) Add(r *flow.Rule, i int32, n int) {
	if r == nil || uint32(i) >= uint32(len(r.Backends)) {
		return
	}
	ap.count(r, r.Backends[i].ID, n, false)
}

// AddID is Add for a caller that kept the backend's ID
// (r.Backends[i].ID) with its decision (the Mux's fast path and tunnel
// images): it counts without reading the backend, whose line the caller
// need not have in its cache. newFlow counts the packet as its flow's
// first too, as Packet counts a packet with engine.FlagNewFlow. r must
// not be nil (Add checks; AddID's caller has).
func (ap AccountPass) AddID(r *flow.Rule, id uint32, n int, newFlow bool) {
	ap.count(r, id, n, newFlow)
}

// count counts a packet of n bytes on the backend of rule r whose ID is
// id. The common case — a backend whose slot exists and has counted
// before — is a few loads and increments; the rest is countRare, a call.
func (ap AccountPass) count(r *flow.Rule, id uint32, n int, newFlow bool) {
	h := ap.h
	if id < uint32(len(h.slots)) {
		if s := &h.slots[id]; s.vip != 0 {
			s.packets++
			s.bytes += uint64(n)
			if newFlow {
				s.newFlows++
			}
			return
		}
	}
	h.countRare(r, id, n, newFlow)
}

// countRare is count for a reply to an outbound connection, for an ID
// past the counters' end, and for a slot's first packet in this half.
func (h *accountHalf) countRare(r *flow.Rule, id uint32, n int, newFlow bool) {
	if id == flow.ReservedID {
		// A reply to an outbound connection (Returns): counted by
		// its address, whose counter index the rule's ID is.
		h.countReturn(r.ID, n)
		return
	}
	if id >= uint32(len(h.slots)) {
		h.grow(id)
	}
	s := &h.slots[id]
	if s.vip == 0 {
		h.bind(s, r)
	}
	s.packets++
	s.bytes += uint64(n)
	if newFlow {
		s.newFlows++
	}
}

// packetLen is the length of the client's IP packet p carries.
func (a *Account) packetLen(p *engine.Packet) int {
	if a.cfg.Encapsulated {
		return tunnelledLen(p.Data())
	}
	return parsedLen(p)
}

// countReturn counts a returning packet of n bytes under counter index
// i; the counters grow (off the steady state) to hold i.
func (h *accountHalf) countReturn(i uint32, n int) {
	if i >= uint32(len(h.returns)) {
		next := make([]Counts, max(2*len(h.returns), int(i)+1, 8))
		copy(next, h.returns)
		h.returns = next
	}
	c := &h.returns[i]
	c.Packets++
	c.Bytes += uint64(n)
}

// lock locks a half without waiting. A reader holds at most one half at a
// time (readMu), so one of two attempts succeeds unless the reader moved
// from one half to the other in between, which it does once per read.
func (a *Account) lock() *accountHalf {
	for i := 0; ; i ^= 1 {
		if h := &a.halves[i]; h.mu.TryLock() {
			return h
		}
	}
}

// tunnelledLen returns the length of the client's IP packet inside a
// VXLAN frame as encap.Encap writes it, or 0 if data is no such frame: outer Ethernet (untagged), IP, and UDP whose
// length covers UDP, VXLAN and the inner frame, which is the client's IP
// packet behind an untagged Ethernet header (encap.Encap removes VLAN
// tags and padding).
func tunnelledLen(data []byte) int {
	const inner = header.UDPSize + header.VXLANSize + header.EthernetSize
	if len(data) < header.EthernetSize+header.IPv6Size+header.UDPSize {
		return 0
	}
	var udp int
	switch binary.BigEndian.Uint16(data[12:]) {
	case header.EtherTypeIPv4:
		udp = header.EthernetSize + int(data[header.EthernetSize]&0x0f)*4
	case header.EtherTypeIPv6:
		udp = header.EthernetSize + header.IPv6Size
	default:
		return 0
	}
	if udp+header.UDPSize > len(data) {
		return 0
	}
	if n := int(binary.BigEndian.Uint16(data[udp+4:])); n > inner {
		return n - inner
	}
	return 0
}

// parsedLen returns the length of the IP packet the parser found in p, or
// 0 if there is none.
func parsedLen(p *engine.Packet) int {
	data := p.Data()
	l3 := int(p.L3Off)
	switch {
	case p.Flags&engine.FlagIPv4 != 0 && l3+header.IPv4MinSize <= len(data):
		return int(binary.BigEndian.Uint16(data[l3+2:])) // total length
	case p.Flags&engine.FlagIPv6 != 0 && l3+header.IPv6Size <= len(data):
		return header.IPv6Size + int(binary.BigEndian.Uint16(data[l3+4:])) // fixed header + payload length
	}
	return 0
}

// bind records the VIP of slot s's backend ID, counted for the first time
// in this half, in rule r. A VIP's first sight allocates.
func (h *accountHalf) bind(s *accountSlot, r *flow.Rule) {
	v, ok := h.vipIdx[r.VIP]
	if !ok {
		h.vips = append(h.vips, r.VIP)
		v = uint32(len(h.vips))
		h.vipIdx[r.VIP] = v
	}
	s.vip = v
}

// fit makes room for every backend ID of s.
func (h *accountHalf) fit(s *flow.Snapshot) {
	h.seen = s
	var top uint32
	for _, r := range s.Rules() {
		for i := range r.Backends {
			top = max(top, r.Backends[i].ID)
		}
	}
	if top >= uint32(len(h.slots)) {
		h.grow(top)
	}
}

// grow makes room for id, at least doubling the slice.
func (h *accountHalf) grow(id uint32) {
	h.resize(max(2*len(h.slots), int(id)+1))
}

// resize replaces the counters by a slice of n slots holding the same
// counts.
func (h *accountHalf) resize(n int) {
	next := make([]accountSlot, n)
	copy(next, h.slots)
	h.slots = next
}

// Counts are one backend's, or one VIP's, traffic.
type Counts struct {
	// Packets and Bytes forwarded; Bytes are the client's IP packets
	// (IP header and payload, nothing of Ethernet or the encapsulation).
	Packets, Bytes uint64
	// NewFlows is how many of the packets placed a new flow.
	NewFlows uint64
}

// add adds c2 to c.
func (c *Counts) add(c2 Counts) {
	c.Packets += c2.Packets
	c.Bytes += c2.Bytes
	c.NewFlows += c2.NewFlows
}

// AccountStats is a point-in-time sum of Accounts' counters, per backend ID
// and per VIP. Build it with SumAccounts.
type AccountStats struct {
	byID    []Counts // indexed by backend ID
	byVIP   map[flow.VIP]Counts
	returns []Counts // by counter index (Returns)
}

// SumAccounts sums the counters of accts, typically one Account per
// worker, while their workers run. Counts never go back from one call to
// the next, and are exact while the workers are idle. It allocates; it is
// meant for a scrape, not the packet path.
func SumAccounts(accts ...*Account) AccountStats {
	st := AccountStats{byVIP: map[flow.VIP]Counts{}}
	var perVIP []Counts // by the half's VIP index
	for _, a := range accts {
		a.readMu.Lock()
		for i := range a.halves {
			h := &a.halves[i]
			h.mu.Lock()
			if len(h.slots) > len(st.byID) {
				st.byID = append(st.byID, make([]Counts, len(h.slots)-len(st.byID))...)
			}
			perVIP = append(perVIP[:0], make([]Counts, len(h.vips))...)
			for id := range h.slots {
				s := &h.slots[id]
				if s.vip == 0 {
					continue // never counted here
				}
				c := Counts{Packets: s.packets, Bytes: s.bytes, NewFlows: s.newFlows}
				st.byID[id].add(c)
				perVIP[s.vip-1].add(c)
			}
			if len(h.returns) > len(st.returns) {
				st.returns = append(st.returns, make([]Counts, len(h.returns)-len(st.returns))...)
			}
			for i, c := range h.returns {
				st.returns[i].add(c)
			}
			for v, c := range perVIP {
				vc := st.byVIP[h.vips[v]]
				vc.add(c)
				st.byVIP[h.vips[v]] = vc
			}
			h.mu.Unlock()
		}
		a.readMu.Unlock()
	}
	return st
}

// Backend returns the counts of the backend with the given ID (zero for an
// ID never counted).
func (s *AccountStats) Backend(id uint32) Counts {
	if uint64(id) < uint64(len(s.byID)) {
		return s.byID[id]
	}
	return Counts{}
}

// Returns returns the counts of the replies to outbound connections
// counted under index i: an address's returning traffic, by the index
// its range table gave it (ReturnsConfig.Counter). NewFlows stays 0
// (replies place no flow).
func (s *AccountStats) Returns(i uint32) Counts {
	if uint64(i) < uint64(len(s.returns)) {
		return s.returns[i]
	}
	return Counts{}
}

// Backends yields every backend ID with a non-zero count and its counts,
// in ID order; backends removed by a reload included.
func (s *AccountStats) Backends() iter.Seq2[uint32, Counts] {
	return func(yield func(uint32, Counts) bool) {
		for id, c := range s.byID {
			if c != (Counts{}) && !yield(uint32(id), c) {
				return
			}
		}
	}
}

// VIP returns the counts of every backend ever counted for v, those a
// reload removed included, so it never decreases. v is matched exactly, as
// flow.Rule.VIP of a snapshot holds it.
func (s *AccountStats) VIP(v flow.VIP) Counts { return s.byVIP[v] }

// VIPs yields every VIP with a count and its counts, in no particular
// order; VIPs a reload removed included.
func (s *AccountStats) VIPs() iter.Seq2[flow.VIP, Counts] {
	return func(yield func(flow.VIP, Counts) bool) {
		for v, c := range s.byVIP {
			if !yield(v, c) {
				return
			}
		}
	}
}
