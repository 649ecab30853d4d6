package flow

import (
	"testing"
	"time"
)

// ctModelEntry is the reference model's view of one flow.
type ctModelEntry struct {
	backend uint32
	class   StateClass
	seen    Tick
}

// ctPeek reads k's entry without refreshing it.
func ctPeek(ct *ConnTable, k *Key) (e ctModelEntry, ok bool) {
	var p ctKey
	var j int
	var v uint64
	if k.Family == FamilyIPv4 {
		h := ct.pack4(k, &p)
		_, j, v, e.class, _ = ct.v4.search(&p, h, ctTag(h))
	} else {
		h := ct.pack6(k, &p)
		_, j, v, e.class, _ = ct.v6.search(&p, h, ctTag(h))
	}
	e.backend, e.seen = ctBackend(v), ctSeen(v)
	return e, j >= 0
}

// ctWindow returns the entries in k's two candidate buckets.
func ctWindow(ct *ConnTable, k *Key) []ctEntry {
	var p ctKey
	var es [ctSlots]ctEntry
	var out []ctEntry
	if k.Family == FamilyIPv4 {
		i1, i2 := ct.v4.index(ct.pack4(k, &p), ct.v4.geo.Load())
		out = append(out, es[:ct.v4.snapshot(i1, &es)]...)
		out = append(out, es[:ct.v4.snapshot(i2, &es)]...)
	} else {
		i1, i2 := ct.v6.index(ct.pack6(k, &p), ct.v6.geo.Load())
		out = append(out, es[:ct.v6.snapshot(i1, &es)]...)
		out = append(out, es[:ct.v6.snapshot(i2, &es)]...)
	}
	return out
}

