package hostagent

import (
	"fmt"
	"net/netip"

	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/datapath"
	"github.com/xdplb/xdplb/engine/nexthop"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/guard"
	"github.com/xdplb/xdplb/nat"
)

// dataPath is one build of the data path for one plan structure: the
// NAT translator and the live data path (engine/datapath) — a steering
// program per interface, an AF_XDP socket per (interface, queue), the
// slow path and the workers — opened from the spec of the plan (spec).
//
// Worker w owns the sockets on queue w of every interface, numbered by
// the builder's rule: port 0 is the uplink's (UplinkPort), port 1+i VM
// port i's (VMPort.Index), then the slow-path port (slowPort). Its inputs
// are those sockets, the uplink through
//
//	Decap → source filter → partial checksums → nat.Inbound                     (→ the VM's port)
//
// and every VM port through
//
//	Parse{VNI} → client filter → TTL → partial checksums → nat.Return → nexthop.Stage(L3Dst)  (→ the uplink, DSR)
//
// The DIPs of the document's outbound sections also open connections
// through nat.Return's source NAT (nat.SNAT, the agent's, shared by every
// build), whose replies come back from the Muxes through nat.Inbound.
//
// (Decap accepts VXLAN only from Plan.TunnelSources; the filters drop
// a client that is a VIP or a martian, package guard; TTL decrements the
// reply's TTL / hop limit, as the host routes it.)
//
// Sockets on queues at or above the worker count (an interface with more
// queues than another) are extra inputs of worker queue % workers.
type dataPath struct {
	plan *Plan
	nat  *nat.Translator
	live *datapath.DataPath
}

// spec describes plan's data path: the uplink, then the VM ports in
// plan.Ports order, then the slow path, every interface with its steering
// rules. Frames steered while a queue has no socket (during a rebuild)
// are dropped (DropNoSocket): passed to the kernel, a VM's reply would
// leave untranslated and make the client reset its connection. The
// pipelines come from open.
func (a *Agent) spec(plan *Plan) datapath.Spec {
	ifaces := make([]datapath.Interface, 0, 1+len(plan.Ports))
	ifaces = append(ifaces, datapath.Interface{Name: a.cfg.Uplink, Steer: plan.Uplink, DropNoSocket: true})
	for _, vp := range plan.Ports {
		ifaces = append(ifaces, datapath.Interface{Name: vp.Interface, Steer: vp.Steer, DropNoSocket: true})
	}
	return datapath.Spec{Interfaces: ifaces, Workers: a.cfg.Workers, SlowPath: true, Port: a.cfg.Port,
		XDPMode: a.cfg.XDPMode, IdleSpins: a.cfg.IdleSpins, Snapshot: a.batchSnapshot}
}

// open builds the data path for plan and attaches its programs. On error
// everything it built is released, and the running data path is left as
// it was.
//
// run, when not nil, is the data path running now (a rebuild), and open
// builds beside it (datapath.Open with run's data path beside): it must
// not stop it, and on error run keeps forwarding its version. The
// interfaces both serve are shared — the new data path takes run's
// steering programs, attached, and its sockets, bound and registered, and
// only resyncs the programs' rules live — so nothing is detached or
// unbound at the swap. What only the new plan serves (a new VM port) is
// built whole while run forwards: whatever fails there (a foreign XDP
// program on the new port, an interface without the queues, no memory for
// the rings) fails the build before anything of run is touched.
func (a *Agent) open(plan *Plan, dips *nat.DIPs, resolver *nexthop.Resolver, run *dataPath) (*dataPath, error) {
	spec := a.spec(plan)
	// Direct connections to a DIP (not through a VIP) leave by the slow
	// path untranslated: the host's kernel routes them.
	// Outbound connections of the document's outbound DIPs go through
	// the source NAT, shared by every build like the table.
	tr, err := nat.New(nat.Config{Rules: a.rules, Table: a.table, Uplink: UplinkPort, Infra: plan.Infra,
		Direct: slowPort(plan), HasDirect: true, SNAT: a.snat})
	if err != nil {
		return nil, fmt.Errorf("hostagent: %w", err)
	}
	tr.SetDIPs(dips)
	// One uplink pipeline and one per VM port, shared by every worker.
	var (
		inbound *engine.Pipeline
		returns []*engine.Pipeline
	)
	spec.Pipeline = func(in datapath.Input) (*engine.Pipeline, error) {
		if inbound == nil {
			var err error
			if inbound, returns, err = a.pipelines(plan, tr, in.Ifindex[UplinkPort], resolver); err != nil {
				return nil, err
			}
		}
		if in.Interface == UplinkPort {
			return inbound, nil
		}
		return returns[in.Interface-1], nil
	}
	var beside *datapath.DataPath
	if run != nil {
		beside = run.live
	}
	live, err := datapath.Open(spec, beside)
	if err != nil {
		return nil, fmt.Errorf("hostagent: %w", err)
	}
	return &dataPath{plan: plan, nat: tr, live: live}, nil
}

