package encap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/header"
)

// Drop reasons of the Decap stage. Malformed outer and inner headers are
// counted with the engine's reasons (truncated, bad_l2, not_ip, bad_ipv4,
// bad_ipv6, bad_l4).
var (
	// DropNotVXLAN: the outer packet is not UDP to the VXLAN port.
	DropNotVXLAN = engine.RegisterDropReason("not_vxlan")
	// DropNotLocal: the outer destination is not one of the host's
	// addresses.
	DropNotLocal = engine.RegisterDropReason("not_local")
	// DropBadVXLAN: the UDP payload is shorter than a VXLAN header, or
	// the I flag is clear.
	DropBadVXLAN = engine.RegisterDropReason("bad_vxlan")
	// DropVXLANFragment: the outer packet is an IP fragment; tunnel
	// packets are never reassembled (the sending Mux sets DF).
	DropVXLANFragment = engine.RegisterDropReason("vxlan_fragment")
	// DropUnknownLocal: no local endpoint has the VNI and inner
	// destination MAC.
	DropUnknownLocal = engine.RegisterDropReason("unknown_local")
	// DropBadOuterChecksum: the outer IPv4 header checksum, or (with
	// DecapConfig.VerifyUDPChecksum) a non-zero outer UDP checksum, is
	// wrong.
	DropBadOuterChecksum = engine.RegisterDropReason("bad_outer_checksum")
	// DropBadSource: DecapConfig.Sources is set and the outer source is
	// in none of its prefixes.
	DropBadSource = engine.RegisterDropReason("bad_tunnel_source")
	// DropECN: the outer header says Congestion Experienced and the
	// inner packet is not ECN-capable (RFC 6040 section 4.2).
	DropECN = engine.RegisterDropReason("ecn_ce_not_ect")
)

// DecapConfig is the plain configuration of a Decap stage.
type DecapConfig struct {
	// Addrs are the host's addresses that VXLAN packets are sent to (the
	// Backend.Host the Muxes use); at least one.
	Addrs []netip.Addr
	// Port is the VXLAN UDP port (default 4789).
	Port uint16
	// Sources, when not empty, are the prefixes outer source addresses
	// must come from (the Muxes); others are dropped with
	// bad_tunnel_source. Anyone who can reach the host's VXLAN port can
	// otherwise put frames on its endpoints' networks.
	Sources []netip.Prefix
	// VerifyUDPChecksum verifies non-zero outer UDP checksums (a full pass
	// over the packet). A zero checksum is accepted over IPv4 (RFC 7348)
	// and IPv6 (RFC 6935). The inner transport checksum protects the
	// payload end to end either way.
	VerifyUDPChecksum bool
}

// Validate reports a configuration that cannot work.
func (c DecapConfig) Validate() error {
	if len(c.Addrs) == 0 {
		return errors.New("encap: DecapConfig.Addrs is empty")
	}
	for _, a := range c.Addrs {
		if !a.IsValid() || a.Zone() != "" {
			return fmt.Errorf("encap: DecapConfig.Addrs: invalid address %v", a)
		}
	}
	for _, p := range c.Sources {
		if !p.IsValid() {
			return fmt.Errorf("encap: DecapConfig.Sources: invalid prefix %v", p)
		}
	}
	return nil
}

// Decap is the Host Agent's VXLAN decapsulation stage, for frames received
// on the uplink. It validates the outer headers — Ethernet (VLAN tags
// allowed), IPv4 (header checksum verified) or IPv6, destination one of
// the host's addresses, not a fragment, UDP to the VXLAN port with a
// length that matches the IP payload, VXLAN with the I flag — then finds
// the local endpoint by (VNI, inner destination MAC), strips the outer
// headers and parses the inner frame with engine.ParsePacket, so the
// packet's Key carries the VNI and the inner flow.
//
// On success p.OutPort is the endpoint's port and p.Backend is the
// endpoint's index in the Endpoints snapshot the stage used (p.Rule is nil);
// later stages get the endpoint with Endpoints.Of, which checks that index.
// ECN marks are propagated from the outer header to the inner one as
// RFC 6040 (normal mode) says.
//
// It is safe for concurrent use by several workers.
type Decap struct {
	cfg     DecapConfig
	addrs4  [][4]byte
	addrs6  [][16]byte
	locals  *EndpointTable
	sources []netip.Prefix
}

