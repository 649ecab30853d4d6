package control

import (
	"math"
	"net/netip"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// bgp decodes the top-level bgp section. With a nodes section (fleet),
// router_id belongs to each node and asn may too.
func (d *decoder) bgp(o *object, fleet bool) *BGP {
	b := &BGP{ListenPort: DefaultListenPort, HoldTime: DefaultHoldTime, WithdrawGrace: DefaultWithdrawGrace}
	if v := d.get(o, "asn"); v != nil {
		b.ASN, _ = d.asn(v, "bgp.asn")
	} else if !fleet {
		d.missing(o, "asn", "the local AS number, "+wantASN)
	}
	if v := d.get(o, "router_id"); v != nil {
		if fleet {
			d.errorf(v, "bgp.router_id", "a router id is per node, and this document has a nodes section that serves every node: move it to nodes.<name>.bgp.router_id")
		} else {
			b.RouterID, _ = d.addr(v, "bgp.router_id", "an IPv4 address", 4, false)
		}
	} else if !fleet {
		d.missing(o, "router_id", "an IPv4 address, usually the node's own")
	}
	zoned := d.bgpNode(o, "bgp", b)
	if !fleet && !b.NextHop6.IsValid() {
		// A fleet's nodes may set next_hop6 themselves: nodes checks
		// each node's merged bgp.
		for _, s := range zoned {
			d.errorf(s.node, s.path, "%s is a link-local peer, which needs bgp.next_hop6 (a global IPv6 address of this Mux on that link): %s", s.node.Value, whyNextHop6)
		}
	}
	if v := d.get(o, "listen_port"); v != nil {
		p, _ := d.uint(v, "bgp.listen_port", 0, math.MaxUint16, "0..65535; 0 means do not listen")
		b.ListenPort = int32(p)
	}
	if v := d.get(o, "hold_time"); v != nil {
		if t, ok := d.duration(v, "bgp.hold_time", 0, math.MaxUint16*time.Second); ok {
			switch {
			case t%time.Second != 0:
				d.errorf(v, "bgp.hold_time", "%s is not a whole number of seconds (BGP carries seconds)", v.Value)
			case t > 0 && t < 3*time.Second:
				d.errorf(v, "bgp.hold_time", "%s is too short (want 0, meaning no keepalives, or at least 3s: RFC 4271)", v.Value)
			default:
				b.HoldTime = t
			}
		}
	}
	if v := d.get(o, "withdraw_grace"); v != nil {
		b.WithdrawGrace, _ = d.duration(v, "bgp.withdraw_grace", 0, time.Hour)
	}
	if len(b.ListenAddresses) > 0 && b.ListenPort == 0 {
		d.errorf(o.val("listen_addresses"), "bgp.listen_addresses", "set, but listen_port is 0 (do not listen): drop one of them")
	}
	return b
}

func (d *decoder) asn(n *yaml.Node, path string) (uint32, bool) {
	v, ok := d.uint(n, path, 1, math.MaxUint32, wantASN)
	if ok && v == 23456 {
		d.errorf(n, path, "23456 is AS_TRANS, reserved for 2-byte-only speakers (RFC 6793); use the real AS number")
		return 0, false
	}
	return uint32(v), ok
}

// whyNextHop6 says why a link-local peer needs next_hop6.
const whyNextHop6 = "next-hop self would announce no usable next hop over a link-local session"

// bgpNode decodes the keys a node may set for itself (nodeBGPKeys) into
// b, with paths under p. It returns where the link-local peers with a zone
// are, which need next_hop6.
func (d *decoder) bgpNode(o *object, p string, b *BGP) (zoned []site) {
	if v := d.get(o, "listen_addresses"); v != nil {
		b.ListenAddresses = d.addrs(v, join(p, "listen_addresses"), "a local "+addrWords)
	}
	if v := d.get(o, "next_hop"); v != nil {
		b.NextHop, _ = d.addr(v, join(p, "next_hop"), wantAddr, 0, false)
		if b.NextHop.IsValid() && !b.NextHop.Is4() {
			d.errorf(v, join(p, "next_hop"), "%s is not an IPv4 address (next_hop is for IPv4 VIPs; use next_hop6 for IPv6 ones)", b.NextHop)
		}
	}
	if v := d.get(o, "next_hop6"); v != nil {
		b.NextHop6, _ = d.addr(v, join(p, "next_hop6"), wantAddr, 0, false)
		switch {
		case b.NextHop6.IsValid() && !b.NextHop6.Is6():
			d.errorf(v, join(p, "next_hop6"), "%s is not an IPv6 address (next_hop6 is the next hop of IPv6 VIPs)", b.NextHop6)
		case b.NextHop6.IsLinkLocalUnicast():
			d.errorf(v, join(p, "next_hop6"), "%s is a link-local address (want a global IPv6 address of this Mux: the BGP speaker announces only a global next hop)", b.NextHop6)
		}
	}
	seen := map[netip.Addr]site{}
	for i, pn := range d.list(o.val("peers"), join(p, "peers"), "peers") {
		path := index(join(p, "peers"), i)
		po := d.object(pn, path, peerKeys)
		if po == nil {
			if r := d.deref(pn); isNull(r) && !d.over {
				d.errorf(pn, path, "empty peer (want a mapping of %s)", keyList(peerKeys))
			}
			continue
		}
		p := Peer{Port: DefaultListenPort}
		if v := d.get(po, "address"); v != nil {
			if a, ok := d.addr(v, path+".address", wantAddr, 0, true); ok {
				p.Address = a
				if first, dup := seen[a]; dup {
					d.errorf(v, path+".address", "peer %v is listed twice (first at %v)", a, first)
				}
				seen[a] = site{path, v}
				if a.Zone() != "" {
					zoned = append(zoned, site{path + ".address", v})
				}
			}
		} else {
			d.missing(po, "address", "the peer's "+addrWords)
		}
		if v := d.get(po, "asn"); v != nil {
			p.ASN, _ = d.asn(v, path+".asn")
		} else {
			d.missing(po, "asn", "the peer's AS number, "+wantASN)
		}
		if v := d.get(po, "port"); v != nil {
			pp, _ := d.uint(v, path+".port", 1, math.MaxUint16, wantPort)
			p.Port = uint16(pp)
		}
		if v := d.get(po, "passive"); v != nil {
			p.Passive, _ = d.bool(v, path+".passive")
		}
		if v := d.get(po, "password"); v != nil {
			if pw, ok := d.str(v, path+".password", "the TCP-MD5 password, "+wantPassword); ok {
				switch {
				case pw == "" || len(pw) > MaxPasswordLen:
					d.errorf(v, path+".password", "%d bytes (want %s)", len(pw), wantPassword)
				case strings.ContainsRune(pw, 0):
					d.errorf(v, path+".password", "contains a NUL byte (want %s)", wantPassword)
				case p.Address.Zone() != "":
					d.errorf(v, path+".password", "TCP-MD5 is not supported with a link-local peer (%v): the BGP speaker cannot set the key for an address with a zone; drop the password, or peer over a global address", p.Address)
				default:
					p.Password = pw
				}
			}
		}
		if v := d.get(po, "ttl_security"); v != nil {
			h, _ := d.uint(v, path+".ttl_security", 0, MaxTTLSecurityHops, wantTTLSecurity)
			p.TTLSecurity = uint8(h)
		}
		b.Peers = append(b.Peers, p)
	}
	return zoned
}
