package flow

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// BackendState is a backend's health as the data path sees it.
type BackendState uint8

const (
	// BackendActive backends take new flows (if their Weight is above 0).
	BackendActive BackendState = iota
	// BackendDraining backends take no new flows; flows a connection
	// table already maps to them keep going there.
	BackendDraining
	// BackendDown backends take no new flows; a connection table should
	// not send existing flows there either.
	BackendDown
)

// String returns "active", "draining" or "down".
func (s BackendState) String() string {
	switch s {
	case BackendActive:
		return "active"
	case BackendDraining:
		return "draining"
	case BackendDown:
		return "down"
	}
	return "BackendState(" + itoa(uint64(s)) + ")"
}

// IsValid reports whether s is one of the defined states.
func (s BackendState) IsValid() bool { return s <= BackendDown }

// ErrBackendState is returned when parsing an unknown backend state.
var ErrBackendState = errors.New(`flow: unknown backend state (want "active", "draining" or "down")`)

// MarshalText implements encoding.TextMarshaler.
func (s BackendState) MarshalText() ([]byte, error) {
	if !s.IsValid() {
		return nil, ErrBackendState
	}
	return []byte(s.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler; the empty string
// means active.
func (s *BackendState) UnmarshalText(b []byte) error {
	switch string(b) {
	case "", "active":
		*s = BackendActive
	case "draining":
		*s = BackendDraining
	case "down":
		*s = BackendDown
	default:
		return ErrBackendState
	}
	return nil
}

// Backend is one DIP of a rule's pool.
type Backend struct {
	// Name is the backend's stable identity, used for its Maglev
	// permutation, e.g. "10.1.0.5:8080". Unique within a rule.
	Name string
	// Addr is the DIP.
	Addr netip.Addr
	// Port is the DIP port; 0 means the same as the VIP (packet) port.
	Port uint16
	// MAC is the DIP's MAC address: the inner Ethernet destination.
	MAC [6]byte
	// Host is the physical address of the DIP's host: the VXLAN outer
	// destination. Its family may differ from Addr's.
	Host netip.Addr
	// Weight is the backend's relative share of new flows; 0 takes it
	// out of the Maglev table (drain).
	Weight uint32
	// State is the backend's health.
	State BackendState
	// ID is the backend's node-local identity, assigned by NewSnapshot and
	// kept across snapshots for the same (VIP, Name): a connection table
	// stores it, so established flows find their backend again after a
	// reload even when the pool's order or size changed. Never 0, at
	// most MaxBackendID.
	ID uint32
}

// tableWeight is the backend's weight in the Maglev table: only active
// backends take new flows.
func (b *Backend) tableWeight() uint32 {
	if b.State != BackendActive {
		return 0
	}
	return b.Weight
}

// VIP is the address a rule serves: packets whose destination matches go
// to the rule's pool.
type VIP struct {
	Addr  netip.Addr // the VIP; an IPv4-mapped IPv6 address is unmapped
	Proto uint8      // IP protocol number, e.g. ProtoTCP; must not be 0
	Port  uint16     // destination port; 0 matches every port
	VNI   uint32     // tenant (24 bits); 0 for none
}

// String formats v as "vni=V proto=P addr:port".
func (v VIP) String() string {
	return "vni=" + itoa(uint64(v.VNI)) + " proto=" + itoa(uint64(v.Proto)) + " " +
		netip.AddrPortFrom(v.Addr, v.Port).String()
}

// Rule maps a VIP to a pool of backends. Rules are built by NewSnapshot
// and read only afterwards; every field, Backends included, must not be
// changed once the snapshot exists.
type Rule struct {
	// Name labels the rule in logs and metrics.
	Name string
	// VIP is what the rule matches.
	VIP VIP
	// Mode says which fields of the flow key the Maglev hash covers.
	Mode TupleMode
	// Backends is the pool. NewSnapshot copies it and sorts the copy by
	// Name, so the same set in any order gives the same rule; Pick
	// returns indices into the sorted copy.
	Backends []Backend
	// TableSize is the Maglev table size (a prime); 0 means
	// MaglevAutoSize(len(Backends), 0), sized by the whole pool (every
	// backend, whatever its state), so health changes never resize it.
	// Each rule's table holds 2 bytes per slot.
	TableSize uint32
	// ID is the rule's dense index in its snapshot (0..Len()-1),
	// assigned by NewSnapshot, for per-VIP counters.
	ID uint32

	maglev *Maglev // over Backends: active ones with Weight > 0
	// k0, k1, kmeta are the VIP's index key (vipWords), for LookupHint.
	k0, k1, kmeta uint64
}

// tableSize is the size of r's Maglev table.
func (r *Rule) tableSize() uint32 {
	if r.TableSize != 0 {
		return r.TableSize
	}
	return MaglevAutoSize(len(r.Backends), 0)
}

// Pick returns the index in r.Backends of the backend that new flows with
// this hash go to (a Maglev lookup over the active backends with Weight
// above 0); ok is false when there is none. It does not allocate.
func (r *Rule) Pick(hash uint64) (idx int, ok bool) {
	if r.maglev == nil {
		return -1, false
	}
	idx = r.maglev.Lookup(hash)
	return idx, idx >= 0
}

// Maglev returns the rule's Maglev table (indices refer to r.Backends), or
// nil for a Rule that was not built by NewSnapshot.
func (r *Rule) Maglev() *Maglev { return r.maglev }

// Errors returned by NewSnapshot and Rules.Update, wrapped with detail.
var (
	ErrInvalidRule  = errors.New("flow: invalid rule")
	ErrStaleVersion = errors.New("flow: version is not newer than the current one")
)

// vipSlot is one entry of a snapshot's open-addressing VIP index: the
// exact key as three words (comparison is three integer compares) and the
// rule. A nil rule marks an empty slot.
type vipSlot struct {
	a0, a1 uint64 // destination address, little-endian words of Key.Dst
	meta   uint64 // vipMeta(VNI, Proto, Port, Family)
	rule   *Rule
}

func vipMeta(vni uint32, proto uint8, port uint16, family uint8) uint64 {
	return uint64(vni)<<32 | uint64(port)<<16 | uint64(proto)<<8 | uint64(family)
}

// vipHash spreads a VIP key over the index. The words are multiplied as a
// 128-bit product of two keyed values and folded; the table is small and
// built once per snapshot, so this needs to be fast more than strong.
func vipHash(a0, a1, meta uint64) uint64 {
	hi, lo := bits.Mul64(a0^0x9e3779b97f4a7c15, a1^bits.RotateLeft64(meta, 29)^0xc2b2ae3d27d4eb4f)
	return hi ^ lo
}

// Snapshot is one immutable, versioned configuration of the data path: the
// rules and an index from VIP to rule. Build it with NewSnapshot and
// publish it with Rules; readers load it once per batch and never see it
// change.
type Snapshot struct {
	// Version is the configuration version the snapshot was built from
	// (version 0 is the empty snapshot). Read only.
	Version uint64

	rules    []*Rule
	index    []vipSlot // open addressing, linear probing, power-of-two size
	mask     uint64
	allPorts bool // some rule has VIP.Port 0: Lookup tries the fallback

	// vipAddrs holds every (VNI, VIP address) of the snapshot, for
	// IsVIPAddr (ICMP to a VIP: not the per-packet path).
	vipAddrs map[vipAddrKey]struct{}
	// anyVIP holds every VIP address whatever its VNI, protocol and port,
	// with its VNI, for HasVIPAddr and VIPAddrVNI (per packet: source
	// filters, the Mux's uplink). Open addressing, linear probing, load
	// at most 1/2; nil when there is no rule.
	anyVIP     []addrSlot
	anyVIPMask uint64
	// vipBits is a one-hash filter over anyVIP's addresses (vipBitsHash):
	// a clear bit answers "no VIP has this address" without a probe, as
	// HasVIPAddr does for nearly every source it is asked about. Nil when
	// there is no rule.
	vipBits  []uint64
	vipShift uint8
	// uplink indexes the rules by VIP without the VNI (meta's VNI 0), same
	// size and mask as index, for LookupUplink; nil when some address is
	// in more than one VNI, or there is no rule.
	uplink []vipSlot
	// oneVNI is the VNI of every rule when they share one (oneVNIOK).
	oneVNI   uint32
	oneVNIOK bool

	// Backend IDs: an open-addressing index from Backend.ID to its place,
	// and the next ID to hand out (carried over from snapshot to snapshot).
	byID   []idSlot
	idMask uint32
	nextID uint32
}

type vipAddrKey struct {
	addr [16]byte
	vni  uint32
	fam  uint8
}

// IsVIPAddr reports whether k's destination address, in k's VNI, is the
// address of any rule, whatever its protocol and port. It does not
// allocate.
func (s *Snapshot) IsVIPAddr(k *Key) bool {
	_, ok := s.vipAddrs[vipAddrKey{addr: k.Dst, vni: k.VNI, fam: k.Family}]
	return ok
}

// emptySnapshot is what Rules.Load returns before anything is stored.
var emptySnapshot = &Snapshot{}

// NewSnapshot validates rules and builds a snapshot of them with the given
// version. The rules are copied (and each rule's Backends sorted by Name);
// the caller may reuse its slices. Rule IDs are the positions in rules.
//
// It checks: VIP address valid, protocol set, VNI within 24 bits, Mode
// defined, no two rules with the same VIP (VNI, protocol, address, port);
// per backend: Name non-empty and unique within the rule, Addr valid, State
// defined; TableSize prime (or 0) and no smaller than the pool. Backend and
// VIP families may differ (encapsulation carries either).
//
// For every rule whose VIP, table size and backends' (Name, effective
// weight) are the same as a rule of prev (effective weight: Weight if
// Active, else 0), the new rule shares prev's Maglev table instead of
// building one; prev may be nil. On error nothing is built. To change only
// some rules' backend states (health), Snapshot.ReplaceRules is cheaper.
func NewSnapshot(version uint64, rules []Rule, prev *Snapshot) (*Snapshot, error) {
	return NewSnapshotAddrs(version, rules, nil, prev)
}

// NewSnapshotAddrs is NewSnapshot for a node whose rules are some of the
// fleet's VIPs but whose source filters must know them all: HasVIPAddr
// also answers true for each of addrs, the addresses of VIPs the node
// has no rule for (a Host Agent's rules are the VIPs its VMs serve; its
// client filters drop packets from any VIP). Nothing else sees addrs:
// Lookup, IsVIPAddr, VIPAddrVNI and SingleVNI answer for the rules only.
// An address may also be a rule's, or be given twice. An invalid address
// is an error.
func NewSnapshotAddrs(version uint64, rules []Rule, addrs []netip.Addr, prev *Snapshot) (*Snapshot, error) {
	s := &Snapshot{Version: version}
	for _, a := range addrs {
		if !a.IsValid() {
			return nil, fmt.Errorf("%w: an invalid VIP address among %d", ErrInvalidRule, len(addrs))
		}
	}
	if len(rules) == 0 && len(addrs) == 0 {
		return s, nil
	}
	if uint64(len(rules))+uint64(len(addrs)) > 1<<31 {
		return nil, fmt.Errorf("%w: %d rules and %d addresses", ErrInvalidRule, len(rules), len(addrs))
	}
	store := make([]Rule, len(rules))
	s.rules = make([]*Rule, len(rules))
	size := 8
	for size < 2*len(rules) {
		size *= 2
	}
	s.index = make([]vipSlot, size)
	s.mask = uint64(size - 1)
	asize := 8
	for asize < 2*(len(rules)+len(addrs)) {
		asize *= 2
	}
	s.anyVIP = make([]addrSlot, asize)
	s.anyVIPMask = uint64(asize - 1)
	s.sizeVIPBits(len(rules) + len(addrs))
	for i := range rules {
		r := &store[i]
		*r = rules[i]
		r.ID = uint32(i)
		r.maglev = nil
		r.VIP.Addr = r.VIP.Addr.Unmap()
		r.Backends = slices.Clone(rules[i].Backends)
		slices.SortFunc(r.Backends, func(a, b Backend) int { return strings.Compare(a.Name, b.Name) })
		if err := r.validate(); err != nil {
			return nil, fmt.Errorf("%w: rule %d (%q): %w", ErrInvalidRule, i, r.Name, err)
		}
		r.k0, r.k1, r.kmeta = vipWords(&r.VIP)
		if old := s.insert(r); old != nil {
			return nil, fmt.Errorf("%w: rule %d (%q): VIP %v already served by rule %d (%q)",
				ErrInvalidRule, i, r.Name, r.VIP, old.ID, old.Name)
		}
		if r.VIP.Port == 0 {
			s.allPorts = true
		}
		if s.vipAddrs == nil {
			s.vipAddrs = make(map[vipAddrKey]struct{}, len(rules))
		}
		var ak vipAddrKey
		ak.vni = r.VIP.VNI
		if r.VIP.Addr.Is4() {
			a4 := r.VIP.Addr.As4()
			copy(ak.addr[:], a4[:])
			ak.fam = FamilyIPv4
		} else {
			ak.addr = r.VIP.Addr.As16()
			ak.fam = FamilyIPv6
		}
		s.vipAddrs[ak] = struct{}{}
		s.addAnyVIP(&ak.addr, ak.fam, ak.vni)
		if i == 0 {
			s.oneVNI, s.oneVNIOK = ak.vni, true
		} else if ak.vni != s.oneVNI {
			s.oneVNIOK = false
		}
		s.rules[i] = r
	}
	for _, a := range addrs {
		s.addOtherVIP(a)
	}
	s.buildUplink()
	s.assignIDs(prev)
	// Tables last: validation errors come before any expensive build.
	var mb []MaglevBackend
	for i, r := range s.rules {
		var old *Rule
		if prev != nil {
			old = prev.LookupVIP(r.VIP)
		}
		if err := r.buildTable(old, &mb); err != nil {
			return nil, fmt.Errorf("%w: rule %d (%q): %w", ErrInvalidRule, i, r.Name, err)
		}
	}
	return s, nil
}

// buildTable gives r its Maglev table: old's, when old (may be nil) has
// the same one (sameTable), else a new one; mb is scratch.
func (r *Rule) buildTable(old *Rule, mb *[]MaglevBackend) error {
	if old != nil && sameTable(old, r) {
		r.maglev = old.maglev
		return nil
	}
	*mb = (*mb)[:0]
	for j := range r.Backends {
		b := &r.Backends[j]
		*mb = append(*mb, MaglevBackend{Name: b.Name, Weight: b.tableWeight()})
	}
	m, err := NewMaglev(*mb, r.tableSize())
	if err != nil {
		return err
	}
	r.maglev = m
	return nil
}

// ErrNotReplaceable is returned by ReplaceRules for a replacement it
// cannot make in place (wrapped with detail): NewSnapshot can.
var ErrNotReplaceable = errors.New("flow: rule cannot be replaced in place")

// ReplaceRules returns a snapshot with the given version that is s with
// some rules replaced: each of rules replaces the rule of s with the same
// VIP, and must list the same backend Names (in any order) with the same
// table size; what may differ is everything else (backend states, weights,
// addresses, the rule's name and mode). That is a health verdict or a
// drain; a change of the VIP or backend sets needs NewSnapshot.
//
// The result is what NewSnapshot(version, all rules, s) would build, for
// less: rules not replaced are shared with s (the same *Rule, Maglev table
// included), backends keep their IDs, and a replaced rule builds a new
// Maglev table only when its (Name, effective weight) sequence changed.
// Its cost is the replaced rules' plus a copy of the VIP index (32 bytes
// per two rules), not a rebuild of every rule. s is not changed; on
// error nothing is built. A VIP given twice is an error.
func (s *Snapshot) ReplaceRules(version uint64, rules []Rule) (*Snapshot, error) {
	ns := *s
	ns.Version = version
	if len(rules) == 0 {
		return &ns, nil
	}
	ns.rules = slices.Clone(s.rules)
	store := make([]Rule, len(rules))
	for i := range rules {
		r := &store[i]
		*r = rules[i]
		r.maglev = nil
		r.VIP.Addr = r.VIP.Addr.Unmap()
		r.Backends = slices.Clone(rules[i].Backends)
		slices.SortFunc(r.Backends, func(a, b Backend) int { return strings.Compare(a.Name, b.Name) })
		if err := r.validate(); err != nil {
			return nil, fmt.Errorf("%w: replacement %d (%q): %w", ErrInvalidRule, i, r.Name, err)
		}
		old := s.LookupVIP(r.VIP)
		switch {
		case old == nil:
			return nil, fmt.Errorf("%w: replacement %d (%q): no rule serves VIP %v", ErrNotReplaceable, i, r.Name, r.VIP)
		case ns.rules[old.ID] != old:
			return nil, fmt.Errorf("%w: replacement %d (%q): VIP %v replaced twice", ErrNotReplaceable, i, r.Name, r.VIP)
		case len(old.Backends) != len(r.Backends):
			return nil, fmt.Errorf("%w: replacement %d (%q): %d backends, the rule has %d", ErrNotReplaceable, i, r.Name, len(r.Backends), len(old.Backends))
		case old.tableSize() != r.tableSize():
			return nil, fmt.Errorf("%w: replacement %d (%q): table size %d, the rule has %d", ErrNotReplaceable, i, r.Name, r.tableSize(), old.tableSize())
		}
		for j := range r.Backends {
			if r.Backends[j].Name != old.Backends[j].Name {
				return nil, fmt.Errorf("%w: replacement %d (%q): backend %q is not in the rule", ErrNotReplaceable, i, r.Name, r.Backends[j].Name)
			}
			r.Backends[j].ID = old.Backends[j].ID
		}
		r.ID = old.ID
		r.k0, r.k1, r.kmeta = old.k0, old.k1, old.kmeta
		ns.rules[r.ID] = r
	}
	var mb []MaglevBackend
	for i := range store {
		r := &store[i]
		if err := r.buildTable(s.rules[r.ID], &mb); err != nil {
			return nil, fmt.Errorf("%w: replacement %d (%q): %w", ErrInvalidRule, i, r.Name, err)
		}
	}
	// The VIP index holds rule pointers (one load less per packet): it is
	// copied and pointed at the replacements. The backend ID index names
	// rules by ID and backends by their place, which did not change: it is
	// shared.
	ns.index = slices.Clone(s.index)
	for i := range ns.index {
		if e := &ns.index[i]; e.rule != nil {
			e.rule = ns.rules[e.rule.ID]
		}
	}
	if s.uplink != nil {
		ns.uplink = slices.Clone(s.uplink)
		for i := range ns.uplink {
			if e := &ns.uplink[i]; e.rule != nil {
				e.rule = ns.rules[e.rule.ID]
			}
		}
	}
	return &ns, nil
}

func (r *Rule) validate() error {
	v := &r.VIP
	switch {
	case !v.Addr.IsValid():
		return errors.New("VIP address is not set")
	case v.Addr.Zone() != "":
		return errors.New("VIP address has a zone")
	case v.Proto == 0:
		return errors.New("VIP protocol is not set")
	case v.VNI > 1<<24-1:
		return fmt.Errorf("VNI %d does not fit 24 bits", v.VNI)
	case !r.Mode.IsValid():
		return fmt.Errorf("unknown tuple mode %d", r.Mode)
	}
	for j := range r.Backends {
		b := &r.Backends[j]
		switch {
		case b.Name == "":
			return fmt.Errorf("backend %v has no name", b.Addr)
		case j > 0 && r.Backends[j-1].Name == b.Name:
			return fmt.Errorf("duplicate backend name %q", b.Name)
		case !b.Addr.IsValid():
			return fmt.Errorf("backend %q has no address", b.Name)
		case !b.State.IsValid():
			return fmt.Errorf("backend %q: unknown state %d", b.Name, b.State)
		}
	}
	return nil
}

// sameTable reports whether old's Maglev table is the one r needs: same
// size and the same (Name, effective weight) sequence (both sorted by Name).
func sameTable(old, r *Rule) bool {
	if old.maglev == nil || len(old.Backends) != len(r.Backends) || old.maglev.Size() != int(r.tableSize()) {
		return false
	}
	for j := range r.Backends {
		a, b := &old.Backends[j], &r.Backends[j]
		if a.Name != b.Name || a.tableWeight() != b.tableWeight() {
			return false
		}
	}
	return true
}

// vipWords returns the index key of a VIP.
func vipWords(v *VIP) (a0, a1, meta uint64) {
	var b [16]byte
	family := uint8(FamilyIPv6)
	if v.Addr.Is4() {
		a4 := v.Addr.As4()
		copy(b[:], a4[:])
		family = FamilyIPv4
	} else {
		b = v.Addr.As16()
	}
	return binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:]),
		vipMeta(v.VNI, v.Proto, v.Port, family)
}

