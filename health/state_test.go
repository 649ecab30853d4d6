package health

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestMachine feeds sequences of results ("+" success, "-" failure) to the
// rise/fall machine and checks the state after each result ("?" Unknown,
// "U" Up, "D" Down).
func TestMachine(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rise, fall int
		results    string
		states     string
	}{
		{"first success decides up", 2, 3, "+", "U"},
		{"first failure decides down", 2, 3, "-", "D"},
		{"fall exactly", 2, 3, "+---", "UUUD"},
		{"fall interrupted", 2, 3, "+--+--+---", "UUUUUUUUUD"},
		{"rise exactly", 2, 3, "-++", "DDU"},
		{"rise interrupted", 2, 3, "-+-+-++", "DDDDDDU"},
		{"rise 1 fall 1 flaps", 1, 1, "+-+-", "UDUD"},
		{"fall 1", 3, 1, "+-", "UD"},
		{"rise 1", 1, 3, "-+", "DU"},
		{"stays down on failures", 2, 3, "-----", "DDDDD"},
		{"stays up on successes", 2, 3, "+++++", "UUUUU"},
		{"down then up then down", 2, 2, "-++--", "DDUUD"},
		{"long run past threshold", 3, 2, "+------+++", "UUDDDDDDDU"},
		{"rise 5", 5, 3, "-++++-+++++", "DDDDDDDDDDU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m machine
			assert.Equal(t, Unknown, m.state)
			var got strings.Builder
			prev := Unknown
			for _, r := range tc.results {
				old, changed := m.record(r == '+', tc.rise, tc.fall)
				assert.Equal(t, prev, old)
				assert.Equal(t, old != m.state, changed)
				prev = m.state
				got.WriteByte("?UD"[m.state])
				// Exactly one of the counts is non-zero, and it is the
				// current result's.
				if r == '+' {
					assert.Positive(t, m.okRun)
					assert.Zero(t, m.failRun)
				} else {
					assert.Positive(t, m.failRun)
					assert.Zero(t, m.okRun)
				}
			}
			assert.Equal(t, tc.states, got.String())
		})
	}
}

func TestMachineResetCountsKeepsState(t *testing.T) {
	var m machine
	m.record(true, 2, 3)
	m.record(false, 2, 3)
	m.record(false, 2, 3)
	m.resetCounts()
	assert.Equal(t, Up, m.state)
	// Two more failures were one short of fall before the reset; now
	// three are needed again.
	m.record(false, 2, 3)
	m.record(false, 2, 3)
	assert.Equal(t, Up, m.state)
	m.record(false, 2, 3)
	assert.Equal(t, Down, m.state)
}
