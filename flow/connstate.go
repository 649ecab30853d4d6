package flow

import "time"

// A ConnTable entry's state class and age, and the idle timeouts that
// follow from them.

// StateClass is the coarse TCP state of a flow, which picks its idle
// timeout. The data path derives it from the packets the Mux sees (only the
// client's direction under DSR).
type StateClass uint8

// State classes.
const (
	// ClassUntrusted: a flow not yet proven (see ConnTable.Next), whatever
	// its packets: every new flow starts here. Such entries live on a short
	// leash that lookups do not extend and are the only live entries an
	// insert may evict when the table is full, so a flood of spoofed SYNs,
	// FINs, RSTs, ACKs or datagrams cannot push out proven flows (Ananta's
	// defence, extended from SYN floods to every kind). As a packet's
	// suggestion (engine.Packet.StateClass) it means a SYN without ACK.
	ClassUntrusted StateClass = iota
	// ClassEstablished: a proven TCP flow (as a packet's suggestion: a
	// segment without SYN, FIN or RST).
	ClassEstablished
	// ClassClosing: a proven flow that has sent a FIN or RST.
	ClassClosing
	// ClassUDP: a proven flow of UDP or any other non-TCP protocol.
	ClassUDP

	ctClasses = 4
)

// String returns the class name.
func (c StateClass) String() string {
	switch c {
	case ClassUntrusted:
		return "untrusted"
	case ClassEstablished:
		return "established"
	case ClassClosing:
		return "closing"
	case ClassUDP:
		return "udp"
	}
	return "class(" + itoa(uint64(c)) + ")"
}

// Advance returns the class a flow of class c moves to when a packet
// suggesting class seen arrives (engine.Packet.StateClass), without the
// proof an untrusted flow needs (ConnTable.Next adds it): untrusted is
// promoted by any non-SYN packet; anything moves to closing on FIN or RST;
// closing is final except that a new SYN (the client reusing the tuple
// after close) starts over as untrusted. A SYN never demotes an
// established flow, so a spoofed SYN cannot make it evictable.
func (c StateClass) Advance(seen StateClass) StateClass {
	switch {
	case seen == ClassClosing:
		return ClassClosing
	case c == ClassClosing && seen == ClassUntrusted:
		return ClassUntrusted
	case c == ClassUntrusted && seen == ClassEstablished:
		return ClassEstablished
	}
	return c
}

// Tick is a ConnTable timestamp: milliseconds since the table's epoch (its
// construction), in 32 bits. The data path reads the clock once per batch
// (ConnTable.Now) and passes the tick to every call; tests pass synthetic
// ticks. Ticks wrap after 49.7 days; the table compares them as a signed
// 32-bit difference, which is right while an entry's idle time is below
// 24.8 days. Timeouts are capped at MaxConnTimeout and the ager sweeps the
// table continuously, so no live entry gets near that.
type Tick uint32

// Ticks converts a duration to ticks (whole milliseconds, rounded down).
func Ticks(d time.Duration) Tick { return Tick(d / time.Millisecond) }

// MaxConnTimeout is the longest idle timeout a ConnTable accepts.
const MaxConnTimeout = 7 * 24 * time.Hour

// Timeouts are the idle timeouts per state class: an entry not seen for
// longer than its class's timeout is a miss for Lookup and is removed by
// Age. A zero field takes its value from DefaultTimeouts.
type Timeouts struct {
	Untrusted   time.Duration
	Established time.Duration
	Closing     time.Duration
	UDP         time.Duration
}

// DefaultTimeouts returns the timeouts a zero Timeouts field takes:
//
//   - Untrusted 10s: long enough for a client's SYN retransmissions at 1s
//     and 3s and a slow handshake, short enough that a SYN flood's entries
//     drain quickly (and they are evictable meanwhile).
//   - Established 15m: as IPVS's TCP established timeout. The Mux sees only
//     the client's direction, so an idle but open connection (HTTP
//     keep-alive pools, SSH) must survive minutes without packets; when it
//     does expire, the consistent hash still sends it to the same backend
//     unless the backend set changed meanwhile.
//   - Closing 10s: after a FIN or RST only stragglers and the client's ACKs
//     of a half-closed stream remain, and each one refreshes the entry.
//   - UDP 60s: common NAT and IPVS practice for datagram "flows".
func DefaultTimeouts() Timeouts {
	return Timeouts{
		Untrusted:   10 * time.Second,
		Established: 15 * time.Minute,
		Closing:     10 * time.Second,
		UDP:         60 * time.Second,
	}
}

// RefreshAfter returns how stale an entry of class c may get before a
// lookup refreshes its last-seen tick (1/32 of the class's timeout): a
// caller that remembers a flow's entry between lookups (the Mux's fast
// path) looks it up again at least this often, so that the entry of a
// flow it keeps serving never idles out. For ClassUntrusted, whose
// entries lookups never refresh, it returns 0.
func (t *ConnTable) RefreshAfter(c StateClass) Tick {
	if c >= ctClasses || c == ClassUntrusted {
		return 0
	}
	return Tick(t.slack[c])
}

// LookupPreparedSeen is LookupPreparedAge that also returns the entry's
// last-seen tick as the lookup leaves it: now when it refreshed the entry
// (see RefreshAfter), else the tick it holds — also when the refresh was
// lost to a writer, a split or a move at the same moment, which the
// flow's next lookup makes up for. A caller that keeps the flow's
// decision between lookups (the Mux's fast path) looks up again once the
// entry would lag by more than RefreshAfter from this tick.
func (t *ConnTable) LookupPreparedSeen(q *ConnQuery, now Tick) (backend uint32, class StateClass, age, seen Tick, ok bool) {
	var refreshed bool
	backend, class, age, refreshed, ok = t.lookupPrepared(q, now, true)
	if seen = now; !refreshed {
		seen = now - age
	}
	return backend, class, age, seen, ok
}
