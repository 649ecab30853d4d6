package encap

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/header"
)

// Endpoint is an endpoint (a VM or container NIC) behind a Host Agent: where
// the Decap stage delivers a decapsulated frame. It is found by (VNI,
// MAC) alone; its addresses — an IPv4 one, an IPv6 one, or one of each
// for a dual-stack VM on one MAC — are the DIPs the NAT stages find by
// address (nat.DIPs).
type Endpoint struct {
	// VNI is the tenant network the endpoint is on (24 bits).
	VNI uint32
	// MAC is the endpoint's MAC address, the inner Ethernet destination
	// the Mux writes (flow.Backend.MAC).
	MAC header.MAC
	// Addrs are the endpoint's addresses, the DIPs: one or two, at most
	// one per address family.
	Addrs []netip.Addr
	// OutPort is the index of the worker port the endpoint is attached
	// to (Packet.OutPort).
	OutPort uint16
	// Name labels the endpoint in logs and metrics.
	Name string
}

// ErrInvalidLocal is returned, wrapped with detail, by NewEndpoints.
var ErrInvalidLocal = errors.New("encap: invalid local endpoint")

// Endpoints is an immutable set of local endpoints indexed by (VNI, MAC). Build
// it with NewEndpoints and publish it through a EndpointTable; it never changes
// afterwards, so the data path reads it without locks.
type Endpoints struct {
	list  []Endpoint
	slots []localSlot // open addressing, linear probing, power-of-two size
	mask  uint64
}

// localSlot is one index entry; idx is the position in list plus one, 0
// marking an empty slot.
type localSlot struct {
	mac uint64 // the 48-bit MAC
	vni uint32
	idx uint32
}

func macBits(m header.MAC) uint64 {
	return uint64(m[0])<<40 | uint64(m[1])<<32 | uint64(m[2])<<24 | uint64(m[3])<<16 | uint64(m[4])<<8 | uint64(m[5])
}

func localHash(vni uint32, mac uint64) uint64 {
	x := mac ^ uint64(vni)*0x9e3779b97f4a7c15
	x ^= x >> 29
	x *= 0xbf58476d1ce4e5b9
	return x ^ x>>32
}