// NewDecap validates cfg and returns a Decap stage delivering to the
// endpoints published in locals.
func NewDecap(cfg DecapConfig, locals *EndpointTable) (*Decap, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if locals == nil {
		return nil, errors.New("encap: NewDecap: nil EndpointTable")
	}
	if cfg.Port == 0 {
		cfg.Port = header.VXLANPort
	}
	d := &Decap{cfg: cfg, locals: locals}
	for _, a := range cfg.Addrs {
		if a = a.Unmap(); a.Is4() {
			d.addrs4 = append(d.addrs4, a.As4())
		} else {
			d.addrs6 = append(d.addrs6, a.As16())
		}
	}
	for _, p := range cfg.Sources {
		d.sources = append(d.sources, p.Masked())
	}
	return d, nil
}

// Config returns the stage's configuration, defaults filled in.
func (d *Decap) Config() DecapConfig { return d.cfg }

// Process implements engine.Stage.
func (d *Decap) Process(b *engine.Batch) {
	ls := d.localsFor(b)
	for _, p := range b.Packets() {
		if r := d.decap(p, ls); r != 0 {
			b.Drop(p, r)
		}
	}
}

func headerReason(err error, bad engine.DropReason) engine.DropReason {
	if err == header.ErrTruncated {
		return engine.DropTruncated
	}
	return bad
}

func (d *Decap) decap(p *engine.Packet, ls *Endpoints) engine.DropReason {
	data := p.Data()
	et, l3, err := header.ParseEthernet(data)
	if err != nil {
		return headerReason(err, engine.DropBadL2)
	}
	var seg []byte // the UDP datagram, up to the end of the IP payload
	var l4 int     // its offset in data
	var pseudo uint16
	var ecn uint8 // outer ECN field
	switch et {
	case header.EtherTypeIPv4:
		ip := header.IPv4(data[l3:])
		if err := ip.Check(); err != nil {
			return headerReason(err, engine.DropBadIPv4)
		}
		if !ip.IsChecksumValid() {
			return DropBadOuterChecksum
		}
		if !d.local4(ip.DstSlice()) {
			return DropNotLocal
		}
		if ip.IsFragment() {
			return DropVXLANFragment
		}
		if ip.Protocol() != header.ProtoUDP {
			return DropNotVXLAN
		}
		if d.sources != nil && !d.fromSource(netip.AddrFrom4(ip.Src())) {
			return DropBadSource
		}
		l4 = l3 + ip.HeaderLength()
		seg = data[l4 : l3+int(ip.TotalLength())]
		ecn = ip.TOS() & ecnMask
		if d.cfg.VerifyUDPChecksum {
			pseudo = header.PseudoHeaderChecksum(header.ProtoUDP, ip.SrcSlice(), ip.DstSlice(), uint16(len(seg)))
		}
	case header.EtherTypeIPv6:
		ip := header.IPv6(data[l3:])
		if err := ip.Check(); err != nil {
			return headerReason(err, engine.DropBadIPv6)
		}
		if !d.local6(ip.DstSlice()) {
			return DropNotLocal
		}
		proto, off, frag, err := ip.TransportHeader()
		if err != nil {
			return headerReason(err, engine.DropBadIPv6)
		}
		if frag.IsFragment() {
			return DropVXLANFragment
		}
		if proto != header.ProtoUDP {
			return DropNotVXLAN
		}
		if d.sources != nil && !d.fromSource(netip.AddrFrom16(ip.Src())) {
			return DropBadSource
		}
		l4 = l3 + off
		seg = data[l4 : l3+header.IPv6Size+int(ip.PayloadLength())]
		ecn = ip.TrafficClass() & ecnMask
		if d.cfg.VerifyUDPChecksum {
			pseudo = header.PseudoHeaderChecksum(header.ProtoUDP, ip.SrcSlice(), ip.DstSlice(), uint16(len(seg)))
		}
	default:
		return engine.DropNotIP
	}

	u := header.UDP(seg)
	if err := u.Check(); err != nil {
		return headerReason(err, engine.DropBadL4)
	}
	if int(u.Length()) != len(seg) {
		return engine.DropBadL4 // UDP and IP disagree on the length
	}
	if u.DstPort() != d.cfg.Port {
		return DropNotVXLAN
	}
	if d.cfg.VerifyUDPChecksum && !u.IsChecksumValid(pseudo) {
		return DropBadOuterChecksum
	}
	vx := header.VXLAN(seg[header.UDPSize:])
	if vx.Check() != nil {
		return DropBadVXLAN
	}
	inner := vx.Payload()
	if len(inner) < header.EthernetSize {
		return engine.DropTruncated
	}
	vni := vx.VNI()
	idx, ok := ls.Lookup(vni, header.Ethernet(inner).Dst())
	if !ok {
		return DropUnknownLocal
	}

	// Drop the outer headers and any bytes after the UDP datagram
	// (Ethernet padding).
	p.TrimFront(l4 + header.UDPSize + header.VXLANSize)
	p.SetLen(len(inner))
	if r := engine.ParsePacket(p, vni); r != 0 {
		return r
	}
	if ecn != 0 {
		if r := decapECN(p, ecn); r != 0 {
			return r
		}
	}
	p.OutPort = ls.list[idx].OutPort
	p.Backend = int32(idx)
	p.Rule = nil
	p.Hash = 0
	return 0
}