// pipelines returns the uplink's pipeline and each VM port's (in
// plan.Ports order), over the translator tr; replies leave through the
// interface uplinkIndex, resolved by r. The stages are safe for concurrent
// use: every worker shares them.
func (a *Agent) pipelines(plan *Plan, tr *nat.Translator, uplinkIndex int, r nexthop.Source) (*engine.Pipeline, []*engine.Pipeline, error) {
	if len(plan.TunnelSources) == 0 {
		return nil, nil, fmt.Errorf("hostagent: %w", ErrNoTunnelSources)
	}
	decap, err := encap.NewDecap(encap.DecapConfig{Addrs: []netip.Addr{plan.Host.Address},
		Port: plan.Host.VXLANPort, Sources: plan.TunnelSources}, &a.endpoints)
	if err != nil {
		return nil, nil, fmt.Errorf("hostagent: %w", err)
	}
	// Spoofed clients: a request from a VIP or a martian (inner source),
	// a reply to one (destination on the return path). Infrastructure
	// sources are the NAT stages' (nat_infra).
	inSrc, err := guard.NewSources(guard.SourcesConfig{Rules: a.rules})
	if err != nil {
		return nil, nil, fmt.Errorf("hostagent: %w", err)
	}
	retDst, err := guard.NewSources(guard.SourcesConfig{Rules: a.rules, Destination: true})
	if err != nil {
		return nil, nil, fmt.Errorf("hostagent: %w", err)
	}
	nh, err := nexthop.NewStage(nexthop.StageConfig{Mode: nexthop.L3Dst, Ports: map[int]uint16{uplinkIndex: UplinkPort},
		SlowPath: true, SlowPort: slowPort(plan)}, r)
	if err != nil {
		return nil, nil, fmt.Errorf("hostagent: %w", err)
	}
	// Partial checksums are completed before NAT rewrites them
	// (engine.PartialChecksums): VMs and containers on this machine always
	// send them, and so may clients on the Muxes' machines.
	// The return path routes the VM's packets: their TTL / hop limit goes
	// down by one (guard.TTL), so a loop nobody thought of ends. Before
	// nat.Return, which hands direct connections to the slow path at once
	// (Emit): the host routes those too.
	inbound := engine.NewPipeline(decap, inSrc, a.partialStage(a.cfg.Uplink), tr.Inbound())
	returns := make([]*engine.Pipeline, len(plan.Ports))
	for i, vp := range plan.Ports {
		returns[i] = engine.NewPipeline(engine.Parse{VNI: vp.VNI}, retDst, guard.TTL{}, a.partialStage(vp.Interface),
			tr.Return(), nh)
	}
	return inbound, returns, nil
}

// partialStage returns the partial-checksum stage of the input interface
// ifname, the same one across data path rebuilds so its count survives
// them.
func (a *Agent) partialStage(ifname string) *engine.PartialChecksums {
	a.partialMu.Lock()
	defer a.partialMu.Unlock()
	if a.partial == nil {
		a.partial = map[string]*engine.PartialChecksums{}
	}
	s := a.partial[ifname]
	if s == nil {
		s = engine.NewPartialChecksums()
		a.partial[ifname] = s
	}
	return s
}

// slowPort is the index of the slow-path port in every worker's ports:
// by the data path builder's rule (engine/datapath), right after the data
// ports, the uplink's and the VM ports' (TestPortNumbering).
func slowPort(plan *Plan) uint16 { return uint16(1 + len(plan.Ports)) }

// steer replaces the steering rules of every interface with plan's (same
// structure). Called with the agent's lock held.
func (dp *dataPath) steer(plan *Plan) error {
	rules := make([]steer.Config, 0, 1+len(plan.Ports))
	rules = append(rules, plan.Uplink)
	for _, vp := range plan.Ports {
		rules = append(rules, vp.Steer)
	}
	return dp.live.Steer(rules...)
}
