package nat

import (
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// Inbound is the stage that translates decapsulated client packets for a
// VIP to the local DIP the Mux chose, and records the connection. It runs
// after VXLAN decapsulation, which re-parsed the inner frame so that
// Packet.Key is (VNI, inner 5-tuple) and set OutPort to the VM's port. It
// is safe for concurrent use by several workers.
//
// Per packet:
//
//  1. the client (source) must not be an infrastructure address
//     (DropInfra);
//  2. the rule is Snapshot.Lookup of the key: (VNI, proto, VIP, port),
//     else the VIP's all-ports rule (DropNoRule);
//  3. the backend is the rule's backend hosted here (a Local in the rule's
//     VNI) whose MAC is the inner Ethernet destination, which the Mux set to
//     the MAC of the backend it picked; a local backend configured without a
//     MAC matches any frame (DropNoLocalBackend);
//  4. destination VIP:vport becomes DIP:dport, dport = Backend.Port or vport
//     when that is 0, with every checksum updated (header.RewriteIPv4 and
//     RewriteIPv6); Packet.Key follows, and Packet.Rule and Packet.Backend
//     record the rule and the backend's index;
//  5. the connection is recorded under its return key, with the state class
//     its TCP flags give (see Table).
//
// Non-first fragments take the by-address path described in the package
// documentation.
type Inbound struct{ t *Translator }

// Process implements engine.Stage. It works in two passes, as Return
// does: the first translates every packet and prepares the connection-table
// query of its return key (flow.ConnTable.Prepare, so the table's cache
// misses of the whole batch overlap), the second records the connections,
// in the batch's order.
func (s *Inbound) Process(b *engine.Batch) {
	t := s.t
	v := t.viewFor(b)
	now := t.clock()
	sc := t.scratchFor(b.Worker)
	pkts := b.Packets()
	var sbv snatBatch
	sb := t.snat.batch(&sbv)
	var c counts
	var tracked uint64 // packets whose connection is to be recorded
	for i, p := range pkts {
		lb, r := t.inbound(v, sb, p, sc, i, &c)
		switch {
		case r != 0:
			b.Drop(p, r)
		case lb != nil:
			sc.lb[i] = lb
			tracked |= 1 << uint(i)
		}
	}
	for i, p := range pkts {
		if tracked&(1<<uint(i)) != 0 {
			t.track(&sc.q[i], &sc.ret[i], sc.lb[i], sc.vport[i], p.StateClass(), now, &c)
			sc.lb[i] = nil // hold no backend past the batch
		}
	}
	t.flush(b.Worker, &c)
}

// inbound translates packet i of a batch; for a connection to record, it
// returns its local backend, with the return key, the VIP's port and the
// prepared query in sc's slot i.
func (t *Translator) inbound(v *view, sb *snatBatch, p *engine.Packet, sc *batchScratch, i int, c *counts) (*localBackend, engine.DropReason) {
	k := &p.Key
	if p.Flags&(engine.FlagIPv4|engine.FlagIPv6) == 0 || !k.IsValid() {
		return nil, engine.DropUnsupported
	}
	if p.L4Proto == flow.ProtoICMP || p.L4Proto == flow.ProtoICMPv6 {
		if isICMPError(p) {
			// From a router, about the connection to the quoted client.
			return nil, t.inboundICMPError(v, sb, p, c)
		}
	}
	if t.infra.contains(k.Family, &k.Src) {
		return nil, DropInfra
	}
	if p.Flags&engine.FlagNonFirstFrag != 0 {
		return nil, t.inboundFragment(v, p, c)
	}
	r := v.snap.Lookup(k)
	if r == nil {
		if sb != nil {
			// No rule: a reply to an outbound connection, on a port of
			// the VIP's pool?
			hash := p.Hash
			if t.setHash {
				hash = t.hasher.SymmetricHash(k) // remote → VIP, before translation
			}
			if dr, handled := t.snat.inbound(sb, p, c); handled {
				p.Hash = hash
				return nil, dr
			}
		}
		return nil, DropNoNATRule
	}
	lb := v.rules[r.ID].pick(macWord(p.Data()))
	if lb == nil {
		return nil, DropNoLocalBackend
	}
	vport := k.DstPort
	dport := lb.port
	if dport == 0 {
		dport = vport
	}
	if t.setHash {
		p.Hash = t.hasher.SymmetricHash(k) // client → VIP, before translation
	}
	if !rewrite(p, header.SideDst, &lb.addr, dport) {
		return nil, engine.DropUnsupported
	}
	// The return key, (VNI, proto, DIP:dport → client:cport), built in
	// place rather than by copying the key around with Reverse.
	ret := &sc.ret[i]
	ret.Src, ret.Dst = lb.addr, k.Src
	ret.SrcPort, ret.DstPort = dport, k.SrcPort
	ret.VNI, ret.Proto, ret.Family = k.VNI, k.Proto, k.Family
	k.Dst, k.DstPort = lb.addr, dport
	p.Rule, p.Backend = r, lb.idx
	t.table.conns.Prepare(&sc.q[i], ret)
	sc.vport[i] = vport
	c[cInbound]++
	return lb, 0
}

// track records or refreshes the connection whose return key is ret, with
// q prepared for it (ret is hashed once, for the lookup and the insert or
// class change that may follow), given the class the client's packet
// suggests.
//
// A connection is entered untrusted whatever its first packet, and is
// promoted by the trust rule of flow.ConnTable.Next (a later client packet,
// not a SYN, FIN or RST, ProveAfter after the entry was stored), as on the
// Mux: a flood of spoofed SYNs, FINs, RSTs, ACKs or datagrams that the Mux
// forwarded fills this table with evictable entries only.
func (t *Translator) track(q *flow.ConnQuery, ret *flow.Key, lb *localBackend, vport uint16, seen flow.StateClass, now flow.Tick, c *counts) {
	conns := t.table.conns
	if id, cur, age, ok := conns.LookupPreparedAge(q, now); ok && id == lb.id {
		next := conns.Next(cur, seen, age)
		if next != cur {
			if !conns.SetClassPrepared(q, next, now) {
				next = cur // refused (proven limit) or busy: as it was
			} else if cur == flow.ClassUntrusted {
				c[cPromoted]++
			}
		}
		if lb.needPort {
			// Keep the side entry as fresh as the main one, and right.
			if pv, pc, ok := t.table.ports.Lookup(ret, now); !ok || pv != portValue(vport, lb.id) || pc != next {
				t.table.ports.Insert(ret, portValue(vport, lb.id), next, now)
			}
		}
		return
	}
	res := conns.InsertPrepared(q, lb.id, flow.ClassUntrusted, now)
	if !res.Stored() {
		c[cRefused]++
		return
	}
	c[cNewFlows]++
	if res == flow.InsertEvicted {
		c[cEvicted]++
	}
	if lb.needPort {
		t.table.ports.Insert(ret, portValue(vport, lb.id), flow.ClassUntrusted, now)
	}
}

// inboundFragment translates a non-first fragment for a VIP by address
// only: it has no ports, so no rule or connection can be named, but the
// inner destination MAC still names the DIP the Mux sent the datagram to.
// The translation is (VNI, proto, VIP, MAC) → DIP when exactly one DIP
// address is possible; a local backend configured without a MAC is keyed
// by the zero MAC and used when no backend has the frame's MAC.
func (t *Translator) inboundFragment(v *view, p *engine.Packet, c *counts) engine.DropReason {
	k := &p.Key
	fk := fragInKey{vip: k.Dst, vni: k.VNI, mac: header.Ethernet(p.Data()).Dst(), proto: k.Proto, fam: k.Family}
	ch, ok := v.fragIn[fk]
	if !ok {
		fk.mac = header.MAC{}
		ch, ok = v.fragIn[fk]
	}
	if !ok || ch.ambiguous {
		return DropFragment
	}
	if t.setHash {
		p.Hash = t.hasher.SymmetricHash(k)
	}
	if !rewrite(p, header.SideDst, &ch.addr, 0) {
		return engine.DropUnsupported
	}
	k.Dst = ch.addr
	c[cFragments]++
	return 0
}

// rewrite changes the address (and, for TCP and UDP, the port) on one side
// of p with the header package's checksum-preserving rewrites.
func rewrite(p *engine.Packet, side header.Side, addr *[16]byte, port uint16) bool {
	l3 := p.L3()
	if p.Flags&engine.FlagIPv4 != 0 {
		return header.RewriteIPv4(header.IPv4(l3), side, [4]byte(addr[:4]), port) == nil
	}
	ip := header.IPv6(l3)
	if p.Flags&engine.FlagL4 != 0 && int(p.L4Off)-int(p.L3Off) == header.IPv6Size {
		// No extension headers (so no Routing header): the parser's
		// transport offset is all RewriteIPv6 needs.
		return header.RewriteIPv6(ip, header.IPv6Size, p.L4Proto, side, *addr, port) == nil
	}
	return header.RewriteIPv6Packet(ip, side, *addr, port) == nil
}
