package nat

import (
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// Return is the stage that translates a VM's replies back to the VIP and
// sends them out of the uplink, straight to the client (Direct Server
// Return: the Mux never sees them). It runs on a VM port's pipeline after
// Parse, whose VNI is the VM port's tenant network, so Packet.Key is (VNI,
// DIP:dport → client:cport). It is safe for concurrent use by several
// workers.
//
// Per packet:
//
//  1. the client (destination) must not be an infrastructure address:
//     such traffic is never translated (DropInfra);
//  2. the NAT state is looked up by the packet's own key; a hit names the
//     backend (by ID), whose rule gives the VIP address, and the VIP port
//     is derived or read from the side table (see Table). A hit whose
//     backend was removed, moved or is no longer local counts as Stale
//     and is treated as a miss;
//  3. on a miss (the agent restarted, or the entry expired) the reply is
//     translated statelessly when its (VNI, proto, source address, source
//     port) is the local backend endpoint of exactly one rule (Stats.
//     Stateless); no rule, or more than one (Stats.Ambiguous), or a rule
//     whose VIP port cannot be derived, or a TCP SYN without ACK (which
//     opens a connection and so is never a reply): DropNoState. Nothing is
//     entered in the table: the client's next packet through Inbound does
//     that. A TCP SYN-ACK without state opens a direct connection (not
//     through a VIP; see the package documentation): it and the later
//     packets of that connection leave untranslated on Config.Direct;
//  4. source DIP:dport becomes VIP:vport with every checksum updated;
//     Packet.Key follows, Packet.Rule and Packet.Backend record the rule
//     and backend; OutPort is the uplink. A FIN or RST from the server
//     moves the connection to the closing class.
type Return struct{ t *Translator }

// Process implements engine.Stage. It works in two passes: the first
// prepares the connection-table lookup of every reply
// (flow.ConnTable.Prepare, so the table's cache misses of the whole batch
// overlap), the second translates.
func (s *Return) Process(b *engine.Batch) {
	t := s.t
	v := t.viewFor(b)
	now := t.clock()
	sc := t.scratchFor(b.Worker)
	pkts := b.Packets()
	var sbv snatBatch
	sb := t.snat.batch(&sbv)
	var c counts
	var plain uint64 // replies looked up by their own key
	for i, p := range pkts {
		if t.replyKind(p) == replyPlain {
			t.table.conns.Prepare(&sc.q[i], &p.Key)
			plain |= 1 << uint(i)
		}
	}
	for i, p := range pkts {
		var r engine.DropReason
		var direct bool
		if plain&(1<<uint(i)) != 0 {
			r, direct = t.replyPlain(v, sb, p, &sc.q[i], now, &c)
		} else {
			r, direct = t.reply(v, sb, p, now, &c)
		}
		switch {
		case r != 0:
			b.Drop(p, r)
		case direct:
			b.Emit(p) // untranslated, to Config.Direct: no later stage
		}
	}
	t.flush(b.Worker, &c)
}

// Kinds of packets the Return stage sees.
const (
	replyPlain = iota // a TCP/UDP/ICMP packet to translate by its own key
	replyUnsupported
	replyInfra
	replyFragment
	replyICMPError
)

// replyKind sorts a packet from a VM.
func (t *Translator) replyKind(p *engine.Packet) int {
	k := &p.Key
	switch {
	case p.Flags&(engine.FlagIPv4|engine.FlagIPv6) == 0 || !k.IsValid():
		return replyUnsupported
	case t.infra.contains(k.Family, &k.Dst):
		return replyInfra
	case p.Flags&engine.FlagNonFirstFrag != 0:
		return replyFragment
	case (p.L4Proto == flow.ProtoICMP || p.L4Proto == flow.ProtoICMPv6) && isICMPError(p):
		return replyICMPError
	}
	return replyPlain
}

// reply translates one packet from a VM without a prepared query.
func (t *Translator) reply(v *view, sb *snatBatch, p *engine.Packet, now flow.Tick, c *counts) (engine.DropReason, bool) {
	switch t.replyKind(p) {
	case replyUnsupported:
		return engine.DropUnsupported, false
	case replyInfra:
		return DropInfra, false
	case replyFragment:
		return t.replyFragment(v, p, c), false
	case replyICMPError:
		return t.replyICMPError(v, p, now, c), false
	}
	var q flow.ConnQuery
	t.table.conns.Prepare(&q, &p.Key)
	return t.replyPlain(v, sb, p, &q, now, c)
}

// replyPlain translates a plain reply whose lookup q prepared. direct
// reports a packet of a direct connection, to pass on untranslated.
//
// A packet no DSR connection claims, from a DIP of the SNAT's outbound
// sections (sb, nil without a SNAT), is the SNAT's: a SYN at once, a
// packet of a known outbound connection before the stateless DSR match,
// any other after it fails (see the package documentation, "Outbound
// connections").
func (t *Translator) replyPlain(v *view, sb *snatBatch, p *engine.Packet, q *flow.ConnQuery, now flow.Tick, c *counts) (_ engine.DropReason, direct bool) {
	k := &p.Key
	var (
		vip   *[16]byte
		vport uint16
	)
	if id, cur, ok := t.table.conns.LookupPrepared(q, now); ok {
		if id == flow.ReservedID {
			return t.passDirect(p, q, cur, now, c)
		}
		if vip, vport, ok = t.fromState(v, p, id, now); ok {
			// A FIN or RST from the VM closes a proven connection; an
			// untrusted one stays untrusted (evictable) — a VM's RST to a
			// flood's spoofed ACKs must not make their entries proven.
			if cur != flow.ClassClosing && cur != flow.ClassUntrusted && p.StateClass() == flow.ClassClosing {
				t.table.conns.SetClassPrepared(q, flow.ClassClosing, now)
				t.table.ports.SetClass(k, flow.ClassClosing, now) // if it has a side entry
			}
			c[cReturn]++
		} else {
			vip = nil
			c[cStale]++
		}
	}
	if vip == nil {
		var d *outDIP // the source's outbound configuration, if any
		if sb != nil {
			d = sb.st.dip(k)
		}
		if p.StateClass() == flow.ClassUntrusted {
			// A SYN without ACK opens a connection (the VM's own,
			// outbound): it is never a reply, whatever its source.
			if d != nil {
				return t.snatOut(sb, d, p, c)
			}
			return DropNoState, false
		}
		if d != nil && p.L4Proto != flow.ProtoTCP && p.L4Proto != flow.ProtoUDP && isEchoMsg(p, false) {
			// Nor is an echo request (a ping answers with echo
			// replies): an outbound DIP's ping is the SNAT's.
			return t.snatOut(sb, d, p, c)
		}
		if isSynAck(p) {
			// The SYN this answers reached the VM without passing
			// Inbound: a direct connection, never translated. Its entry
			// is stored untrusted and promoted (passDirect), which the
			// table's cap on proven entries may refuse: a VM's SYN-ACKs
			// must not fill the table with entries no new connection
			// may take.
			cur := flow.ClassUntrusted
			if res := t.table.conns.InsertPrepared(q, flow.ReservedID, cur, now); res.Stored() {
				c[cDirectFlows]++
			}
			return t.passDirect(p, q, cur, now, c)
		}
		if d != nil && !d.local.contains(k.Family, &k.Dst) {
			// A known outbound connection before the stateless match,
			// which an all-ports rule of the DIP would claim.
			if r, handled := t.snat.outbound(sb, d, p, false, c); handled {
				return t.snatDone(p, r)
			}
		}
		e, n := v.statelessLookup(k)
		if n != 1 || e.mode == vportUnknown {
			if d != nil {
				return t.snatOut(sb, d, p, c)
			}
			if n > 1 {
				c[cAmbiguous]++ // a part of the nat_no_state drops
			}
			return DropNoState, false
		}
		vip, vport = &e.vip, e.vport
		if e.mode == vportSource {
			vport = k.SrcPort
		}
		p.Rule, p.Backend = e.rule, e.idx
		c[cStateless]++
	}
	if !rewrite(p, header.SideSrc, vip, vport) {
		return engine.DropUnsupported, false
	}
	k.Src, k.SrcPort = *vip, vport
	if t.setHash {
		p.Hash = t.hasher.SymmetricHash(k) // VIP → client, after translation
	}
	p.OutPort = t.uplink
	return 0, false
}

// snatOut hands the packet p of the outbound DIP d to the SNAT: east-west
// traffic (a destination in d's local prefixes) leaves untranslated on
// Config.Direct (direct true), the rest is translated to the VIP, or
// connects. A packet of a protocol the SNAT does not translate leaves
// untranslated on Config.Direct too: the host routes it, as it did
// before the DIP's traffic was steered to the data path.
func (t *Translator) snatOut(sb *snatBatch, d *outDIP, p *engine.Packet, c *counts) (engine.DropReason, bool) {
	k := &p.Key
	if d.local.contains(k.Family, &k.Dst) {
		return t.snatPass(p, sLocal, c)
	}
	r, handled := t.snat.outbound(sb, d, p, true, c)
	if !handled {
		return t.snatPass(p, sPassed, c)
	}
	return t.snatDone(p, r)
}

// snatPass passes an outbound DIP's packet on untranslated, to
// Config.Direct, counting it in the SNAT counter i.
func (t *Translator) snatPass(p *engine.Packet, i int, c *counts) (engine.DropReason, bool) {
	if !t.hasDir {
		return DropDirect, false
	}
	p.OutPort = t.direct
	c[cSNAT+i]++
	return 0, true
}

// snatDone finishes a packet the SNAT translated (r == 0): it leaves on
// the uplink, like a DSR reply.
func (t *Translator) snatDone(p *engine.Packet, r engine.DropReason) (engine.DropReason, bool) {
	if r != 0 {
		return r, false
	}
	if t.setHash {
		p.Hash = t.hasher.SymmetricHash(&p.Key) // VIP → remote, after translation
	}
	p.OutPort = t.uplink
	return 0, false
}

// isSynAck reports whether p is a TCP segment with SYN and ACK set.
func isSynAck(p *engine.Packet) bool {
	if p.L4Proto != flow.ProtoTCP || p.Flags&engine.FlagL4 == 0 {
		return false
	}
	const synAck = header.TCPFlagSyn | header.TCPFlagAck
	return header.TCP(p.L4()).Flags()&synAck == synAck
}

// passDirect sends a packet of the direct connection q (marked in the
// table with flow.ReservedID) on untranslated, to Config.Direct, and
// moves the connection to the closing class on a FIN or RST, or, while it
// is untrusted, to the established class: within the table's cap on proven
// entries (flow.ConnTableConfig.ProvenShare), so that the VM's packets
// never take the room new connections need.
func (t *Translator) passDirect(p *engine.Packet, q *flow.ConnQuery, cur flow.StateClass, now flow.Tick, c *counts) (engine.DropReason, bool) {
	switch seen := p.StateClass(); {
	case cur != flow.ClassClosing && seen == flow.ClassClosing:
		t.table.conns.SetClassPrepared(q, flow.ClassClosing, now)
	case cur == flow.ClassUntrusted:
		t.table.conns.SetClassPrepared(q, flow.ClassEstablished, now)
	}
	if !t.hasDir {
		return DropDirect, false
	}
	p.OutPort = t.direct
	c[cDirect]++
	return 0, true
}

// fromState resolves a table hit for the reply p to the VIP address and
// port, checking that the backend still exists, is still local, and is the
// packet's source; it records the rule and backend in p.
func (t *Translator) fromState(v *view, p *engine.Packet, id uint32, now flow.Tick) (*[16]byte, uint16, bool) {
	return t.resolve(v, p, &p.Key, id, now)
}

// resolve is fromState for a reply key k that may differ from p's own (the
// quote of an ICMP error).
func (t *Translator) resolve(v *view, p *engine.Packet, k *flow.Key, id uint32, now flow.Tick) (*[16]byte, uint16, bool) {
	e := v.local(id) // the backend, if it is still configured and local
	if e == nil || e.rule.VIP.VNI != k.VNI || e.lb.addr != k.Src {
		return nil, 0, false
	}
	r, ri, lb := e.rule, e.ri, e.lb
	if lb.port != 0 && lb.port != k.SrcPort || lb.port == 0 && r.VIP.Port != 0 && r.VIP.Port != k.SrcPort {
		return nil, 0, false // the backend's port changed under the connection
	}
	vport := r.VIP.Port
	switch {
	case vport != 0:
	case !lb.needPort:
		vport = k.SrcPort
	default:
		pv, _, ok := t.table.ports.Lookup(k, now)
		if !ok || !portValueID(pv, id) {
			return nil, 0, false
		}
		vport = uint16(pv)
	}
	p.Rule, p.Backend = r, lb.idx
	return &ri.vip, vport, true
}

// replyFragment translates a non-first fragment of a reply by address: the
// DIP must be the local backend address of rules of a single VIP address
// (in that VNI and protocol).
func (t *Translator) replyFragment(v *view, p *engine.Packet, c *counts) engine.DropReason {
	k := &p.Key
	ch, ok := v.fragOut[fragOutKey{dip: k.Src, vni: k.VNI, proto: k.Proto, fam: k.Family}]
	if !ok || ch.ambiguous {
		return DropFragment
	}
	if !rewrite(p, header.SideSrc, &ch.addr, 0) {
		return engine.DropUnsupported
	}
	k.Src = ch.addr
	if t.setHash {
		p.Hash = t.hasher.SymmetricHash(k)
	}
	p.OutPort = t.uplink
	c[cFragments]++
	return 0
}