// NewEndpoints validates locals and returns an indexed set of copies. It
// checks: VNI within 24 bits; MAC set and unicast; one or two Addrs, each
// set, without a zone (an IPv4-mapped address is unmapped), at most one
// per family; no two endpoints with the same (VNI, MAC) or the same (VNI,
// address).
func NewEndpoints(locals []Endpoint) (*Endpoints, error) {
	l := &Endpoints{list: append([]Endpoint(nil), locals...)}
	for i := range l.list {
		l.list[i].Addrs = append([]netip.Addr(nil), l.list[i].Addrs...)
	}
	n := 1
	for n < 2*len(locals) || n < 8 {
		n <<= 1
	}
	l.slots = make([]localSlot, n)
	l.mask = uint64(n - 1)
	addrs := make(map[struct {
		vni  uint32
		addr netip.Addr
	}]int, len(locals))
	for i := range l.list {
		lc := &l.list[i]
		switch {
		case lc.VNI > 1<<24-1:
			return nil, fmt.Errorf("%w %d (%q): VNI %d does not fit 24 bits", ErrInvalidLocal, i, lc.Name, lc.VNI)
		case lc.MAC == header.MAC{}:
			return nil, fmt.Errorf("%w %d (%q): no MAC address", ErrInvalidLocal, i, lc.Name)
		case lc.MAC.IsMulticast():
			return nil, fmt.Errorf("%w %d (%q): MAC %v is a group address", ErrInvalidLocal, i, lc.Name, lc.MAC)
		case len(lc.Addrs) == 0:
			return nil, fmt.Errorf("%w %d (%q): no address", ErrInvalidLocal, i, lc.Name)
		case len(lc.Addrs) > 2:
			return nil, fmt.Errorf("%w %d (%q): %d addresses; an endpoint has at most one IPv4 and one IPv6 address", ErrInvalidLocal, i, lc.Name, len(lc.Addrs))
		}
		for n := range lc.Addrs {
			a := lc.Addrs[n].Unmap()
			lc.Addrs[n] = a
			switch {
			case !a.IsValid():
				return nil, fmt.Errorf("%w %d (%q): no address", ErrInvalidLocal, i, lc.Name)
			case a.Zone() != "":
				return nil, fmt.Errorf("%w %d (%q): address %v has a zone", ErrInvalidLocal, i, lc.Name, a)
			case n == 1 && a.Is4() == lc.Addrs[0].Is4():
				return nil, fmt.Errorf("%w %d (%q): two %s addresses, %v and %v; an endpoint has at most one per family", ErrInvalidLocal, i, lc.Name, family(a), lc.Addrs[0], a)
			}
		}
		if j, ok := l.Lookup(lc.VNI, lc.MAC); ok {
			return nil, fmt.Errorf("%w %d (%q): VNI %d MAC %v already used by %d (%q)", ErrInvalidLocal, i, lc.Name, lc.VNI, lc.MAC, j, l.list[j].Name)
		}
		for _, a := range lc.Addrs {
			k := struct {
				vni  uint32
				addr netip.Addr
			}{lc.VNI, a}
			if j, ok := addrs[k]; ok {
				return nil, fmt.Errorf("%w %d (%q): VNI %d address %v already used by %d (%q)", ErrInvalidLocal, i, lc.Name, lc.VNI, a, j, l.list[j].Name)
			}
			addrs[k] = i
		}
		mac := macBits(lc.MAC)
		for s := localHash(lc.VNI, mac) & l.mask; ; s = (s + 1) & l.mask {
			if l.slots[s].idx == 0 {
				l.slots[s] = localSlot{mac: mac, vni: lc.VNI, idx: uint32(i + 1)}
				break
			}
		}
	}
	return l, nil
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// Lookup returns the index of the endpoint with the given VNI and MAC. It
// does not allocate; a nil *Locals holds nothing.
func (l *Endpoints) Lookup(vni uint32, mac header.MAC) (int, bool) {
	if l == nil {
		return -1, false
	}
	m := macBits(mac)
	for s := localHash(vni, m) & l.mask; ; s = (s + 1) & l.mask {
		e := &l.slots[s]
		if e.idx == 0 {
			return -1, false
		}
		if e.mac == m && e.vni == vni {
			return int(e.idx - 1), true
		}
	}
}

// Len returns the number of endpoints.
func (l *Endpoints) Len() int {
	if l == nil {
		return 0
	}
	return len(l.list)
}

// At returns the endpoint at index i (0 ≤ i < Len()), in the order given
// to NewEndpoints. It must not be modified.
func (l *Endpoints) At(i int) *Endpoint { return &l.list[i] }

// All returns the endpoints in the order given to NewEndpoints. The slice
// must not be modified.
func (l *Endpoints) All() []Endpoint {
	if l == nil {
		return nil
	}
	return l.list
}

// Of returns the endpoint a decapsulated packet is for. The Decap stage
// records the endpoint's index in Packet.Backend; Of checks that index
// against the packet's VNI (Key.VNI) and inner destination MAC, and looks
// the pair up again when they do not match — when l is a newer snapshot
// than the one Decap used, say — so a later stage that loads the
// EndpointTable itself never gets another endpoint's entry. It does not
// allocate.
func (l *Endpoints) Of(p *engine.Packet) (*Endpoint, bool) {
	data := p.Data()
	if l == nil || len(data) < header.EthernetSize {
		return nil, false
	}
	mac := header.Ethernet(data).Dst()
	vni := p.Key.VNI
	if i := p.Backend; i >= 0 && int(i) < len(l.list) {
		if lc := &l.list[i]; lc.VNI == vni && lc.MAC == mac {
			return lc, true
		}
	}
	i, ok := l.Lookup(vni, mac)
	if !ok {
		return nil, false
	}
	return &l.list[i], true
}

// EndpointTable publishes the current Locals to the data path: the Decap
// stage loads it once per batch; the control plane builds a new Locals and
// stores it whole. Before the first Store it holds nothing and every
// packet is dropped with unknown_local.
type EndpointTable struct {
	atomic.Pointer[Endpoints]
}
