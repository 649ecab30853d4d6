package mux

import (
	"fmt"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/datapath"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/flow"
)

// The Mux's data path: its description for the builder, and the pipeline
// each worker runs.

// spec describes the Mux's data path (engine/datapath): the uplink, its
// RX queues (Config.Queues; all by default) with the running document's
// steering rules, one worker per queue with a pipeline of its own (stages
// are cheap and keep per-worker state apart), and the slow path: a frame
// towards a host whose next hop the resolver has not resolved yet goes
// through the kernel instead of being dropped. Ports, by the builder's
// rule: the uplink's socket (uplinkPort), then the slow path (slowPort).
// seed is the flow hash seed the pipelines balance with (the connection
// table's: see connTable).
func (m *Mux) spec(resolver nexthop.Source, seed uint64) datapath.Spec {
	var rules steer.Config
	if plan := m.ctl.Plan(); plan != nil {
		rules = plan.Steering
	}
	return datapath.Spec{
		Interfaces: []datapath.Interface{{Name: m.cfg.Interface, Queues: m.cfg.Queues, Steer: rules}},
		SlowPath:   true, Port: m.cfg.Port, XDPMode: m.cfg.XDPMode, IdleSpins: m.cfg.IdleSpins,
		Snapshot: m.ctl.Snapshot,
		Pipeline: func(in datapath.Input) (*engine.Pipeline, error) {
			return m.pipeline(seed, in.Ifindex[uplinkPort], resolver, in.Workers)
		},
	}
}

// openDataPath opens the data path of spec; on error nothing of it stays
// open.
func (m *Mux) openDataPath(resolver nexthop.Source, seed uint64) (*datapath.DataPath, error) {
	dp, err := datapath.Open(m.spec(resolver, seed), nil)
	if err != nil {
		return nil, fmt.Errorf("mux: %w", err)
	}
	m.mu.Lock() // Collect and Stats read it
	m.dp = dp
	m.mu.Unlock()
	return dp, nil
}

// closeDataPath stops the controller's steering updates and closes dp,
// whose workers have stopped: the program is detached, the sockets and
// the slow path closed. Its counters stay readable.
func (m *Mux) closeDataPath(dp *datapath.DataPath) {
	if err := m.ctl.SetSteering(nil); err != nil {
		m.log.Error("mux: steering", "err", err)
	}
	if err := dp.Close(); err != nil {
		m.log.Error("mux: closing the data path", "err", err)
	}
}

// pipeline builds Parse → source filter → partial checksums → uplink VNI → ICMP → balance
// → encap (TTL) → next hop → account, for one worker, and adds its Account to the Mux's.
// The stages run fused (see fused): the same work in two passes over a
// batch.
//
// The Account stage comes last, after every stage that can still drop a
// packet (encap: MTU, tunnel source, headroom; next hop: unresolved), so
// the per-VIP and per-backend counts are the packets handed to the uplink;
// a packet the socket then refuses (tx_full) is counted both there and as a
// drop. It reads the client's packet length inside the tunnel.
//
// Each worker has its own balance stage; workers tells it how many share
// the per-VIP budget of new flows. seed is the flow hash seed; the
// connection table is built with it on the first call (connTable).
func (m *Mux) pipeline(seed uint64, uplink int, resolver nexthop.Source, workers int) (*engine.Pipeline, error) {
	conns, err := m.connTable(seed)
	if err != nil {
		return nil, err
	}
	icmp, enc, err := m.icmpStages()
	if err != nil {
		return nil, err
	}
	bal, err := balance.New(balance.Config{Rules: m.rules, Conns: conns, Hasher: flow.NewHasher(seed),
		VIPShare: m.cfg.VIPShare, Workers: workers})
	if err != nil {
		return nil, err
	}
	nh, err := nexthop.NewStage(nexthop.StageConfig{Mode: nexthop.OuterDst, Ports: map[int]uint16{uplink: uplinkPort},
		SlowPath: true, SlowPort: slowPort}, resolver)
	if err != nil {
		return nil, err
	}
	acct := balance.NewAccount(balance.AccountConfig{Encapsulated: true, Rules: m.rules})
	m.mu.Lock()
	m.accounts = append(m.accounts, acct)
	m.balancers = append(m.balancers, bal)
	m.mu.Unlock()
	f, err := newFused(muxStages{sources: m.sources, partial: m.partial, vni: uplinkVNI{m.rules}, icmp: icmp, bal: bal,
		enc: enc, nh: nh, acct: acct})
	if err != nil {
		return nil, err
	}
	if f.fast != nil {
		m.mu.Lock()
		m.fastPaths = append(m.fastPaths, f.fast)
		m.mu.Unlock()
	}
	return engine.NewPipeline(f), nil
}

// The ports of every worker, by the data path builder's rule
// (engine/datapath): the uplink's socket, then the slow-path port (rawip)
// right after it (TestPortNumbering).
const (
	uplinkPort = 0
	slowPort   = 1
)
