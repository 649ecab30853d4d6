package flow

import (
	"slices"
	"strings"
)

// Backend IDs: every backend of a snapshot has an ID that stays the
// backend's across reloads (NewSnapshot hands the previous snapshot's IDs
// on); a connection table stores it, with the backend's place in its
// rule (Rule.Entry), and Snapshot.Place and Snapshot.Backend find the
// backend again.

// MaxBackendID is the largest backend ID a snapshot assigns: IDs fit in
// the low 24 bits of a connection-table entry (Rule.Entry), whose top 8
// bits say where the backend was in its rule. It is below the low 24 bits
// of ReservedID, so no entry is ever ReservedID.
const MaxBackendID = 1<<24 - 2

// entryIDMask takes a backend ID out of a connection-table entry.
const entryIDMask = 1<<24 - 1

// Entry returns what a connection table stores for a flow placed on
// r.Backends[idx]: the backend's ID (which stays the backend's across
// reloads) in the low 24 bits and idx (at most 255) in the top 8 bits, a
// hint that saves Snapshot.Place the lookup by ID while the backend keeps
// its place. Snapshot.Backend accepts an entry as well as an ID.
func (r *Rule) Entry(idx int) uint32 {
	return uint32(min(idx, 255))<<24 | r.Backends[idx].ID
}

// ReservedID is a backend ID no snapshot assigns: a connection table may
// store it to mark a flow that has no backend (the Host Agent's NAT marks
// connections that did not come through a VIP with it).
const ReservedID = ^uint32(0)

// idSlot places one backend ID; id 0 marks an empty slot. It names the
// rule by its ID, not a pointer, so that a snapshot whose rules changed
// but whose backends did not (ReplaceRules) shares the whole index.
type idSlot struct {
	id   uint32
	idx  uint32 // index in rule.Backends
	rule uint32 // Rule.ID
}

// assignIDs gives every backend its ID: the one prev had for the same VIP
// and Name, else a new one; and builds the ID index.
func (s *Snapshot) assignIDs(prev *Snapshot) {
	n := 0
	for _, r := range s.rules {
		n += len(r.Backends)
	}
	size := 8
	for size < 2*n {
		size *= 2
	}
	s.byID = make([]idSlot, size)
	s.idMask = uint32(size - 1)
	s.nextID = 1
	if prev != nil && prev.nextID > 0 {
		s.nextID = prev.nextID
	}
	for _, r := range s.rules {
		var old *Rule
		if prev != nil {
			old = prev.LookupVIP(r.VIP)
		}
		for j := range r.Backends {
			b := &r.Backends[j]
			b.ID = 0
			if old != nil {
				if k, ok := slices.BinarySearchFunc(old.Backends, b.Name, func(x Backend, name string) int {
					return strings.Compare(x.Name, name)
				}); ok {
					b.ID = old.Backends[k].ID
				}
			}
			for b.ID == 0 || b.ID > MaxBackendID || s.idTaken(b.ID) {
				b.ID = s.nextID
				s.nextID++
				if s.nextID > MaxBackendID {
					s.nextID = 1 // wrapped after 2^24 additions: skip 0 and taken IDs
				}
			}
			s.putID(b.ID, r, j)
		}
	}
}

func idHash(id uint32) uint32 { return id * 0x9e3779b1 }

func (s *Snapshot) idTaken(id uint32) bool {
	for i := idHash(id) & s.idMask; ; i = (i + 1) & s.idMask {
		e := &s.byID[i]
		if e.id == id {
			return true
		}
		if e.id == 0 {
			return false
		}
	}
}

func (s *Snapshot) putID(id uint32, r *Rule, idx int) {
	for i := idHash(id) & s.idMask; ; i = (i + 1) & s.idMask {
		if e := &s.byID[i]; e.id == 0 {
			*e = idSlot{id: id, idx: uint32(idx), rule: r.ID}
			return
		}
	}
}

// Backend returns the rule and the index in its Backends of the backend
// with the given ID, and false when no backend of s has it (it was removed
// by a reload). id may also be a connection-table entry (Rule.Entry): its
// hint is ignored. It does not allocate.
func (s *Snapshot) Backend(id uint32) (r *Rule, idx int, ok bool) {
	id &= entryIDMask
	if s.byID == nil || id == 0 {
		return nil, -1, false
	}
	for i := idHash(id) & s.idMask; ; i = (i + 1) & s.idMask {
		e := &s.byID[i]
		if e.id == id {
			return s.rules[e.rule], int(e.idx), true
		}
		if e.id == 0 {
			return nil, -1, false
		}
	}
}

// EntryIndex is Place's first step: the index in r.Backends a
// connection-table entry (Entry) names when its backend is still where the
// entry says; ok is false otherwise, which does not mean r has no such
// backend (Place then looks it up by ID). It is small enough to be inlined
// in a data-path caller, which calls Place when it fails.
func (r *Rule) EntryIndex(entry uint32) (idx int, ok bool) {
	if h := int(entry >> 24); h < len(r.Backends) && r.Backends[h].ID == entry&entryIDMask {
		return h, true
	}
	return -1, false
}

// Place returns the index in r.Backends of the backend a connection-table
// entry (Rule.Entry) names, r being the rule of s that the flow's packet
// matches; ok is false when r has no backend with the entry's ID (the
// backend was removed, or the entry belongs to another rule). When the
// backend is still where the entry says, that is one comparison of its ID
// (IDs are unique in a snapshot, so an equal ID is the same backend);
// otherwise — a reload moved it — the lookup by ID of Backend. It does not
// allocate; the data path calls it on a connection-table hit.
func (s *Snapshot) Place(r *Rule, entry uint32) (idx int, ok bool) {
	if idx, ok := r.EntryIndex(entry); ok {
		return idx, true
	}
	br, idx, ok := s.Backend(entry)
	if !ok || br != r {
		return -1, false
	}
	return idx, true
}
