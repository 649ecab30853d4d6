//go:build linux

package steer

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func (m AttachMode) flags() (link.XDPAttachFlags, error) {
	switch m {
	case AttachAuto:
		return 0, nil
	case AttachDriver:
		return link.XDPDriverMode, nil
	case AttachGeneric:
		return link.XDPGenericMode, nil
	}
	return 0, fmt.Errorf("steer: unknown attach mode %d", m)
}

// Program is the loaded steering program and its maps: the live object.
// One Program serves one interface (its XSKMAP holds that interface's
// sockets). Its methods are safe for concurrent use.
type Program struct {
	mu      sync.Mutex
	opts    Options
	objs    steerObjects
	rules   map[ruleKey]struct{} // mirror of steer_rules (we are its only writer)
	infra   map[lpmKey]struct{}  // mirror of steer_infra
	counts  classCounts
	classes uint32 // last value written to steer_config
	all     bool   // SetSteerAll
	dropNS  bool   // SetDropNoSocket
	link    link.Link
	closed  bool
}

// Load loads the program and its maps into the kernel, sized by opts. It
// needs CAP_BPF (or root). Nothing is attached yet and no rule is set, so
// the program would pass every packet. On kernels before 5.11 the caller
// must raise RLIMIT_MEMLOCK first (cilium/ebpf's rlimit.RemoveMemlock).
func Load(opts Options) (*Program, error) {
	opts = opts.withDefaults()
	spec, err := loadSteer()
	if err != nil {
		return nil, err
	}
	spec.Maps[steerMapSteerRules].MaxEntries = opts.MaxRules
	spec.Maps[steerMapSteerInfra].MaxEntries = opts.MaxInfraPrefixes
	spec.Maps[steerMapSteerXsks].MaxEntries = opts.MaxQueues
	p := &Program{
		opts:  opts,
		rules: make(map[ruleKey]struct{}),
		infra: make(map[lpmKey]struct{}),
	}
	if err := spec.LoadAndAssign(&p.objs, nil); err != nil {
		return nil, fmt.Errorf("steer: load: %w", err)
	}
	return p, nil
}

// Options returns the options the Program was loaded with, defaults filled.
func (p *Program) Options() Options { return p.opts }

// ProgramFD is the XDP program's file descriptor, owned by p.
func (p *Program) ProgramFD() int { return p.objs.XdpSteer.FD() }

// XSKMap is the BPF_MAP_TYPE_XSKMAP indexed by RX queue, owned by p.
// RegisterSocket is the usual way to fill it.
func (p *Program) XSKMap() *ebpf.Map { return p.objs.SteerXsks }

// Attach attaches the program to the interface with index ifindex (in the
// calling thread's network namespace) through a bpf_link, which the kernel
// removes when the link's last file descriptor closes: a crashed process
// leaves nothing behind.
//
// A program attached by netlink (the pre-bpf_link way, which outlives its
// process) is detached first if it is a steering program, left by an older
// or crashed run, or any program when Options.ReplaceForeign is set;
// otherwise Attach fails with ErrForeignProgram. A program held by a live
// bpf_link is never removed: Attach fails with ErrInUse.
func (p *Program) Attach(ifindex int, mode AttachMode) error {
	flags, err := mode.flags()
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return ErrClosed
	case p.link != nil:
		return ErrAttached
	}
	if err := removeStale(ifindex, p.opts.ReplaceForeign); err != nil {
		return err
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: p.objs.XdpSteer, Interface: ifindex, Flags: flags})
	if err != nil {
		if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
			err = fmt.Errorf("%w: %w", ErrInUse, err)
		}
		return fmt.Errorf("steer: attach to ifindex %d (%v): %w", ifindex, mode, err)
	}
	p.link = l
	return nil
}

// removeStale detaches a netlink-attached XDP program from ifindex.
func removeStale(ifindex int, replaceForeign bool) error {
	nlink, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return fmt.Errorf("steer: ifindex %d: %w", ifindex, err)
	}
	x := nlink.Attrs().Xdp
	if x == nil || !x.Attached {
		return nil
	}
	var flags int
	switch x.AttachMode {
	case nl.XDP_ATTACHED_DRV:
		flags = nl.XDP_FLAGS_DRV_MODE
	case nl.XDP_ATTACHED_SKB:
		flags = nl.XDP_FLAGS_SKB_MODE
	default: // offloaded, or several modes at once (which needs offload)
		return fmt.Errorf("%w: ifindex %d has an XDP program in mode %d", ErrInUse, ifindex, x.AttachMode)
	}
	name := "?"
	if prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(x.ProgId)); err == nil {
		if info, err := prog.Info(); err == nil {
			name = info.Name
		}
		prog.Close()
	}
	if name != ProgramName && !replaceForeign {
		return fmt.Errorf("%w: %q (id %d) on ifindex %d", ErrForeignProgram, name, x.ProgId, ifindex)
	}
	if err := netlink.LinkSetXdpFdWithFlags(nlink, -1, flags); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("%w: %q (id %d) on ifindex %d is held by a bpf_link", ErrInUse, name, x.ProgId, ifindex)
		}
		return fmt.Errorf("steer: detach stale %q (id %d) from ifindex %d: %w", name, x.ProgId, ifindex, err)
	}
	return nil
}

