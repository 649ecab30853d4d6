package bgp

import (
	"fmt"
	"net/netip"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"google.golang.org/protobuf/types/known/anypb"
)

// This file is the only place that knows GoBGP's API types: it turns the
// package's plain values into GoBGP requests and back.

var (
	familyIPv4 = &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	familyIPv6 = &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
)

// checkPrefix accepts a prefix the Announcer can announce: valid, in
// canonical (masked) form, IPv4 or plain IPv6 (not IPv4-mapped).
func checkPrefix(p netip.Prefix) error {
	a := p.Addr()
	switch {
	case !p.IsValid():
		return fmt.Errorf("bgp: invalid prefix %v", p)
	case a.Is4In6():
		return fmt.Errorf("bgp: prefix %v: IPv4-mapped IPv6, use the IPv4 prefix", p)
	case p.Masked() != p:
		return fmt.Errorf("bgp: prefix %v has host bits set (want %v)", p, p.Masked())
	}
	return nil
}

// apiPath builds the GoBGP path announcing p with next hop nh. An invalid
// nh means next-hop self: GoBGP puts the session's local address into an
// unspecified (0.0.0.0 or ::) next hop of a locally originated path.
func apiPath(p netip.Prefix, nh netip.Addr) (*api.Path, error) {
	nlri, err := anypb.New(&api.IPAddressPrefix{
		Prefix:    p.Addr().String(),
		PrefixLen: uint32(p.Bits()),
	})
	if err != nil {
		return nil, err
	}
	origin, err := anypb.New(&api.OriginAttribute{Origin: 0}) // IGP
	if err != nil {
		return nil, err
	}
	var hop *anypb.Any
	family := familyIPv4
	if p.Addr().Is4() {
		if !nh.IsValid() {
			nh = netip.IPv4Unspecified()
		}
		hop, err = anypb.New(&api.NextHopAttribute{NextHop: nh.String()})
	} else {
		family = familyIPv6
		if !nh.IsValid() {
			nh = netip.IPv6Unspecified()
		}
		hop, err = anypb.New(&api.MpReachNLRIAttribute{
			Family:   familyIPv6,
			NextHops: []string{nh.String()},
			Nlris:    []*anypb.Any{nlri},
		})
	}
	if err != nil {
		return nil, err
	}
	return &api.Path{Family: family, Nlri: nlri, Pattrs: []*anypb.Any{origin, hop}}, nil
}

// peerSpec is everything the Announcer configures on one GoBGP neighbour;
// a peer is re-created when its spec changes.
type peerSpec struct {
	Peer
	hold, retry time.Duration
	ipv4, ipv6  bool // address families enabled on the session
}

// specFor derives the neighbour settings of p under c (defaults applied).
// A session carries its own address family, and the other one only when
// the Config gives a next hop of that family: an IPv4 session cannot use
// next-hop self for IPv6 prefixes (it would announce an IPv4-mapped
// address, which routers reject), nor an IPv6 session for IPv4 prefixes
// without the extended next hop capability (RFC 8950).
func specFor(c Config, p Peer) peerSpec {
	s := peerSpec{Peer: p, hold: c.HoldTime, retry: c.ConnectRetry}
	if s.Port == 0 {
		s.Port = DefaultPeerPort
	}
	if p.Address.Is4() {
		s.ipv4, s.ipv6 = true, c.NextHop6.IsValid()
	} else {
		s.ipv4, s.ipv6 = c.NextHop.IsValid(), true
	}
	return s
}

// carries reports whether the session family of s carries prefix p.
func (s peerSpec) carries(p netip.Prefix) bool {
	if p.Addr().Is4() {
		return s.ipv4
	}
	return s.ipv6
}

func (s peerSpec) apiPeer() *api.Peer {
	hold := uint64(s.hold / time.Second)
	p := &api.Peer{
		Conf: &api.PeerConf{
			NeighborAddress: s.Address.String(),
			PeerAsn:         s.ASN,
			AuthPassword:    s.Password,
		},
		Transport: &api.Transport{
			PassiveMode: s.Passive,
			RemotePort:  uint32(s.Port),
		},
		Timers: &api.Timers{Config: &api.TimersConfig{
			HoldTime:          hold,
			KeepaliveInterval: max(hold/3, 1),
			ConnectRetry:      uint64(s.retry / time.Second),
		}},
	}
	if s.TTLSecurity > 0 {
		p.TtlSecurity = &api.TtlSecurity{Enabled: true, TtlMin: 256 - uint32(s.TTLSecurity)}
	}
	for _, f := range []struct {
		on bool
		f  *api.Family
	}{{s.ipv4, familyIPv4}, {s.ipv6, familyIPv6}} {
		if f.on {
			p.AfiSafis = append(p.AfiSafis, &api.AfiSafi{Config: &api.AfiSafiConfig{Family: f.f, Enabled: true}})
		}
	}
	return p
}

// peerState converts GoBGP's view of a neighbour.
func peerState(p *api.Peer, now time.Time) PeerState {
	st := p.GetState()
	ps := PeerState{
		ASN:   st.GetPeerAsn(),
		State: SessionState(st.GetSessionState()),
		Flaps: st.GetFlops(),
	}
	ps.Address, _ = netip.ParseAddr(st.GetNeighborAddress())
	if ps.State == StateEstablished {
		ps.LocalAddress, _ = netip.ParseAddr(p.GetTransport().GetLocalAddress())
		ps.RouterID, _ = netip.ParseAddr(st.GetRouterId())
		if up := p.GetTimers().GetState().GetUptime(); up != nil {
			ps.Uptime = max(now.Sub(up.AsTime()), 0)
		}
	}
	for _, af := range p.GetAfiSafis() {
		s := af.GetState()
		if s == nil || !s.GetEnabled() {
			continue
		}
		switch s.GetFamily().GetAfi() {
		case api.Family_AFI_IP:
			ps.Families = append(ps.Families, "ipv4-unicast")
		case api.Family_AFI_IP6:
			ps.Families = append(ps.Families, "ipv6-unicast")
		}
		if ps.State == StateEstablished {
			ps.Advertised += s.GetAdvertised()
			ps.Received += s.GetReceived()
		}
	}
	return ps
}
