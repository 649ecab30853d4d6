package health

import (
	"errors"
	"fmt"
)

// State is a target's health.
type State uint8

const (
	// Unknown is the state of a target that has not been probed yet. The
	// data path must treat it as not healthy (no new flows); its first
	// probe decides it Up or Down.
	Unknown State = iota
	// Up: the target passes its probes and may receive new flows.
	Up
	// Down: the target fails its probes and leaves the Maglev table.
	Down
)

// String returns "unknown", "up" or "down".
func (s State) String() string {
	switch s {
	case Unknown:
		return "unknown"
	case Up:
		return "up"
	case Down:
		return "down"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Healthy reports whether s is Up, the only state that takes new flows.
func (s State) Healthy() bool { return s == Up }

var errState = errors.New("health: unknown state")

// MarshalText implements encoding.TextMarshaler (for JSON status output).
func (s State) MarshalText() ([]byte, error) {
	if s > Down {
		return nil, errState
	}
	return []byte(s.String()), nil
}

// machine is the rise/fall state machine of one target. It is pure: it
// sees a sequence of probe results and the thresholds, nothing else.
//
//   - Unknown: the first result decides, success → Up, failure → Down.
//     A new target (or a freshly started Mux) thus needs one probe, not
//     Rise of them, before it takes traffic, and stays out of the table
//     until then.
//   - Up: Fall consecutive failures → Down; a success resets the count.
//   - Down: Rise consecutive successes → Up; a failure resets the count.
type machine struct {
	state   State
	okRun   int // consecutive successes, ending with the latest result
	failRun int // consecutive failures, ending with the latest result
}

// record applies one probe result and reports the state before it and
// whether the state changed.
func (m *machine) record(ok bool, rise, fall int) (old State, changed bool) {
	old = m.state
	if ok {
		m.okRun++
		m.failRun = 0
	} else {
		m.failRun++
		m.okRun = 0
	}
	switch {
	case m.state == Unknown && ok, m.state == Down && m.okRun >= rise:
		m.state = Up
	case m.state == Unknown && !ok, m.state == Up && m.failRun >= fall:
		m.state = Down
	}
	return old, m.state != old
}

// resetCounts forgets the consecutive counts (the probe changed) but keeps
// the state.
func (m *machine) resetCounts() { m.okRun, m.failRun = 0, 0 }