// Detach removes the program from its interface. Maps and sockets stay, so
// a later Attach resumes with the same rules. Detaching a Program that is
// not attached does nothing.
func (p *Program) Detach() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.detach()
}

func (p *Program) detach() error {
	if p.link == nil {
		return nil
	}
	err := p.link.Close()
	p.link = nil
	if err != nil {
		return fmt.Errorf("steer: detach: %w", err)
	}
	return nil
}

// Close detaches the program and releases the program, its maps and the
// maps' references to sockets. Close is idempotent.
func (p *Program) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return errors.Join(p.detach(), p.objs.Close())
}

// RegisterSocket puts the AF_XDP socket fd in the XSKMAP slot of RX queue
// queue. The socket must be bound to that queue of the attached interface
// for redirected frames to reach it.
func (p *Program) RegisterSocket(queue int, fd int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkQueue(queue); err != nil {
		return err
	}
	if err := p.objs.SteerXsks.Update(uint32(queue), uint32(fd), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("steer: register socket %d on queue %d: %w", fd, queue, err)
	}
	return nil
}

// UnregisterSocket empties the XSKMAP slot of queue: its matching packets
// pass to the kernel again. An empty slot is not an error.
func (p *Program) UnregisterSocket(queue int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkQueue(queue); err != nil {
		return err
	}
	err := p.objs.SteerXsks.Delete(uint32(queue))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("steer: unregister queue %d: %w", queue, err)
	}
	return nil
}

func (p *Program) checkQueue(queue int) error {
	if p.closed {
		return ErrClosed
	}
	if queue < 0 || queue >= int(p.opts.MaxQueues) {
		return fmt.Errorf("steer: queue %d outside 0..%d (Options.MaxQueues)", queue, p.opts.MaxQueues-1)
	}
	return nil
}

// Stats sums the per-CPU counters.
func (p *Program) Stats() (Stats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Stats{}, ErrClosed
	}
	var per []steerSteerCounters
	if err := p.objs.SteerStats.Lookup(uint32(0), &per); err != nil {
		return Stats{}, fmt.Errorf("steer: read counters: %w", err)
	}
	var s Stats
	for _, c := range per {
		s.Redirected += c.Redirected
		s.NoSocket += c.NoSocket
		s.NoSocketDropped += c.NoSocketDrop
		s.NoMatch += c.NoMatch
		s.NotIP += c.NotIp
		s.Malformed += c.Malformed
		s.Infra += c.Infra
		s.ND += c.Nd
		s.MatchedDst += c.MatchDst
		s.MatchedVXLAN += c.MatchVxlan
		s.MatchedSrc += c.MatchSrc
		s.MatchedAll += c.MatchAll
	}
	return s, nil
}

// SteerDst adds a destination rule (see DstRule).
func (p *Program) SteerDst(addr netip.Addr, proto uint8, port uint16) error {
	return p.addRule(DstRule{Addr: addr, Proto: proto, Port: port}.key())
}

// UnsteerDst removes a destination rule. Removing an absent rule does
// nothing.
func (p *Program) UnsteerDst(addr netip.Addr, proto uint8, port uint16) error {
	return p.delRule(DstRule{Addr: addr, Proto: proto, Port: port}.key())
}

// SteerVXLAN adds a VXLAN rule: UDP to local:port (port 0 means
// DefaultVXLANPort).
func (p *Program) SteerVXLAN(local netip.Addr, port uint16) error {
	return p.addRule(VXLANRule{Local: local, Port: port}.key())
}

// UnsteerVXLAN removes a VXLAN rule.
func (p *Program) UnsteerVXLAN(local netip.Addr, port uint16) error {
	return p.delRule(VXLANRule{Local: local, Port: port}.key())
}