// insert adds r to the index; it returns the rule already there for the
// same VIP, if any, and then does not insert.
func (s *Snapshot) insert(r *Rule) *Rule {
	a0, a1, meta := vipWords(&r.VIP)
	for i := vipHash(a0, a1, meta) & s.mask; ; i = (i + 1) & s.mask {
		e := &s.index[i]
		if e.rule == nil {
			*e = vipSlot{a0: a0, a1: a1, meta: meta, rule: r}
			return nil
		}
		if e.a0 == a0 && e.a1 == a1 && e.meta == meta {
			return e.rule
		}
	}
}

func (s *Snapshot) find(a0, a1, meta uint64) *Rule { return s.findIn(s.index, a0, a1, meta) }

// findIn probes table (s.index, or s.uplink of the same size) for a VIP.
func (s *Snapshot) findIn(table []vipSlot, a0, a1, meta uint64) *Rule {
	for i := vipHash(a0, a1, meta) & s.mask; ; i = (i + 1) & s.mask {
		e := &table[i]
		if e.a0 == a0 && e.a1 == a1 && e.meta == meta {
			return e.rule
		}
		if e.rule == nil {
			return nil
		}
	}
}

// Lookup returns the rule for a packet with flow key k: the rule whose VIP
// matches k's VNI, protocol, destination address and destination port,
// else the all-ports rule (VIP.Port 0) for that VNI, protocol and address,
// else nil. It does not allocate; it is meant to be called per packet.
func (s *Snapshot) Lookup(k *Key) *Rule {
	if s.index == nil {
		return nil
	}
	return s.lookupIn(s.index, k, k.VNI)
}

