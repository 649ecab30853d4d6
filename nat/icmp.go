package nat

import (
	"encoding/binary"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

// ICMP errors (destination unreachable, fragmentation needed / packet too
// big, time exceeded, parameter problem) name a connection only through
// the packet they quote, so they are translated through the quote:
//
//   - Inbound: a router on the reply path reports a problem with a packet
//     the VIP sent (DSR: the VIP is the source of the replies); the Mux
//     forwards the error to the connection's DIP (balance.ICMP). The quote
//     is VIP:vport → client:cport; reversed, it is the connection's key, so
//     the rule and local backend are found exactly as for the connection's
//     packets. The outer destination VIP becomes the DIP, and the quoted
//     source VIP:vport becomes DIP:dport, so the VM's stack matches the
//     error to its socket (path MTU discovery works through the NAT).
//   - Return: the VM reports a problem with a client packet it received
//     (a UDP port unreachable, say). The quote is client:cport → DIP:dport;
//     reversed, it is the connection's return key, looked up in the table
//     (else the stateless index). The outer source DIP becomes the VIP and
//     the quoted destination DIP:dport becomes VIP:vport.
//
// An IPv6 quote's ports are found behind its extension headers
// (destination options, a first fragment's Fragment header, ...) as in a
// packet itself, with header.IPv6.QuotedTransportHeader (bounded by the
// quote and by header.IPv6MaxExtensionHeaders), and translated the same
// way; the chain itself is left as it is.
//
// Every checksum stays right: the outer IPv4 header's and (IPv6) the
// ICMPv6 pseudo-header's through header.RewriteIPv4/RewriteIPv6; the
// quoted IPv4 header checksum and the quoted TCP/UDP checksum when the
// quote holds it, through the header views' incremental updates; and the
// ICMP checksum over the rewritten quote bytes with header.ChecksumUpdate.
// An error never creates or changes connection state. A quote too short to
// hold the ports, a quoted non-first fragment, or (IPv6) a quote whose
// extension chain is cut by the end of the quote, too long or malformed
// (or holds a Routing header with Segments Left > 0, see quotedChain) is
// dropped as engine.DropBadL4.

// Quoted bytes the translation may change, edited in one run: the quoted
// IP header (at most maxQuoteIP bytes, an IPv6 extension chain included)
// and the first 20 bytes of the quoted transport header (TCP checksum
// included).
const maxQuoteEdit = maxQuoteIP + header.TCPMinSize

// maxQuoteIP is the longest quoted IP header rewriteQuote edits in place
// with the transport header: an IPv4 header's longest, an IPv6 header's
// with up to 20 bytes of extension headers. A longer IPv6 chain is
// skipped (rewriteQuoteChain).
const maxQuoteIP = 60

// quote is a parsed ICMP error quote.
type quote struct {
	icmp []byte // the ICMP message, header included, to the end of the IP payload
	l3   int    // offset of the quoted IP header in icmp
	l4   int    // offset of the quoted transport header in icmp
	key  flow.Key
}

// isICMPError reports whether p is an ICMP or ICMPv6 error message.
func isICMPError(p *engine.Packet) bool {
	if p.Flags&engine.FlagL4 == 0 || p.Flags&engine.FlagFragment != 0 {
		return false
	}
	switch p.L4Proto {
	case flow.ProtoICMP:
		if p.Flags&engine.FlagIPv4 == 0 {
			return false
		}
		t := p.Data()[p.L4Off]
		return t == header.ICMPv4DestUnreachable || t == header.ICMPv4TimeExceeded || t == icmpv4ParamProblem
	case flow.ProtoICMPv6:
		if p.Flags&engine.FlagIPv6 == 0 {
			return false
		}
		t := p.Data()[p.L4Off]
		return t >= header.ICMPv6DestUnreachable && t <= icmpv6ParamProblem
	}
	return false
}

const (
	icmpv4ParamProblem = 12 // RFC 792
	icmpv6ParamProblem = 4  // RFC 4443
)

// parseQuote reads the quoted packet of the ICMP error p. The quote's key
// is the quoted packet's own (not reversed), in p's VNI.
func parseQuote(p *engine.Packet, q *quote) bool {
	d := p.Data()
	var end int
	if p.Flags&engine.FlagIPv4 != 0 {
		ip := header.IPv4(p.L3())
		end = int(p.L3Off) + int(ip.TotalLength())
	} else {
		ip := header.IPv6(p.L3())
		end = int(p.L3Off) + header.IPv6Size + int(ip.PayloadLength())
	}
	q.icmp = d[p.L4Off:end]
	q.l3 = header.ICMPv4MinSize // ICMPv6 errors have the same 8-byte header
	b := q.icmp[q.l3:]
	var proto uint8
	if p.Flags&engine.FlagIPv4 != 0 {
		if len(b) < header.IPv4MinSize || b[0]>>4 != 4 {
			return false
		}
		ihl := int(b[0]&0x0f) * 4
		if ihl < header.IPv4MinSize || len(b) < ihl || binary.BigEndian.Uint16(b[6:])&0x1fff != 0 {
			return false // short, or a non-first fragment (no ports)
		}
		ip := header.IPv4(b)
		proto = ip.Protocol()
		q.l4 = q.l3 + ihl
		q.key.SetIPv4(p.Key.VNI, proto, ip.SrcSlice(), ip.DstSlice(), 0, 0)
	} else {
		if len(b) < header.IPv6Size || b[0]>>4 != 6 {
			return false
		}
		ip := header.IPv6(b)
		proto = ip.NextHeader()
		q.l4 = q.l3 + header.IPv6Size
		switch proto {
		case flow.ProtoTCP, flow.ProtoUDP, flow.ProtoICMPv6:
		default:
			var ok bool
			if proto, ok = quotedChain(q, ip); !ok {
				return false
			}
		}
		q.key.SetIPv6(p.Key.VNI, proto, ip.SrcSlice(), ip.DstSlice(), 0, 0)
	}
	if proto == flow.ProtoTCP || proto == flow.ProtoUDP {
		l4 := q.icmp[q.l4:]
		if len(l4) < 4 {
			return false
		}
		q.key.SrcPort, q.key.DstPort = binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
	}
	return true
}

// quotedChain finds the transport header of the quoted IPv6 packet ip,
// which has extension headers (or no TCP, UDP or ICMPv6 header at all),
// with header.IPv6.QuotedTransportHeader: the chain is walked as the
// parser walks a packet's own, bounded by the quote and by
// header.IPv6MaxExtensionHeaders. It sets q.l4 and returns the quoted
// protocol. It reports false, so the error is dropped, when the chain is
// cut by the end of the quote, too long or malformed, when the quote is
// of a non-first fragment (no ports), when the chain leads to no TCP, UDP
// or ICMPv6 header, or when it holds a Routing header with Segments Left
// > 0: then the quoted transport checksum's pseudo-header has the final
// destination, from the Routing header, not the quoted Dst, which
// rewriteQuote does not follow.
func quotedChain(q *quote, ip header.IPv6) (proto uint8, ok bool) {
	proto, off, frag, routed, err := ip.QuotedTransportHeader()
	if err != nil || frag.NonFirst() || routed {
		return 0, false
	}
	switch proto {
	case flow.ProtoTCP, flow.ProtoUDP, flow.ProtoICMPv6:
	default:
		return 0, false
	}
	q.l4 = q.l3 + off
	return proto, true
}

// rewriteQuote changes the address and port on one side of the quoted
// packet and updates the quoted checksums it holds and the ICMP checksum.
func rewriteQuote(q *quote, v4 bool, side header.Side, addr *[16]byte, port uint16) {
	if q.l4-q.l3 > maxQuoteIP {
		rewriteQuoteChain(q, side, addr, port)
		return
	}
	end := min(len(q.icmp), q.l4+header.TCPMinSize)
	edit := q.icmp[q.l3:end]
	edit = edit[:len(edit)&^1] // whole 16-bit words, all the changes lie within
	var old [maxQuoteEdit]byte
	copy(old[:], edit)

	l4 := q.icmp[q.l4:]
	var oldAddr, newAddr []byte
	if v4 {
		ip := header.IPv4(q.icmp[q.l3:])
		a4 := [4]byte(addr[:4])
		if side == header.SideSrc {
			oldAddr = old[12:16]
			ip.SetSrcWithChecksumUpdate(a4)
		} else {
			oldAddr = old[16:20]
			ip.SetDstWithChecksumUpdate(a4)
		}
		newAddr = addr[:4]
	} else {
		ip := header.IPv6(q.icmp[q.l3:])
		if side == header.SideSrc {
			oldAddr = old[8:24]
			ip.SetSrc(*addr)
		} else {
			oldAddr = old[24:40]
			ip.SetDst(*addr)
		}
		newAddr = addr[:]
	}
	// The quote may end anywhere in the transport header: edit a whole
	// header's worth of scratch and copy back the fields the quote holds
	// whole. A checksum field cut by the end of the quote is left as it is
	// (its missing byte is unknown, so the right value is too).
	var tmp [header.TCPMinSize]byte
	n := copy(tmp[:], l4)
	csOff := 0 // the transport checksum field's offset; 0: none to update
	switch q.key.Proto {
	case flow.ProtoTCP:
		t := header.TCP(tmp[:])
		t.UpdateChecksumPseudoHeaderAddress(oldAddr, newAddr)
		if side == header.SideSrc {
			t.SetSrcPortWithChecksumUpdate(port)
		} else {
			t.SetDstPortWithChecksumUpdate(port)
		}
		csOff = 16
	case flow.ProtoUDP:
		u := header.UDP(tmp[:header.UDPSize])
		u.UpdateChecksumPseudoHeaderAddress(oldAddr, newAddr)
		if side == header.SideSrc {
			u.SetSrcPortWithChecksumUpdate(port)
		} else {
			u.SetDstPortWithChecksumUpdate(port)
		}
		csOff = 6
	case flow.ProtoICMPv6:
		header.ICMPv6(tmp[:header.ICMPv6MinSize]).UpdateChecksumPseudoHeaderAddress(oldAddr, newAddr)
		csOff = 2
	}
	if n < csOff+2 {
		n = min(n, csOff)
	}
	copy(l4, tmp[:n])
	// The ICMP checksum covers the quote: account for every changed word.
	cs := binary.BigEndian.Uint16(q.icmp[2:])
	binary.BigEndian.PutUint16(q.icmp[2:], header.ChecksumUpdate(cs, old[:len(edit)], edit))
}

// rewriteQuoteChain is rewriteQuote for a quoted IPv6 packet whose
// extension headers are longer than rewriteQuote's scratch holds (more
// than maxQuoteIP-40 bytes). The translation changes nothing in the chain,
// so it rewrites a copy of the quote without it — the ICMP header, the
// fixed IPv6 header and the first bytes of the transport header — and
// copies those back. The ICMP checksum update is the same: the chain's
// words are unchanged and a one's-complement sum does not depend on where
// the changed words lie, both copies having them at even offsets (the
// chain is a multiple of 8 bytes long).
func rewriteQuoteChain(q *quote, side header.Side, addr *[16]byte, port uint16) {
	const l4 = header.ICMPv4MinSize + header.IPv6Size // q.l3 is ICMPv4MinSize
	var s [l4 + header.TCPMinSize]byte
	copy(s[:l4], q.icmp)
	n := copy(s[l4:], q.icmp[q.l4:])
	short := quote{icmp: s[:l4+n], l3: q.l3, l4: l4, key: q.key}
	rewriteQuote(&short, false, side, addr, port)
	copy(q.icmp[:l4], s[:l4])
	copy(q.icmp[q.l4:], s[l4:l4+n])
}

// inboundICMPError translates an ICMP error about a connection's reply (see
// the comment at the top of this file).
func (t *Translator) inboundICMPError(v *view, sb *snatBatch, p *engine.Packet, c *counts) engine.DropReason {
	var q quote
	if !parseQuote(p, &q) {
		return engine.DropBadL4
	}
	k := q.key.Reverse() // the connection: client → VIP
	if t.infra.contains(k.Family, &k.Src) {
		return DropInfra
	}
	r := v.snap.Lookup(&k)
	if r == nil {
		if sb != nil {
			// About an outbound connection (the quote: VIP:vport →
			// remote:rport)?
			hash := p.Hash
			if t.setHash {
				hash = t.hasher.SymmetricHash(&k)
			}
			if dr, handled := t.snat.inboundError(sb, p, &q, &k, c); handled {
				p.Hash = hash
				return dr
			}
		}
		return DropNoNATRule
	}
	lb := v.rules[r.ID].pick(macWord(p.Data()))
	if lb == nil {
		return DropNoLocalBackend
	}
	dport := lb.port
	if dport == 0 {
		dport = k.DstPort
	}
	if t.setHash {
		p.Hash = t.hasher.SymmetricHash(&k)
	}
	v4 := p.Flags&engine.FlagIPv4 != 0
	rewriteQuote(&q, v4, header.SideSrc, &lb.addr, dport)
	if !rewrite(p, header.SideDst, &lb.addr, 0) {
		return engine.DropUnsupported
	}
	p.Key.Dst = lb.addr
	p.Rule, p.Backend = r, lb.idx
	c[cICMPErrors]++
	return 0
}

// replyICMPError translates an ICMP error the VM sends about a client
// packet (see the comment at the top of this file).
func (t *Translator) replyICMPError(v *view, p *engine.Packet, now flow.Tick, c *counts) engine.DropReason {
	var q quote
	if !parseQuote(p, &q) {
		return engine.DropBadL4
	}
	ret := q.key.Reverse() // the connection's return key: DIP → client
	if t.infra.contains(ret.Family, &ret.Dst) {
		return DropInfra
	}
	var (
		vip   *[16]byte
		vport uint16
	)
	if id, _, ok := t.table.conns.Lookup(&ret, now); ok {
		vip, vport, _ = t.resolve(v, p, &ret, id, now)
	}
	if vip == nil {
		e, n := v.statelessLookup(&ret)
		if n != 1 || e.mode == vportUnknown {
			return DropNoState
		}
		vip, vport = &e.vip, e.vport
		if e.mode == vportSource {
			vport = ret.SrcPort
		}
		p.Rule, p.Backend = e.rule, e.idx
	}
	v4 := p.Flags&engine.FlagIPv4 != 0
	rewriteQuote(&q, v4, header.SideDst, vip, vport)
	if !rewrite(p, header.SideSrc, vip, 0) {
		return engine.DropUnsupported
	}
	p.Key.Src = *vip
	if t.setHash {
		ret.Src, ret.SrcPort = *vip, vport
		p.Hash = t.hasher.SymmetricHash(&ret)
	}
	p.OutPort = t.uplink
	c[cICMPErrors]++
	return 0
}