// SteerSrc adds a source rule: packets from dip (and source port port, or
// any port when 0), unless sent to an infrastructure prefix.
func (p *Program) SteerSrc(dip netip.Addr, port uint16) error {
	return p.addRule(SrcRule{Addr: dip, Port: port}.key())
}

// UnsteerSrc removes a source rule.
func (p *Program) UnsteerSrc(dip netip.Addr, port uint16) error {
	return p.delRule(SrcRule{Addr: dip, Port: port}.key())
}

// AddInfraPrefix adds a "never steer" destination prefix for source rules.
func (p *Program) AddInfraPrefix(pfx netip.Prefix) error {
	k, err := infraKey(pfx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.putInfra(k); err != nil {
		return err
	}
	return p.writeClasses(p.counts.mask())
}

// RemoveInfraPrefix removes an infrastructure prefix.
func (p *Program) RemoveInfraPrefix(pfx netip.Prefix) error {
	k, err := infraKey(pfx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.deleteInfra(k); err != nil {
		return err
	}
	return p.writeClasses(p.counts.mask())
}

// Config returns the rules and prefixes in the maps, normalised and sorted.
func (p *Program) Config() Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	return configOf(p.rules, p.infra)
}

// Sync makes the maps hold exactly desired, live: the program stays
// attached and entries present in both the old and the new set are never
// touched, so their traffic is steered throughout. Stale entries are
// deleted before new ones are added (so a full map can be turned over),
// new infrastructure prefixes are added before new rules (so a rule never
// steers what its prefixes veto), and the lookup classes are widened
// before and narrowed after, so no packet skips a lookup for an entry
// that exists.
//
// desired is validated whole before anything changes. An error from the
// kernel midway is undone: Sync deletes what it added and puts back what
// it deleted, so a refused set leaves the maps holding the running one (a
// node refusing a version keeps forwarding it). Only if that also fails —
// the error then says so — are the maps left between the two sets;
// Config reports exactly what is in them, and a later Sync converges.
func (p *Program) Sync(desired Config) (err error) {
	want, wantInfra, err := desired.compile()
	if err != nil {
		return err
	}
	if len(want) > int(p.opts.MaxRules) {
		return fmt.Errorf("%w: %d rules, Options.MaxRules is %d", ErrMapFull, len(want), p.opts.MaxRules)
	}
	if len(wantInfra) > int(p.opts.MaxInfraPrefixes) {
		return fmt.Errorf("%w: %d infra prefixes, Options.MaxInfraPrefixes is %d", ErrMapFull, len(wantInfra), p.opts.MaxInfraPrefixes)
	}
	wantCounts := countsOf(want, wantInfra)

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if err := p.writeClasses(p.counts.mask() | wantCounts.mask()); err != nil {
		return err
	}
	oldRules, oldInfra := maps.Clone(p.rules), maps.Clone(p.infra)
	// Whatever happens below, leave the classes matching the maps: the
	// ones widened above cover the running set's classes too, so the
	// entries restore puts back are looked up meanwhile.
	defer func() {
		if err != nil {
			if rerr := p.restore(oldRules, oldInfra); rerr != nil {
				err = fmt.Errorf("%w; and putting the running rules back: %w", err, rerr)
			}
		}
		if werr := p.writeClasses(p.counts.mask()); err == nil {
			err = werr
		}
	}()
	for k := range p.rules {
		if _, ok := want[k]; !ok {
			if err = p.deleteRule(k); err != nil {
				return err
			}
		}
	}
	for k := range p.infra {
		if _, ok := wantInfra[k]; !ok {
			if err = p.deleteInfra(k); err != nil {
				return err
			}
		}
	}
	// Vetoes before the rules they veto: a new source rule never steers
	// what a new infrastructure prefix passes, even for a moment.
	for k := range wantInfra {
		if err = p.putInfra(k); err != nil {
			return err
		}
	}
	for k := range want {
		if err = p.putRule(k); err != nil {
			return err
		}
	}
	return nil
}

// restore makes the maps hold rules and infra again after a Sync failed
// midway: it deletes what the Sync added (freeing room first; rules
// before the prefixes that veto them), then puts back what it deleted
// (prefixes before rules, as Sync adds them). It tries every entry and
// returns the errors joined. Called with p.mu held.
func (p *Program) restore(rules map[ruleKey]struct{}, infra map[lpmKey]struct{}) error {
	var errs []error
	for k := range p.rules {
		if _, ok := rules[k]; !ok {
			errs = append(errs, p.deleteRule(k))
		}
	}
	for k := range p.infra {
		if _, ok := infra[k]; !ok {
			errs = append(errs, p.deleteInfra(k))
		}
	}
	for k := range infra {
		errs = append(errs, p.putInfra(k))
	}
	for k := range rules {
		errs = append(errs, p.putRule(k))
	}
	return errors.Join(errs...)
}

func (p *Program) addRule(k ruleKey, err error) error {
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.putRule(k); err != nil {
		return err
	}
	return p.writeClasses(p.counts.mask())
}

func (p *Program) delRule(k ruleKey, err error) error {
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.deleteRule(k); err != nil {
		return err
	}
	return p.writeClasses(p.counts.mask())
}

// putRule, deleteRule, putInfra and deleteInfra keep the mirrors and class
// counts equal to the maps. Callers hold mu.

func (p *Program) putRule(k ruleKey) error {
	if p.closed {
		return ErrClosed
	}
	if _, ok := p.rules[k]; ok {
		return nil
	}
	if len(p.rules) >= int(p.opts.MaxRules) {
		return fmt.Errorf("%w: Options.MaxRules is %d", ErrMapFull, p.opts.MaxRules)
	}
	if err := p.objs.SteerRules.Update(&k, uint8(1), ebpf.UpdateNoExist); err != nil {
		return fmt.Errorf("steer: add %s: %w", ruleString(k), err)
	}
	p.rules[k] = struct{}{}
	p.counts.add(k.class(), 1)
	return nil
}

func (p *Program) deleteRule(k ruleKey) error {
	if p.closed {
		return ErrClosed
	}
	if _, ok := p.rules[k]; !ok {
		return nil
	}
	if err := p.objs.SteerRules.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("steer: remove %s: %w", ruleString(k), err)
	}
	delete(p.rules, k)
	p.counts.add(k.class(), -1)
	return nil
}

