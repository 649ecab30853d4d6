package nat

import (
	"errors"
	"fmt"

	"github.com/xdplb/xdplb/flow"
)

// TableConfig is the plain, checkable configuration of a Table.
type TableConfig struct {
	// Capacity is the number of IPv4 connections the table is sized for
	// (see flow.ConnTableConfig); required.
	Capacity int
	// IPv6Capacity is the number of IPv6 connections; 0 selects
	// Capacity/8.
	IPv6Capacity int
	// PortCapacity sizes the side table that remembers the VIP port of
	// connections whose VIP port cannot be derived from the rule (an
	// all-ports rule whose backend has a fixed port); 0 selects
	// max(Capacity/16, 64). Its IPv6 part is PortCapacity/8.
	PortCapacity int
	// Timeouts are the idle timeouts per state class, as in
	// flow.ConnTableConfig.
	Timeouts flow.Timeouts
}

// ErrTableConfig is wrapped by every error NewTable returns.
var ErrTableConfig = errors.New("nat: invalid table config")

// Table is the Host Agent's NAT state: which backend (DIP) a connection
// was translated to, keyed by the connection's return direction, so that
// the Return stage finds it with the key it parses from the VM's reply.
// It is shared by every worker and safe for concurrent use; lookups are
// lock-free (flow.ConnTable).
//
// # Layout
//
// The main table is a flow.ConnTable:
//
//	key   = (VNI, proto, src = DIP:dport, dst = client:cport)  the reply's own key
//	value = Backend.ID (uint32, never 0)                      stable across reloads
//	class = flow.StateClass from the TCP flags                picks the idle timeout
//
// On a hit the Return stage finds the backend by its ID among the current
// snapshot's backends hosted here (Snapshot.Backend, restricted to local
// backends and precomputed per configuration), which gives the rule and so
// the VIP address. The VIP port is derived, not
// stored, whenever that is possible:
//
//	rule VIP.Port != 0                    vport = rule VIP.Port (dport may be remapped)
//	VIP.Port == 0, Backend.Port == 0      vport = dport (all-ports rule, ports preserved)
//	VIP.Port == 0, Backend.Port != 0      many VIP ports → one DIP port: not derivable
//
// Only the last case (an all-ports rule whose backend has a fixed port) needs
// the VIP port stored. Backend IDs use 24 bits (flow.MaxBackendID) and
// grow over a node's life (flow.Snapshot never reuses an ID while it is live, and hands out new
// ones as backends come and go), so packing the port next to the ID in the
// 32-bit value would put a ceiling on backend churn. Instead those
// connections get a second entry, under the same key, in a small side
// table (Ports) whose value is vport | (ID & 0xffff) << 16; the low ID bits
// guard against pairing a port with another connection's entry.
//
// That configuration is inherently lossy: a client that reaches VIP:80 and
// VIP:443 from the same source port becomes one connection on the DIP, and
// the side table remembers the last VIP port it saw. Prefer per-port rules
// when ports are remapped.
//
// # Ticks
//
// Both tables are driven with ticks of the main table (Now); the side
// table's epoch differs from it by the microseconds between their
// constructions, which is far below the millisecond tick.
type Table struct {
	conns *flow.ConnTable
	ports *flow.ConnTable
}

// NewTable validates cfg and allocates the table.
func NewTable(cfg TableConfig) (*Table, error) {
	if cfg.PortCapacity < 0 {
		return nil, fmt.Errorf("%w: PortCapacity must not be negative, got %d", ErrTableConfig, cfg.PortCapacity)
	}
	conns, err := flow.NewConnTable(flow.ConnTableConfig{
		Capacity: cfg.Capacity, IPv6Capacity: cfg.IPv6Capacity, Timeouts: cfg.Timeouts,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTableConfig, err)
	}
	pc := cfg.PortCapacity
	if pc == 0 {
		pc = max(cfg.Capacity/16, 64)
	}
	ports, err := flow.NewConnTable(flow.ConnTableConfig{Capacity: pc, Timeouts: cfg.Timeouts})
	if err != nil {
		return nil, fmt.Errorf("%w: ports: %w", ErrTableConfig, err)
	}
	return &Table{conns: conns, ports: ports}, nil
}

// Conns returns the main connection table (for metrics and debugging).
func (t *Table) Conns() *flow.ConnTable { return t.conns }

// Ports returns the VIP-port side table (for metrics and debugging).
func (t *Table) Ports() *flow.ConnTable { return t.ports }

// Now returns the current tick; the stages read it once per batch.
func (t *Table) Now() flow.Tick { return t.conns.Now() }

// Age removes idle entries from both tables, examining about budget slots
// of the main table and budget/16 of the side table (see
// flow.ConnTable.Age). Run it from a maintenance goroutine.
func (t *Table) Age(now flow.Tick, budget int) (scanned, expired int) {
	s1, e1 := t.conns.Age(now, budget)
	s2, e2 := t.ports.Age(now, max(budget/16, 1))
	return s1 + s2, e1 + e2
}

// Len returns the number of connections stored (idle ones included until
// aged out).
func (t *Table) Len() int { return t.conns.Len() }

// Entry is what the table holds for one connection.
type Entry struct {
	// BackendID is the flow.Backend.ID the connection was translated to.
	BackendID uint32
	// Class is the connection's state class.
	Class flow.StateClass
	// VIPPort is the stored VIP port, valid when HasVIPPort (only for
	// all-ports rules with a fixed backend port).
	VIPPort    uint16
	HasVIPPort bool
}

// Lookup returns the entry for a connection by its return key (the key of
// a reply: src = DIP:dport, dst = client:cport). It refreshes the entry like
// a data-path lookup. For tests, tools and debugging.
func (t *Table) Lookup(ret *flow.Key, now flow.Tick) (Entry, bool) {
	id, class, ok := t.conns.Lookup(ret, now)
	if !ok {
		return Entry{}, false
	}
	e := Entry{BackendID: id, Class: class}
	if pv, _, ok := t.ports.Lookup(ret, now); ok && portValueID(pv, id) {
		e.VIPPort, e.HasVIPPort = uint16(pv), true
	}
	return e, true
}

// portValue is the side table's value: the VIP port and the low 16 bits of
// the backend ID as a check.
func portValue(vport uint16, id uint32) uint32 { return uint32(vport) | id<<16 }

// portValueID reports whether a side-table value belongs to backend id.
func portValueID(v, id uint32) bool { return v>>16 == id&0xffff }