func (d *Decap) local4(a []byte) bool {
	for i := range d.addrs4 {
		if [4]byte(a) == d.addrs4[i] {
			return true
		}
	}
	return false
}

func (d *Decap) local6(a []byte) bool {
	for i := range d.addrs6 {
		if [16]byte(a) == d.addrs6[i] {
			return true
		}
	}
	return false
}

func (d *Decap) fromSource(a netip.Addr) bool {
	for _, p := range d.sources {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ECN codepoints (RFC 3168), the low two bits of the IPv4 TOS and IPv6
// traffic class.
const (
	ecnMask   = 0x3
	ecnNotECT = 0x0
	ecnECT1   = 0x1
	ecnECT0   = 0x2
	ecnCE     = 0x3
)

// ecnCombine returns the inner ECN field after decapsulation given the
// arriving inner and outer fields (RFC 6040 section 4.2, figure 4), and
// whether the packet must be dropped (outer CE, inner Not-ECT).
func ecnCombine(inner, outer uint8) (uint8, bool) {
	switch {
	case inner == ecnNotECT:
		return inner, outer == ecnCE
	case outer == ecnCE:
		return ecnCE, false
	case inner == ecnECT0 && outer == ecnECT1:
		return ecnECT1, false
	}
	return inner, false
}

// decapECN applies ecnCombine to the parsed inner packet, updating the
// inner IPv4 header checksum incrementally (RFC 1624).
func decapECN(p *engine.Packet, outer uint8) engine.DropReason {
	data := p.Data()
	l3 := data[p.L3Off:]
	if p.Flags&engine.FlagIPv4 != 0 {
		ip := header.IPv4(l3)
		in := ip.TOS() & ecnMask
		e, drop := ecnCombine(in, outer)
		if drop {
			return DropECN
		}
		if e != in {
			old := binary.BigEndian.Uint16(ip[0:])
			ip[1] = ip[1]&^ecnMask | e
			ip.SetChecksum(header.ChecksumUpdate16(ip.Checksum(), old, binary.BigEndian.Uint16(ip[0:])))
		}
		return 0
	}
	// IPv6: the traffic class straddles bytes 0 and 1; its ECN bits are
	// bits 4 and 5 of byte 1. No header checksum.
	in := l3[1] >> 4 & ecnMask
	e, drop := ecnCombine(in, outer)
	if drop {
		return DropECN
	}
	l3[1] = l3[1]&^(ecnMask<<4) | e<<4
	return 0
}

var _ engine.Stage = (*Decap)(nil)

// EndpointsSource is a batch snapshot (engine.Batch.Snapshot) that carries
// the local endpoints, so that Decap reads the batch's version of them.
type EndpointsSource interface{ BatchEndpoints() *Endpoints }

// localsFor returns the endpoints of batch b: its snapshot's, when that is
// a EndpointsSource, else the EndpointTable's current ones.
func (d *Decap) localsFor(b *engine.Batch) *Endpoints {
	if ls, ok := b.Snapshot.(EndpointsSource); ok {
		if l := ls.BatchEndpoints(); l != nil {
			return l
		}
	}
	return d.locals.Load()
}