func (p *Program) putInfra(k lpmKey) error {
	if p.closed {
		return ErrClosed
	}
	if _, ok := p.infra[k]; ok {
		return nil
	}
	if len(p.infra) >= int(p.opts.MaxInfraPrefixes) {
		return fmt.Errorf("%w: Options.MaxInfraPrefixes is %d", ErrMapFull, p.opts.MaxInfraPrefixes)
	}
	if err := p.objs.SteerInfra.Update(&k, uint8(1), ebpf.UpdateNoExist); err != nil {
		return fmt.Errorf("steer: add infra prefix %v: %w", k.prefix(), err)
	}
	p.infra[k] = struct{}{}
	p.counts.add(classInfra, 1)
	return nil
}

func (p *Program) deleteInfra(k lpmKey) error {
	if p.closed {
		return ErrClosed
	}
	if _, ok := p.infra[k]; !ok {
		return nil
	}
	if err := p.objs.SteerInfra.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("steer: remove infra prefix %v: %w", k.prefix(), err)
	}
	delete(p.infra, k)
	p.counts.add(classInfra, -1)
	return nil
}

// SetSteerAll makes the program redirect every frame to the queue's
// socket (on) — ARP, ND and the node's own traffic included — or go back
// to the rules (off). It is for interfaces that belong to the data plane
// whole, such as examples/l2fwd's and the benchmarks' devices.
func (p *Program) SetSteerAll(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.all = on
	return p.writeClasses(p.counts.mask())
}

// SetDropNoSocket makes a frame the program steers to a queue without a
// registered socket be dropped (on), counted in Stats.NoSocketDropped,
// instead of passed to the kernel (off, the default), counted in
// Stats.NoSocket. A Host Agent sets it on its VM ports: while its sockets
// are re-opened (a data path rebuild), a VM's reply must not reach the
// kernel, which would forward it untranslated, with the DIP as its
// source, and make the client reset the connection. Dropped, it is
// retransmitted.
func (p *Program) SetDropNoSocket(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropNS = on
	return p.writeClasses(p.counts.mask())
}

func (p *Program) writeClasses(m uint32) error {
	if p.closed {
		return ErrClosed
	}
	if p.all {
		m |= classAll
	}
	if p.dropNS {
		m |= flagDropNoSock
	}
	if m == p.classes {
		return nil
	}
	if err := p.objs.SteerConfig.Update(uint32(0), steerSteerConfig{Classes: m}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("steer: write classes: %w", err)
	}
	p.classes = m
	return nil
}

func ruleString(k ruleKey) string {
	c := configOf(map[ruleKey]struct{}{k: {}}, nil)
	switch {
	case len(c.Dst) == 1:
		return c.Dst[0].String()
	case len(c.VXLAN) == 1:
		return c.VXLAN[0].String()
	}
	return c.Src[0].String()
}
