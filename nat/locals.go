package nat

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// DIP is one DIP hosted on this node: a VM's (or container's) address in
// its tenant network.
type DIP struct {
	VNI  uint32     // the tenant network (24 bits)
	Addr netip.Addr // the DIP; an IPv4-mapped IPv6 address is unmapped
}

// DIPs is an immutable set of the DIPs this node hosts, keyed by (VNI,
// address). Build it with NewDIPs and publish it with
// Translator.SetDIPs; the stages read it through the Translator's view.
type DIPs struct {
	set  map[localKey]struct{}
	list []DIP
}

type localKey struct {
	addr [16]byte
	vni  uint32
	fam  uint8
}

// ErrInvalidLocal is wrapped by the errors NewDIPs returns.
var ErrInvalidLocal = errors.New("nat: invalid local DIP")

// NewDIPs validates ls and returns the set. Duplicates are merged. The
// slice is copied.
func NewDIPs(ls []DIP) (*DIPs, error) {
	l := &DIPs{set: make(map[localKey]struct{}, len(ls))}
	for i, x := range ls {
		x.Addr = x.Addr.Unmap()
		switch {
		case !x.Addr.IsValid():
			return nil, fmt.Errorf("%w: entry %d has no address", ErrInvalidLocal, i)
		case x.Addr.Zone() != "":
			return nil, fmt.Errorf("%w: entry %d (%v) has a zone", ErrInvalidLocal, i, x.Addr)
		case x.VNI > 1<<24-1:
			return nil, fmt.Errorf("%w: entry %d: VNI %d does not fit 24 bits", ErrInvalidLocal, i, x.VNI)
		}
		fam, a := keyAddr(x.Addr)
		k := localKey{addr: a, vni: x.VNI, fam: fam}
		if _, dup := l.set[k]; dup {
			continue
		}
		l.set[k] = struct{}{}
		l.list = append(l.list, x)
	}
	return l, nil
}

// MustDIPs is NewDIPs for tests and examples: it panics on error.
func MustDIPs(ls ...DIP) *DIPs {
	l, err := NewDIPs(ls)
	if err != nil {
		panic(err)
	}
	return l
}

// Contains reports whether addr in vni is a local DIP.
func (l *DIPs) Contains(vni uint32, addr netip.Addr) bool {
	if l == nil {
		return false
	}
	fam, a := keyAddr(addr.Unmap())
	return l.has(vni, fam, &a)
}

func (l *DIPs) has(vni uint32, fam uint8, a *[16]byte) bool {
	if l == nil {
		return false
	}
	_, ok := l.set[localKey{addr: *a, vni: vni, fam: fam}]
	return ok
}

// List returns the DIPs in the order given (duplicates removed); the slice
// is a copy.
func (l *DIPs) List() []DIP {
	if l == nil {
		return nil
	}
	return slices.Clone(l.list)
}

// Len returns the number of DIPs.
func (l *DIPs) Len() int {
	if l == nil {
		return 0
	}
	return len(l.list)
}

// keyAddr returns the family and flow.Key layout of a (unmapped) address:
// IPv4 in the first four bytes, the rest zero.
func keyAddr(a netip.Addr) (fam uint8, b [16]byte) {
	if a.Is4() {
		a4 := a.As4()
		copy(b[:4], a4[:])
		return 4, b
	}
	return 6, a.As16()
}
