package nat

import (
	"encoding/binary"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// snatReturnKey is the returning key of the outgoing connection k once
// its source is vip:vport: (VNI, proto, remote:rport → VIP:vport).
func snatReturnKey(k *flow.Key, vip *[16]byte, vport uint16) flow.Key {
	var r flow.Key
	r.Src, r.Dst = k.Dst, *vip
	r.SrcPort, r.DstPort = k.DstPort, vport
	r.VNI, r.Proto, r.Family = k.VNI, k.Proto, k.Family
	return r
}

// snatOutKey is the outgoing key of the returning connection k whose DIP
// endpoint is dip:sport: (VNI, proto, DIP:sport → remote:rport).
func snatOutKey(k *flow.Key, dip *[16]byte, sport uint16) flow.Key {
	var o flow.Key
	o.Src, o.Dst = *dip, k.Src
	o.SrcPort, o.DstPort = sport, k.SrcPort
	o.VNI, o.Proto, o.Family = k.VNI, k.Proto, k.Family
	return o
}

// What the SNAT makes of a packet (snatKey).
const (
	snatNone  = iota // not the SNAT's
	snatPorts        // TCP or UDP: the key's ports
	snatEcho         // an ICMP or ICMPv6 echo request or reply: its identifier is the port
)

// snatKey returns the connection key of p as the SNAT keys it: p.Key for
// TCP and UDP; for an echo request (outgoing: reply false) p.Key with the
// identifier as source port, for an echo reply (returning) as
// destination port. kind is snatNone for anything else.
func snatKey(p *engine.Packet, reply bool) (k flow.Key, kind int) {
	if p.Flags&engine.FlagL4 == 0 {
		return k, snatNone
	}
	switch p.L4Proto {
	case flow.ProtoTCP, flow.ProtoUDP:
		return p.Key, snatPorts
	}
	if p.Flags&engine.FlagNonFirstFrag != 0 || !isEchoMsg(p, reply) {
		return k, snatNone
	}
	k = p.Key
	id := binary.BigEndian.Uint16(p.L4()[4:])
	if reply {
		k.DstPort = id
	} else {
		k.SrcPort = id
	}
	return k, snatEcho
}

// isEchoMsg reports whether p (its ICMP header validated) is an echo
// request, or with reply an echo reply, of its family's ICMP.
func isEchoMsg(p *engine.Packet, reply bool) bool {
	if p.Flags&engine.FlagL4 == 0 {
		return false
	}
	l4 := p.L4()
	if len(l4) < header.ICMPv4MinSize || l4[1] != 0 {
		return false
	}
	switch {
	case p.L4Proto == flow.ProtoICMP && p.Flags&engine.FlagIPv4 != 0:
		if reply {
			return l4[0] == header.ICMPv4EchoReply
		}
		return l4[0] == header.ICMPv4EchoRequest
	case p.L4Proto == flow.ProtoICMPv6 && p.Flags&engine.FlagIPv6 != 0:
		if reply {
			return l4[0] == header.ICMPv6EchoReply
		}
		return l4[0] == header.ICMPv6EchoRequest
	}
	return false
}

// setEchoID writes id as the identifier of the echo message m (ICMP or
// ICMPv6 header first), updating its checksum.
func setEchoID(m []byte, id uint16) {
	old := binary.BigEndian.Uint16(m[4:])
	binary.BigEndian.PutUint16(m[4:], id)
	binary.BigEndian.PutUint16(m[2:], header.ChecksumUpdate16(binary.BigEndian.Uint16(m[2:]), old, id))
}

// outbound translates the packet p of the outbound DIP d, whose key is
// (VNI, proto, DIP:sport → remote:rport), to VIP:vport. Without state it
// connects (claims a port) when create is set, else it reports the packet
// unhandled. handled false: not the SNAT's (a protocol it does not
// translate, or no state and !create); the caller decides.
func (s *SNAT) outbound(sb *snatBatch, d *outDIP, p *engine.Packet, create bool, c *counts) (r engine.DropReason, handled bool) {
	key, kind := snatKey(p, false)
	if kind == snatNone {
		return 0, false
	}
	k := &key
	var q flow.ConnQuery
	s.out.Prepare(&q, k)
	val, cur, age, ok := s.out.LookupPreparedAge(&q, sb.now)
	var vip *[16]byte
	if ok {
		if vip = s.vipAt(sb, val>>16); vip == nil {
			ok = false // not a value this SNAT wrote
		}
	}
	if ok && s.outSeen(sb, d, p, k, &q, vip, val, cur, age, c) {
		// Its port went to another connection to the same remote
		// endpoint (its returning entry was evicted meanwhile): the
		// connection starts over on a new port.
		if val, r = s.connect(sb, d, k, &q, true, c); r != 0 {
			return r, true
		}
	} else if !ok {
		if !create {
			return 0, false
		}
		if val, r = s.connect(sb, d, k, &q, false, c); r != 0 {
			return r, true
		}
	}
	if vip = s.vipAt(sb, val>>16); vip == nil {
		c[cSNAT+sRefused]++ // not a value this SNAT wrote
		return DropSNATTable, true
	}
	vport := uint16(val)
	if !rewrite(p, header.SideSrc, vip, vport) {
		return engine.DropUnsupported, true
	}
	p.Key.Src = *vip
	if kind == snatEcho {
		setEchoID(p.L4(), vport) // the key has no ports
		c[cSNAT+sICMP]++
	} else {
		p.Key.SrcPort = vport
	}
	p.Flags |= engine.FlagOutbound
	c[cSNAT+sOut]++
	return 0, true
}

// outSeen follows a connection's state on a packet from the VM: a FIN or
// RST closes a proven connection, a SYN after closing starts it over
// (both entries change class). It checks that the returning entry is
// there — on every packet of an untrusted connection, whose entries are
// evictable, and every 1/64 of the timeout of a proven one, which also
// keeps it as fresh as the outgoing one — and puts it back if it went
// missing. lost reports that another connection holds the port towards
// this remote endpoint now.
func (s *SNAT) outSeen(sb *snatBatch, d *outDIP, p *engine.Packet, k *flow.Key, q *flow.ConnQuery, vip *[16]byte, val uint32, cur flow.StateClass, age flow.Tick, c *counts) (lost bool) {
	next := cur
	if cur != flow.ClassUntrusted {
		next = cur.Advance(p.StateClass()) // only the remote's packets prove a connection
	}
	rk := snatReturnKey(k, vip, uint16(val))
	if next != cur {
		if !s.out.SetClassPrepared(q, next, sb.now) {
			next = cur
		} else if s.ret.SetClass(&rk, next, sb.now) {
			if next == flow.ClassClosing {
				c[cSNAT+sClosed]++
			}
			return false
		}
	}
	if next != flow.ClassUntrusted && age <= s.refresh[next] {
		return false
	}
	want := uint32(d.id)<<16 | uint32(k.SrcPort)
	var rq flow.ConnQuery
	s.ret.Prepare(&rq, &rk)
	if v, _, ok := s.ret.LookupPrepared(&rq, sb.now); ok {
		return v != want
	}
	return s.ret.ClaimPrepared(&rq, want, next, sb.now) == flow.InsertTaken
}

// connect gives the new connection k of DIP d a port: the first free one
// of up to maxProbes candidates in d's ranges, from the one its hash
// names. It claims the returning key (the port towards this remote
// endpoint), then stores the outgoing entry, and returns its value.
//
// replace: the connection has an outgoing entry whose port was lost; it
// is overwritten rather than claimed.
func (s *SNAT) connect(sb *snatBatch, d *outDIP, k *flow.Key, q *flow.ConnQuery, replace bool, c *counts) (uint32, engine.DropReason) {
	if d.total == 0 {
		c[cSNAT+sExhausted]++
		return 0, DropSNATExhausted
	}
	// The first candidate: span j, offset o.
	o := uint32(s.portHash(k) % uint64(d.total))
	j := 0
	for o >= d.spans[j].n {
		o -= d.spans[j].n
		j++
	}
	want := uint32(d.id)<<16 | uint32(k.SrcPort)
	rk := snatReturnKey(k, &d.vip, 0)
	var rq flow.ConnQuery
	for range min(d.total, maxProbes) {
		vport := d.spans[j].first + uint16(o)
		if o++; o == d.spans[j].n {
			o, j = 0, j+1
			if j == len(d.spans) {
				j = 0
			}
		}
		rk.DstPort = vport
		s.ret.Prepare(&rq, &rk)
		val := uint32(d.vipID)<<16 | uint32(vport)
		// A peek: probing a port must not keep another connection's
		// entry alive, or new connections retrying while the range is
		// full would keep it full forever.
		if v, cls, ok := s.ret.PeekPrepared(&rq, sb.now); ok {
			if v == want {
				// This connection's own returning entry, whose outgoing
				// one went missing: take the port back.
				s.out.InsertPrepared(q, val, cls, sb.now)
				return val, 0
			}
			continue // taken towards this remote endpoint
		}
		switch res := s.ret.ClaimPrepared(&rq, want, flow.ClassUntrusted, sb.now); {
		case res == flow.InsertTaken, res == flow.InsertBusy:
			continue // taken, or another worker holds its bucket: the next candidate
		case !res.Stored():
			c[cSNAT+sRefused]++
			return 0, DropSNATTable
		}
		var res flow.InsertResult
		if replace {
			res = s.out.InsertPrepared(q, val, flow.ClassUntrusted, sb.now)
		} else {
			res = s.out.ClaimPrepared(q, val, flow.ClassUntrusted, sb.now)
		}
		switch {
		case res == flow.InsertTaken:
			// Another worker connected the same flow at the same time:
			// use its port (the returning entry claimed here is
			// untrusted and expires soon).
			if v, _, ok := s.out.LookupPrepared(q, sb.now); ok {
				return v, 0
			}
			c[cSNAT+sRefused]++
			return 0, DropSNATTable
		case !res.Stored():
			c[cSNAT+sRefused]++
			return 0, DropSNATTable
		}
		stamp := &sb.st.stamps[d.vipID][vport]
		if t := stamp.Load(); t != 0 && sb.now-flow.Tick(t) < s.reuse {
			c[cSNAT+sReused]++
		}
		stamp.Store(uint32(max(sb.now, 1)))
		c[cSNAT+sCreated]++
		return val, 0
	}
	c[cSNAT+sExhausted]++
	return 0, DropSNATExhausted
}
