package nat

import (
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// inbound translates a packet that reached an outbound VIP's port (after
// decapsulation: (VNI, proto, remote:rport → VIP:vport)) back to the DIP
// endpoint of its connection. handled false: not the SNAT's (no state,
// and the address is not an outbound VIP); the caller drops it as before.
func (s *SNAT) inbound(sb *snatBatch, p *engine.Packet, c *counts) (r engine.DropReason, handled bool) {
	k := &p.Key
	vid, isVIP := sb.st.vips[vipKey{addr: k.Dst, fam: k.Family}]
	if !snatProto(p) {
		return 0, false
	}
	var q flow.ConnQuery
	s.ret.Prepare(&q, k)
	val, cur, age, ok := s.ret.LookupPreparedAge(&q, sb.now)
	id := val >> 16
	if !ok || id == 0 || int(id) >= len(sb.st.dipByID) {
		if !isVIP {
			return 0, false
		}
		c[cSNAT+sNoState]++
		return DropSNATNoState, true
	}
	dr := &sb.st.dipByID[id]
	if dr.vni != k.VNI || dr.fam != k.Family {
		c[cSNAT+sNoState]++
		return DropSNATNoState, true
	}
	sport := uint16(val)
	s.inSeen(sb, p, &q, dr, sport, vid, isVIP, cur, age, c)
	if !rewrite(p, header.SideDst, &dr.addr, sport) {
		return engine.DropUnsupported, true
	}
	k.Dst, k.DstPort = dr.addr, sport
	p.Flags |= engine.FlagOutbound
	c[cSNAT+sIn]++
	return 0, true
}

// inSeen follows a connection's state on a packet from the remote: its
// first packet that is not a SYN (a SYN-ACK, a datagram) proves an
// untrusted connection (established, or udp); a FIN or RST closes a
// proven one; otherwise the outgoing entry is kept as fresh as the
// returning one, and put back if it went missing.
func (s *SNAT) inSeen(sb *snatBatch, p *engine.Packet, q *flow.ConnQuery, dr *dipRef, sport, vid uint16, isVIP bool, cur flow.StateClass, age flow.Tick, c *counts) {
	seen := p.StateClass()
	next := cur
	switch {
	case cur != flow.ClassUntrusted:
		next = cur.Advance(seen)
	case seen == flow.ClassEstablished || seen == flow.ClassUDP:
		next = seen
	}
	ok := snatOutKey(&p.Key, &dr.addr, sport)
	if next != cur {
		if s.ret.SetClassPrepared(q, next, sb.now) {
			s.out.SetClass(&ok, next, sb.now)
			if next == flow.ClassClosing {
				c[cSNAT+sClosed]++
			}
		}
		return
	}
	if age <= s.refresh[cur] {
		return
	}
	var oq flow.ConnQuery
	s.out.Prepare(&oq, &ok)
	if _, _, hit := s.out.LookupPrepared(&oq, sb.now); !hit && isVIP {
		s.out.ClaimPrepared(&oq, uint32(vid)<<16|uint32(p.Key.DstPort), cur, sb.now)
	}
}