// lookupIn is Lookup in table (s.index; s.uplink, keyed without the VNI:
// vni 0), taking vni for k's.
func (s *Snapshot) lookupIn(table []vipSlot, k *Key, vni uint32) *Rule {
	le := binary.LittleEndian
	a0, a1 := le.Uint64(k.Dst[:8]), le.Uint64(k.Dst[8:])
	if r := s.findIn(table, a0, a1, vipMeta(vni, k.Proto, k.DstPort, k.Family)); r != nil {
		return r
	}
	if s.allPorts && k.DstPort != 0 {
		return s.findIn(table, a0, a1, vipMeta(vni, k.Proto, 0, k.Family))
	}
	return nil
}

// LookupVIP returns the rule whose VIP is exactly v (no all-ports
// fallback), or nil. For the control plane.
func (s *Snapshot) LookupVIP(v VIP) *Rule {
	if s.index == nil {
		return nil
	}
	v.Addr = v.Addr.Unmap()
	return s.find(vipWords(&v))
}

// Rules returns the snapshot's rules in ID order. The slice and the rules
// are shared: read only.
func (s *Snapshot) Rules() []*Rule { return s.rules }

// RuleSnapshot returns s: a Snapshot is an engine.RuleSource, so a worker
// can run its batches with the snapshot of a Rules
// (engine.WorkerConfig.Snapshot).
func (s *Snapshot) RuleSnapshot() *Snapshot { return s }

