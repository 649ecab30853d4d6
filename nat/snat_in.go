package nat

import (
	"encoding/binary"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// inbound translates a packet that reached an outbound VIP's port (after
// decapsulation: (VNI, proto, remote:rport → VIP:vport)) back to the DIP
// endpoint of its connection. handled false: not the SNAT's (no state,
// and the address is not an outbound VIP); the caller drops it as before.
func (s *SNAT) inbound(sb *snatBatch, p *engine.Packet, c *counts) (r engine.DropReason, handled bool) {
	key, kind := snatKey(p, true)
	k := &key
	vid, isVIP := sb.st.vips[vipKey{addr: p.Key.Dst, fam: p.Key.Family}]
	if kind == snatNone {
		return 0, false
	}
	var q flow.ConnQuery
	s.ret.Prepare(&q, k)
	val, cur, age, ok := s.ret.LookupPreparedAge(&q, sb.now)
	var dr *dipRef
	if ok {
		dr = s.dipAt(sb, val>>16)
	}
	if dr == nil {
		if !isVIP {
			return 0, false
		}
		c[cSNAT+sNoState]++
		return DropSNATNoState, true
	}
	if dr.vni != k.VNI || dr.fam != k.Family {
		c[cSNAT+sNoState]++
		return DropSNATNoState, true
	}
	sport := uint16(val)
	s.inSeen(sb, p, k, &q, dr, sport, vid, isVIP, cur, age, c)
	if !rewrite(p, header.SideDst, &dr.addr, sport) {
		return engine.DropUnsupported, true
	}
	p.Key.Dst = dr.addr
	if kind == snatEcho {
		setEchoID(p.L4(), sport) // the key has no ports
		c[cSNAT+sICMP]++
	} else {
		p.Key.DstPort = sport
	}
	p.Flags |= engine.FlagOutbound
	c[cSNAT+sIn]++
	return 0, true
}

// inSeen follows a connection's state on a packet from the remote: its
// first packet that is not a SYN (a SYN-ACK, a datagram) proves an
// untrusted connection (established, or udp); a FIN or RST closes a
// proven one; otherwise the outgoing entry is kept as fresh as the
// returning one, and put back if it went missing.
func (s *SNAT) inSeen(sb *snatBatch, p *engine.Packet, k *flow.Key, q *flow.ConnQuery, dr *dipRef, sport, vid uint16, isVIP bool, cur flow.StateClass, age flow.Tick, c *counts) {
	seen := p.StateClass()
	next := cur
	switch {
	case cur != flow.ClassUntrusted:
		next = cur.Advance(seen)
	case seen == flow.ClassEstablished || seen == flow.ClassUDP:
		next = seen
	}
	ok := snatOutKey(k, &dr.addr, sport)
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
		s.out.ClaimPrepared(&oq, uint32(vid)<<16|uint32(k.DstPort), cur, sb.now)
	}
}

// inboundError translates an ICMP or ICMPv6 error a router sends to an
// outbound VIP about a packet of an outbound connection: the quote is
// VIP:vport → remote:rport (a quoted echo request: VIP → remote with the
// identifier vport), and k, the quote reversed, is the connection's
// returning key. The outer destination becomes the DIP, the quoted
// source DIP:sport (a quoted echo's identifier the original one), every
// checksum kept right. Errors never create or change state. A quoted
// ICMP message too short for an echo's header (its identifier) is
// dropped as engine.DropBadL4 when the address is an outbound VIP.
// handled false: not the SNAT's (no state, and the address is not an
// outbound VIP).
func (s *SNAT) inboundError(sb *snatBatch, p *engine.Packet, q *quote, k *flow.Key, c *counts) (r engine.DropReason, handled bool) {
	_, isVIP := sb.st.vips[vipKey{addr: k.Dst, fam: k.Family}]
	echo := false
	switch k.Proto {
	case flow.ProtoTCP, flow.ProtoUDP:
	case flow.ProtoICMP, flow.ProtoICMPv6:
		l4 := q.icmp[q.l4:]
		if len(l4) < header.ICMPv4MinSize {
			// Too short for an echo's identifier, its port: unreadable,
			// like a TCP or UDP quote without its ports (parseQuote).
			if !isVIP {
				return 0, false
			}
			return engine.DropBadL4, true
		}
		want := uint8(header.ICMPv4EchoRequest)
		if k.Proto == flow.ProtoICMPv6 {
			want = header.ICMPv6EchoRequest
		}
		if l4[0] != want || l4[1] != 0 {
			return 0, false
		}
		k.DstPort, echo = binary.BigEndian.Uint16(l4[4:]), true
	default:
		return 0, false
	}
	val, _, ok := s.ret.Lookup(k, sb.now)
	var dr *dipRef
	if ok {
		dr = s.dipAt(sb, val>>16)
	}
	if dr == nil || dr.vni != k.VNI || dr.fam != k.Family {
		if !isVIP {
			return 0, false
		}
		c[cSNAT+sNoState]++
		return DropSNATNoState, true
	}
	sport := uint16(val)
	v4 := p.Flags&engine.FlagIPv4 != 0
	rewriteQuote(q, v4, header.SideSrc, &dr.addr, sport)
	if echo {
		// The quoted identifier, and the quoted ICMP checksum when the
		// quote holds it; the error's checksum covers both words.
		m := q.icmp[q.l4:]
		oldID := binary.BigEndian.Uint16(m[4:])
		binary.BigEndian.PutUint16(m[4:], sport)
		cs := binary.BigEndian.Uint16(q.icmp[2:])
		cs = header.ChecksumUpdate16(cs, oldID, sport)
		oldCS := binary.BigEndian.Uint16(m[2:])
		newCS := header.ChecksumUpdate16(oldCS, oldID, sport)
		binary.BigEndian.PutUint16(m[2:], newCS)
		cs = header.ChecksumUpdate16(cs, oldCS, newCS)
		binary.BigEndian.PutUint16(q.icmp[2:], cs)
	}
	if !rewrite(p, header.SideDst, &dr.addr, 0) {
		return engine.DropUnsupported, true
	}
	p.Key.Dst = dr.addr
	p.Flags |= engine.FlagOutbound
	c[cSNAT+sICMP]++
	return 0, true
}