// FuzzConnTable runs a sequence of operations, one goroutine, against a
// map model of the documented semantics: timeouts per class, lazy refresh,
// insert over an expired entry, SetClass, Delete, full and partial ageing,
// tick wraparound. Each operation is three bytes: op, key id, argument.
func FuzzConnTable(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 0, 5, 0, 0, 0, 1, 1, 6, 0, 1, 0, 3, 0, 0, 0, 0, 0, 7, 0, 0})
	f.Add([]byte{1, 33, 2, 1, 34, 3, 4, 0, 200, 0, 33, 0, 2, 34, 1, 4, 0, 255, 5, 0, 0, 0, 34, 0})
	f.Add([]byte{0x80, 1, 5, 1, 4, 0, 200, 4, 0, 200, 0, 5, 0, 6, 0, 9, 7, 0, 0})
	f.Add([]byte{1, 1, 4, 1, 2, 8, 1, 3, 12, 4, 0, 20, 0, 1, 0, 4, 0, 60, 0, 2, 0, 2, 3, 1, 6, 0, 3, 5, 0, 0})
	f.Add([]byte{0x81, 39, 1, 1, 38, 2, 4, 0, 250, 1, 39, 3, 5, 0, 0, 7, 0, 0})
	// Fill the IPv4 table (32 keys for 15 slots) with untrusted, then
	// established flows, with time passing: refusals, evictions of
	// untrusted and of expired flows.
	var fill []byte
	for round, cls := range []byte{0, 1, 1} {
		for id := range byte(32) {
			fill = append(fill, 1, id, cls+4*id, 4, 0, byte(10+round*100))
		}
		fill = append(fill, 7, 0, 0, 6, 0, 7)
	}
	f.Add(fill)
	f.Add(append([]byte{0x40 | fill[0]}, fill[1:]...)) // preallocated
	f.Fuzz(func(t *testing.T, data []byte) {
		to := Timeouts{
			Untrusted: 100 * time.Millisecond, Established: time.Second,
			Closing: 50 * time.Millisecond, UDP: 300 * time.Millisecond,
		}
		// Small enough that windows fill: 4 IPv4 buckets for 32 keys, 2
		// IPv6 buckets for 8, grown from the first 2 IPv4 buckets (the
		// smallest start) while the fuzzer fills them; with bit 6 of the
		// first byte set, 3 and 2 buckets preallocated.
		cfg := ConnTableConfig{Capacity: 8, IPv6Capacity: 4, Timeouts: to, start: 2}
		if len(data) > 0 && data[0]&0x40 != 0 {
			cfg.Preallocate = true
		}
		ct, err := NewConnTable(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctSeed(ct, 7)
		const nkeys = 40 // ids 0..31 IPv4, 32..39 IPv6
		keys := make([]Key, nkeys)
		for i := range keys {
			if i < 32 {
				keys[i] = ctKey4(uint32(i))
			} else {
				keys[i] = ctKey6(uint32(i))
			}
		}
		var now Tick
		if len(data) > 0 && data[0]&0x80 != 0 {
			now = 1<<32 - 3000 // cross the tick wraparound
		}
		model := map[int]ctModelEntry{}
		idleAt := func(e ctModelEntry) bool { return ctIdle(now, e.seen, ct.timeout[e.class]) }
		// syncRemoved drops from the model the flows the table no longer
		// holds, checking that each was allowed to go, and returns how many.
		syncRemoved := func(what string, allowed func(ctModelEntry) bool) int {
			n := 0
			for id, e := range model {
				if _, ok := ctPeek(ct, &keys[id]); !ok {
					if !allowed(e) {
						t.Fatalf("%s removed key %d %+v at %d", what, id, e, now)
					}
					delete(model, id)
					n++
				}
			}
			return n
		}
		for len(data) >= 3 {
			op, id, arg := data[0]&0x7f, int(data[1])%nkeys, data[2]
			data = data[3:]
			k := &keys[id]
			e, present := model[id]
			switch op % 8 {
			case 0: // Lookup
				be, cl, ok := ct.Lookup(k, now)
				want := present && !idleAt(e)
				if ok != want {
					t.Fatalf("Lookup(%d) at %d = %v, model %v %+v", id, now, ok, want, e)
				}
				if ok {
					if be != e.backend || cl != e.class {
						t.Fatalf("Lookup(%d) = %d/%v, model %+v", id, be, cl, e)
					}
					if int32(uint32(now-e.seen)) > int32(ct.slack[e.class]) {
						e.seen = now
						model[id] = e
					}
				}
			case 1: // Insert
				cls := StateClass(arg % 4)
				// What the policy says if both buckets are full: the
				// longest idle expired entry, else the least recently seen
				// untrusted one, else refuse.
				win := ctWindow(ct, k)
				evictable := 0
				bestAge, bestExp := int64(-1), false
				for _, w := range win {
					age := int64(int32(uint32(now - ctSeen(w.v))))
					exp := age > int64(ct.timeout[w.cls])
					if !exp && w.cls != ClassUntrusted {
						continue
					}
					if exp && !bestExp || exp == bestExp && age > bestAge {
						bestAge, bestExp = age, exp
					}
					evictable++
				}
				moves := ct.Stats().Moves
				res := ct.Insert(k, uint32(arg), cls, now)
				// With no candidate in its window, an insert moves an entry
				// of its buckets to that entry's other bucket: into a free
				// slot (InsertNew), or over an expired or untrusted entry
				// there (InsertEvicted), which leaves the model.
				moved := ct.Stats().Moves != moves
				if moved && (len(win) != 2*ctSlots || evictable != 0) {
					t.Fatalf("Insert(%d) moved an entry with a window of %d, %d evictable", id, len(win), evictable)
				}
				switch {
				case present && idleAt(e):
					if res != InsertNew {
						t.Fatalf("Insert(%d) over expired = %v", id, res)
					}
				case present:
					if res != InsertUpdated {
						t.Fatalf("Insert(%d) present = %v", id, res)
					}
				case res == InsertEvicted:
					if len(win) != 2*ctSlots || evictable == 0 && !moved {
						t.Fatalf("Insert(%d) evicted from a window of %d with %d candidates", id, len(win), evictable)
					}
					if syncRemoved("eviction", func(v ctModelEntry) bool {
						if moved { // another bucket's victim
							return idleAt(v) || v.class == ClassUntrusted
						}
						age := int64(int32(uint32(now - v.seen)))
						return idleAt(v) == bestExp && age == bestAge && (bestExp || v.class == ClassUntrusted)
					}) != 1 {
						t.Fatalf("Insert(%d) evicted, but not exactly one flow", id)
					}
				case res == InsertRefused:
					if len(win) != 2*ctSlots || evictable != 0 {
						t.Fatalf("Insert(%d) refused with a window of %d, %d evictable", id, len(win), evictable)
					}
				case res != InsertNew:
					t.Fatalf("Insert(%d) absent = %v", id, res)
				}
				if res.Stored() {
					model[id] = ctModelEntry{uint32(arg), cls, now}
				}
			case 2: // SetClass
				cls := StateClass(arg % 4)
				ok := ct.SetClass(k, cls, now)
				want := present && !idleAt(e)
				if want && !ctProven(e.class) && ctProven(cls) {
					// A promotion past the family's proven limit
					// (ProvenShare × Capacity) is refused; proven entries
					// count until they are removed, idle or not.
					limit, proven := ct.v4.maxProven, int64(0)
					if id >= 32 {
						limit = ct.v6.maxProven
					}
					for mid, me := range model {
						if mid >= 32 == (id >= 32) && ctProven(me.class) {
							proven++
						}
					}
					want = proven < limit
				}
				if ok != want {
					t.Fatalf("SetClass(%d) = %v, model %v", id, ok, want)
				}
				if ok {
					e.class = cls
					if int32(uint32(now-e.seen)) > 0 {
						e.seen = now
					}
					model[id] = e
				}
			case 3: // Delete
				if ok := ct.Delete(k); ok != present {
					t.Fatalf("Delete(%d) = %v, model %v", id, ok, present)
				}
				delete(model, id)
			case 4: // time passes
				now += Tick(arg) * 4
			case 5: // full sweep
				want := 0
				for _, e := range model {
					if idleAt(e) {
						want++
					}
				}
				inUse := ct.InUse()
				scanned, n := ct.Age(now, ct.Cap())
				if scanned != inUse || n != want {
					t.Fatalf("Age = %d, %d; want %d, %d", scanned, n, inUse, want)
				}
				syncRemoved("Age", idleAt)
			case 6: // partial sweep
				_, n := ct.Age(now, int(arg))
				if got := syncRemoved("Age", idleAt); got != n {
					t.Fatalf("partial Age reported %d, removed %d", n, got)
				}
			case 7: // contents
				got := 0
				ct.Range(func(rk Key, backend uint32, class StateClass, seen Tick) bool {
					got++
					for id, e := range model {
						if keys[id] == rk {
							if (ctModelEntry{backend, class, seen}) != e {
								t.Fatalf("Range %d: %d %v %d, model %+v", id, backend, class, seen, e)
							}
							return true
						}
					}
					t.Fatalf("Range: unknown key %v", rk)
					return false
				})
				if got != len(model) || ct.Len() != len(model) {
					t.Fatalf("Range saw %d, Len %d, model %d", got, ct.Len(), len(model))
				}
			}
		}
	})
}