// Len returns the number of rules.
func (s *Snapshot) Len() int { return len(s.rules) }

// Rule returns the rule with the given ID, or nil if there is none.
func (s *Snapshot) Rule(id uint32) *Rule {
	if uint64(id) >= uint64(len(s.rules)) {
		return nil
	}
	return s.rules[id]
}

// Rules publishes the current Snapshot to the data path: readers call Load
// (an atomic load, lock-free, once per batch); writers replace the whole
// snapshot with Store or Update, so a reader sees one version or the
// next, never a mix. The zero value is ready to use.
type Rules struct {
	cur atomic.Pointer[Snapshot]
	mu  sync.Mutex // serialises Update (and Store against Update)
}

// NewRules returns a Rules holding the empty snapshot (version 0).
func NewRules() *Rules { return new(Rules) }

// Load returns the current snapshot; never nil (the empty snapshot, version
// 0, before the first Store or Update).
func (r *Rules) Load() *Snapshot {
	if s := r.cur.Load(); s != nil {
		return s
	}
	return emptySnapshot
}

// Store publishes s, whatever its version (a rollback is the caller's
// decision); nil publishes the empty snapshot.
func (r *Rules) Store(s *Snapshot) {
	if s == nil {
		s = emptySnapshot
	}
	r.mu.Lock()
	r.cur.Store(s)
	r.mu.Unlock()
}

// Update builds a snapshot of rules with the given version, reusing the
// current snapshot's Maglev tables where nothing changed, and publishes it.
// It applies a version whole or not at all: on any error the current
// snapshot stays. A version not greater than the current one is refused
// with ErrStaleVersion (a node never goes back and never applies a version
// twice; a controller that resends the version a node runs can treat that
// error as "already applied"). Use Store to force a rollback.
func (r *Rules) Update(version uint64, rules []Rule) (*Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.Load()
	if version <= cur.Version {
		return nil, fmt.Errorf("%w: %d, running %d", ErrStaleVersion, version, cur.Version)
	}
	s, err := NewSnapshot(version, rules, cur)
	if err != nil {
		return nil, err
	}
	r.cur.Store(s)
	return s, nil
}
