package nat

import (
	"encoding/binary"
	"net/netip"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// view is what the stages need from one rules snapshot and one DIPs set,
// precomputed once per (snapshot, DIPs) pair and immutable afterwards. A
// stage loads it once per batch and uses view.snap for every rule lookup, so
// a batch never mixes two configurations.
type view struct {
	snap   *flow.Snapshot
	locals *DIPs

	// rules is indexed by Rule.ID.
	rules []ruleInfo

	// stateless maps a reply's source (VNI, proto, DIP, DIP port) to the
	// rules it could belong to; port 0 holds all-ports rules whose
	// backend preserves the port (any DIP port).
	stateless map[endpointKey]endpoint
	// fragIn maps (VNI, proto, VIP, inner destination MAC) to the DIP
	// address of a non-first fragment; fragOut (VNI, proto, DIP) to the
	// VIP address.
	fragIn  map[fragInKey]addrChoice
	fragOut map[fragOutKey]addrChoice

	// byID finds a local backend by Backend.ID (the table's value) without
	// touching the snapshot's index of every backend: open addressing,
	// linear probing, power-of-two size, id 0 marks an empty slot.
	byID   []idEntry
	idMask uint32

	// skipped counts local backends whose family differs from their VIP's:
	// they cannot be translated (no NAT64) and are never chosen.
	skipped int
}

// idEntry is one local backend in view.byID.
type idEntry struct {
	id   uint32
	lb   *localBackend
	rule *flow.Rule
	ri   *ruleInfo
}

// local returns the local backend with the given ID, or nil.
func (v *view) local(id uint32) *idEntry {
	if id == 0 {
		return nil
	}
	for i := (id * 0x9e3779b1) & v.idMask; ; i = (i + 1) & v.idMask {
		e := &v.byID[i]
		if e.id == id {
			return e
		}
		if e.id == 0 {
			return nil
		}
	}
}

// ruleInfo is a rule's data for the stages.
type ruleInfo struct {
	vip   [16]byte       // VIP address in flow.Key layout
	local []localBackend // backends of the rule hosted here, in Name order
}

// localBackend is one of a rule's backends that is hosted here.
type localBackend struct {
	addr  [16]byte // DIP in flow.Key layout
	mac   header.MAC
	mac48 uint64 // mac as macWord reads it
	port  uint16 // Backend.Port (0: the VIP port)
	idx   int32  // index in Rule.Backends
	id    uint32 // Backend.ID
	// needPort: all-ports rule with a fixed backend port; the VIP port
	// must be remembered in the side table.
	needPort bool
}

// pick returns the local backend the Mux chose: the one whose MAC is the
// inner Ethernet destination (mac, read by macWord); failing that, a
// backend configured without a MAC (all zero). nil when the frame is for
// none of them.
func (ri *ruleInfo) pick(mac uint64) *localBackend {
	for i := range ri.local {
		if ri.local[i].mac48 == mac {
			return &ri.local[i]
		}
	}
	for i := range ri.local {
		if ri.local[i].mac48 == 0 {
			return &ri.local[i]
		}
	}
	return nil
}

// macWord reads the 6-byte MAC at the start of b as one integer (the
// frame's destination for a frame).
func macWord(b []byte) uint64 {
	_ = b[5]
	return uint64(binary.LittleEndian.Uint32(b)) | uint64(binary.LittleEndian.Uint16(b[4:]))<<32
}

type endpointKey struct {
	addr  [16]byte
	vni   uint32
	port  uint16
	proto uint8
	fam   uint8
}

// How the Return stage finds the VIP port of a stateless match.
const (
	vportFixed   uint8 = iota // endpoint.vport
	vportSource               // the reply's source port (ports preserved)
	vportUnknown              // not derivable (all-ports rule, fixed backend port)
)

// endpoint is the stateless index's value: how many distinct rules match
// and, when one does, its translation.
type endpoint struct {
	rules int
	rule  *flow.Rule
	idx   int32 // the backend's index in rule.Backends
	vip   [16]byte
	vport uint16
	mode  uint8
}

type fragInKey struct {
	vip   [16]byte
	vni   uint32
	mac   header.MAC
	proto uint8
	fam   uint8
}

type fragOutKey struct {
	dip   [16]byte
	vni   uint32
	proto uint8
	fam   uint8
}

// addrChoice is an address and whether more than one address competed
// for the key.
type addrChoice struct {
	addr      [16]byte
	ambiguous bool
}

func mergeAddr[K comparable](m map[K]addrChoice, k K, a [16]byte) {
	if c, ok := m[k]; ok {
		if c.addr != a {
			c.ambiguous = true
			m[k] = c
		}
		return
	}
	m[k] = addrChoice{addr: a}
}

// buildView precomputes the stages' indexes for snap and locals. It
// allocates; it runs once per configuration change.
func buildView(snap *flow.Snapshot, locals *DIPs) *view {
	v := &view{
		snap:      snap,
		locals:    locals,
		rules:     make([]ruleInfo, snap.Len()),
		stateless: map[endpointKey]endpoint{},
		fragIn:    map[fragInKey]addrChoice{},
		fragOut:   map[fragOutKey]addrChoice{},
	}
	for _, r := range snap.Rules() {
		ri := &v.rules[r.ID]
		vfam, vip := keyAddr(r.VIP.Addr)
		ri.vip = vip
		vni, proto := r.VIP.VNI, r.VIP.Proto
		for j := range r.Backends {
			b := &r.Backends[j]
			fam, dip := keyAddr(b.Addr.Unmap())
			if !locals.has(vni, fam, &dip) {
				continue
			}
			if fam != vfam {
				v.skipped++
				continue
			}
			lb := localBackend{addr: dip, mac: b.MAC, mac48: macWord(b.MAC[:]), port: b.Port, idx: int32(j), id: b.ID,
				needPort: r.VIP.Port == 0 && b.Port != 0}
			ri.local = append(ri.local, lb)

			// Stateless index: the DIP port replies come from.
			port := b.Port
			if port == 0 {
				port = r.VIP.Port // 0 again for all-ports rules: any port
			}
			ek := endpointKey{addr: dip, vni: vni, port: port, proto: proto, fam: fam}
			e := v.stateless[ek]
			if e.rules == 0 || e.rule != r {
				e.rules++
			}
			if e.rules == 1 {
				e.rule, e.idx, e.vip = r, int32(j), vip
				switch {
				case r.VIP.Port != 0:
					e.mode, e.vport = vportFixed, r.VIP.Port
				case b.Port == 0:
					e.mode = vportSource
				default:
					e.mode = vportUnknown
				}
			}
			v.stateless[ek] = e

			mergeAddr(v.fragIn, fragInKey{vip: vip, vni: vni, mac: b.MAC, proto: proto, fam: fam}, dip)
			mergeAddr(v.fragOut, fragOutKey{dip: dip, vni: vni, proto: proto, fam: fam}, vip)
		}
	}
	// The ID index, now that the local slices no longer move.
	n := 0
	for i := range v.rules {
		n += len(v.rules[i].local)
	}
	size := 8
	for size < 2*n {
		size *= 2
	}
	v.byID, v.idMask = make([]idEntry, size), uint32(size-1)
	for _, r := range snap.Rules() {
		ri := &v.rules[r.ID]
		for j := range ri.local {
			lb := &ri.local[j]
			i := (lb.id * 0x9e3779b1) & v.idMask
			for v.byID[i].id != 0 {
				i = (i + 1) & v.idMask
			}
			v.byID[i] = idEntry{id: lb.id, lb: lb, rule: r, ri: ri}
		}
	}
	return v
}

// statelessLookup returns the single rule translation for a reply with key
// k, and the number of rules that matched.
func (v *view) statelessLookup(k *flow.Key) (e endpoint, n int) {
	ek := endpointKey{addr: k.Src, vni: k.VNI, port: k.SrcPort, proto: k.Proto, fam: k.Family}
	exact := v.stateless[ek]
	if k.SrcPort == 0 {
		return exact, exact.rules
	}
	ek.port = 0
	wild := v.stateless[ek]
	switch n = exact.rules + wild.rules; {
	case n != 1:
		return endpoint{}, n
	case exact.rules == 1:
		return exact, 1
	}
	return wild, 1
}

// prefix is a compiled netip.Prefix over the flow.Key address layout.
type prefix struct {
	hi, lo   uint64 // masked address words, big-endian
	mhi, mlo uint64 // mask words
	fam      uint8
}

// prefixes is a compiled prefix list; Contains is a few integer operations
// per prefix.
type prefixes []prefix

func compilePrefixes(ps []netip.Prefix) (prefixes, bool) {
	out := make(prefixes, 0, len(ps))
	for _, p := range ps {
		if !p.IsValid() {
			return nil, false
		}
		a := p.Addr()
		bitsN := p.Bits()
		if a.Is4In6() {
			// ::ffff:a.b.c.d/n with n >= 96 is the IPv4 prefix /n-96.
			if bitsN < 96 {
				return nil, false
			}
			a, bitsN = a.Unmap(), bitsN-96
		}
		fam, b := keyAddr(a)
		n := bitsN
		var mhi, mlo uint64
		switch {
		case n == 0:
		case n <= 64:
			mhi = ^uint64(0) << (64 - n)
		default:
			mhi, mlo = ^uint64(0), ^uint64(0)<<(128-n)
		}
		hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
		out = append(out, prefix{hi: hi & mhi, lo: lo & mlo, mhi: mhi, mlo: mlo, fam: fam})
	}
	return out, true
}

// contains reports whether address a of family fam (flow.Key layout) is in
// one of the prefixes.
func (ps prefixes) contains(fam uint8, a *[16]byte) bool {
	if len(ps) == 0 {
		return false
	}
	hi, lo := binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:])
	for i := range ps {
		p := &ps[i]
		if p.fam == fam && hi&p.mhi == p.hi && lo&p.mlo == p.lo {
			return true
		}
	}
	return false
}
