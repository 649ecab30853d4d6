package control

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// Limits and defaults of the document format.
const (
	// MaxWeight is the largest backend weight. Weights are relative: a
	// backend of weight 2 gets twice the new flows of one of weight 1.
	MaxWeight = 1<<16 - 1
	// MaxVNI is the largest VXLAN network identifier (24 bits).
	MaxVNI = 1<<24 - 1
	// MaxDocumentSize is the largest document Parse and Load accept.
	MaxDocumentSize = 16 << 20
	// MaxErrors is how many problems Parse reports before it stops
	// listing them (it still says how many more it found).
	MaxErrors = 50

	// DefaultListenPort is BGP's port, the default of bgp.listen_port and
	// of each peer's port.
	DefaultListenPort = 179
	// DefaultHoldTime is the default BGP hold time (RFC 4271's suggestion).
	DefaultHoldTime = 90 * time.Second
	// DefaultWithdrawGrace is how long a stopping Mux keeps forwarding
	// after withdrawing its routes, by default.
	DefaultWithdrawGrace = 2 * time.Second
	// DefaultVXLANPort is the IANA VXLAN port (RFC 7348), the default of
	// hosts[].vxlan_port.
	DefaultVXLANPort = 4789
	// DefaultWeight is a backend's weight when the document gives none.
	DefaultWeight = 1
)

// Document is one version of a fleet's desired state, as Parse returns it:
// validated, with every default filled in, so the values are the ones the
// node runs (Marshal writes them all out). See the package documentation
// for the file format.
//
// A Document is a value to read: code that receives one from Parse, Load or
// a Watcher must not modify it.
type Document struct {
	// Version orders documents: a node applies a version only if it is
	// above the one it runs. At least 1.
	Version uint64
	// Written is when the document was written, if it says (UTC); a node
	// reports AppliedAt − Written as its sync delay.
	Written time.Time
	// HashSeed is the fleet-wide flow hash seed (flow.NewHasher).
	HashSeed uint64
	// MaglevMinTableSize is the min of flow.MaglevAutoSize for VIPs
	// without a TableSize; 0 means flow.MaglevMinAutoSize. A larger one
	// trades memory for fewer size changes as pools grow and less
	// disruption when a backend leaves.
	MaglevMinTableSize uint32
	// Node names the node a per-node document is for (optional; a
	// document with Nodes has none).
	Node Node
	// Nodes are the per-node settings of a fleet document, in document
	// order: one document then serves every node, and each node reads its
	// own part with ForNode.
	Nodes []NodeConfig
	// InfraPrefixes are infrastructure source prefixes (health probers,
	// Muxes) whose traffic is never NATed.
	InfraPrefixes []netip.Prefix
	// MuxPrefixes are the prefixes the Muxes send VXLAN from (their
	// uplink addresses): a Host Agent accepts VXLAN only from them (unless
	// its -tunnel-sources overrides them) and refuses to run without any;
	// a Mux refuses VIP traffic from them (src_infra), as from
	// InfraPrefixes.
	MuxPrefixes []netip.Prefix
	// BGP is the Mux's BGP configuration; nil when the document has none.
	BGP *BGP
	// VIPs are the services, in document order, then the one-port VIPs
	// of the inbound NAT rules (VIP.InboundNAT says which).
	VIPs []VIP
	// InboundNAT are the inbound NAT rules (each port of a range to one
	// VM), as written; their VIPs are in VIPs.
	InboundNAT []InboundNAT
	// Outbound are the VIP addresses VMs may use as their source for
	// connections they open (source NAT), with their port pools.
	Outbound []Outbound
	// Hosts are the physical hosts and their VMs (for Host Agents).
	Hosts []Host
	// VIPAddresses are the addresses of every VIP of the fleet, in a
	// Host Agent's view of a fleet document (package fleet), whose VIPs
	// are only those its VMs serve: its client filters (src_vip) drop
	// packets from these as from its VIPs' (flow.NewSnapshotAddrs). A
	// fleet's document does not set it: a Mux, and fleet.Apply, refuse a
	// document that does (it is a Host Agent's view, not the fleet's VIPs).
	VIPAddresses []netip.Addr
}

// Node identifies the node a document is for.
type Node struct {
	// Name is the node's identity in logs; a Host Agent picks its entry of
	// Document.Hosts by this name (or by address).
	Name string
}

// NodeConfig is what one node of a fleet document sets for itself.
type NodeConfig struct {
	// Name is the node's name, as the node is started with (-node).
	Name string
	// BGP holds the BGP settings the node sets for itself (nil: none):
	// ASN (0: the fleet's), RouterID, ListenAddresses, NextHop and
	// NextHop6 replace the fleet's (Document.BGP) when set; Peers are
	// added to the fleet's. Use ForNode for the merged result.
	BGP *BGP
}

// ErrUnknownNode is returned by ForNode for a node the document's nodes
// section does not list.
var ErrUnknownNode = errors.New("control: node not in the document")

// ForNode returns the per-node document node name runs: with a nodes
// section, Node.Name is name, BGP is the fleet's merged with the node's
// own (see NodeConfig) and Nodes is nil, and a name the section does not
// list is an error (ErrUnknownNode) saying which names it lists. Without
// one (a per-node document, or ForNode's result), the document is
// returned as it is, with Node.Name set to name when name is not empty.
// The result shares everything else with d.
func (d *Document) ForNode(name string) (*Document, error) {
	if len(d.Nodes) == 0 {
		if name == "" || name == d.Node.Name {
			return d, nil
		}
		c := *d
		c.Node.Name = name
		return &c, nil
	}
	if name == "" {
		return nil, fmt.Errorf("%w: the document serves every node of its nodes section (%s): start the node with its name (-node)", ErrUnknownNode, d.nodeNames())
	}
	i := slices.IndexFunc(d.Nodes, func(n NodeConfig) bool { return n.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("%w: %q is not in the nodes section (it lists %s): add it, or start the node with one of those names", ErrUnknownNode, name, d.nodeNames())
	}
	c := *d
	c.Node.Name, c.Nodes = name, nil
	if d.BGP != nil {
		c.BGP = mergeBGP(d.BGP, d.Nodes[i].BGP)
		if !c.BGP.RouterID.IsValid() {
			return nil, fmt.Errorf("control: node %q has no bgp.router_id in the nodes section (a Mux needs one)", name)
		}
	}
	return &c, nil
}

func (d *Document) nodeNames() string {
	names := make([]string, 0, len(d.Nodes))
	for _, n := range d.Nodes {
		names = append(names, n.Name)
	}
	const show = 10
	if len(names) > show {
		return strings.Join(names[:show], ", ") + fmt.Sprintf(" and %d more", len(names)-show)
	}
	return strings.Join(names, ", ")
}

// BGP is a Mux's BGP speaker configuration.
type BGP struct {
	ASN      uint32     // local AS number, 1..4294967295 (not 23456, AS_TRANS)
	RouterID netip.Addr // IPv4 router identifier
	// ListenPort is the TCP port to accept sessions on; 0 means do not
	// listen (outbound sessions only). Default 179.
	ListenPort int32
	// ListenAddresses restricts the listener to these local addresses;
	// empty means every address (0.0.0.0 and ::). Needs a ListenPort.
	ListenAddresses []netip.Addr
	// HoldTime is the proposed hold time, whole seconds, 0 or at least 3s
	// (RFC 4271); keepalives go every HoldTime/3. Default 90s.
	HoldTime time.Duration
	// WithdrawGrace is how long a stopping Mux keeps forwarding after it
	// withdrew its routes, so that routers move flows first. Default 2s.
	WithdrawGrace time.Duration
	// NextHop is the next hop to announce; invalid (zero) means the local
	// address of each session (next-hop self).
	NextHop netip.Addr
	// NextHop6 is the next hop of IPv6 VIPs. Setting it also announces
	// IPv6 VIPs over IPv4 sessions (MP-BGP, RFC 4760); without it IPv6
	// VIPs go only to IPv6 peers, next-hop self.
	NextHop6 netip.Addr
	// Peers are the routers to peer with; addresses are unique.
	Peers []Peer
}

// Peer is one BGP neighbour.
type Peer struct {
	// Address is the peer's address. A link-local one may carry a zone
	// naming the interface the peer is on ("fe80::1%eth0"); such a peer
	// needs BGP.NextHop6 and has no Password.
	Address netip.Addr
	ASN     uint32
	Port    uint16 // default 179
	Passive bool   // wait for the peer to connect
	// Password is the session's TCP-MD5 password (RFC 2385), 1..80
	// bytes; empty means none.
	Password string
	// TTLSecurity turns on GTSM (RFC 5082) with the peer's distance in
	// hops, 1..MaxTTLSecurityHops (1: directly connected): packets go out
	// with TTL 255 and only those arriving with TTL >= 256-hops are
	// accepted. 0 means off.
	TTLSecurity uint8
}

// Limits of a peer's password and ttl_security.
const (
	MaxPasswordLen     = 80 // TCP_MD5SIG_MAXKEYLEN
	MaxTTLSecurityHops = 254
)

// VIP is one service: a virtual address, protocol and port served by a
// pool of backends in one tenant network.
type VIP struct {
	// Name is unique in the document: letters, digits, '.', '_', '-'.
	Name    string
	Address netip.Addr // IPv4 or IPv6, no zone, not IPv4-mapped
	// Protocol is the IP protocol number: flow.ProtoTCP or flow.ProtoUDP.
	Protocol uint8
	// Port is the VIP port; 0 serves every port.
	Port uint16
	// VNI is the tenant's VXLAN network identifier, 0..MaxVNI.
	VNI uint32
	// Distribution says which fields of a flow pick its backend.
	Distribution flow.TupleMode
	// TableSize is the Maglev table size (a prime); 0 means
	// flow.MaglevAutoSize(len(Backends), Document.MaglevMinTableSize):
	// sized by the pool.
	TableSize uint32
	// Probe is the backends' health check (defaults filled in); nil means
	// no probe: backends are taken as healthy.
	Probe *health.Spec
	// Backends is the pool, in document order.
	Backends []Backend
	// InboundNAT names the inbound NAT rule this VIP stands for (one
	// port to one VM; named "<rule>-<port>"); "" for the document's own
	// VIPs. Marshal writes the rule, not the VIP.
	InboundNAT string
}

// Backend is one DIP of a VIP's pool.
type Backend struct {
	// Name is unique within the VIP; default "address:port". It is the
	// backend's Maglev identity, so renaming a backend moves its flows.
	Name    string
	Address netip.Addr // the DIP; same family as the VIP (DSR NAT rewrites in place)
	// Port is the DIP port; 0 means the packet's destination port.
	Port uint16
	MAC  [6]byte    // the DIP's MAC: inner Ethernet destination
	Host netip.Addr // the DIP host's physical address: VXLAN outer destination (either family)
	// Weight is the relative share of new flows, 0..MaxWeight; 0 drains.
	// Default 1.
	Weight uint32
	// State is the operator's intent: flow.BackendActive or
	// flow.BackendDraining (health checks add flow.BackendDown).
	State flow.BackendState
}

// Host is a physical host running a Host Agent.
type Host struct {
	Name      string     // unique; default: the address
	Address   netip.Addr // physical address: where Muxes send VXLAN
	VXLANPort uint16     // default 4789
	VMs       []VM
}

// VM is one VM (DIP) port on a host.
type VM struct {
	VNI       uint32
	Address   netip.Addr
	MAC       [6]byte
	Interface string // the VM's port on the host (a Linux interface name)
}

// Rules converts the document's VIPs to data-path rules, in document order,
// for flow.Rules.Update(d.Version, rules).
//
// Each backend's State is the document's (active or draining) unless
// health reports it down: health(vip.Name, backend.Name) returns
// up=false, known=true. A backend whose health is not known (no verdict
// yet, or no probe) keeps the document's state; a nil health function
// means none is known. Down wins over draining: a down backend gets no
// flows at all.
func (d *Document) Rules(health func(vip, backend string) (up bool, known bool)) []flow.Rule {
	rules := make([]flow.Rule, len(d.VIPs))
	n := 0
	for i := range d.VIPs {
		n += len(d.VIPs[i].Backends)
	}
	backends := make([]flow.Backend, n) // one allocation for every pool
	for i := range d.VIPs {
		m := len(d.VIPs[i].Backends)
		d.VIPs[i].rule(&rules[i], backends[:m:m], d.MaglevMinTableSize, health)
		backends = backends[m:]
	}
	return rules
}

// Rule converts VIP i (an index into d.VIPs) to its data-path rule, as
// Rules does for all of them; for flow.Snapshot.ReplaceRules, when only
// some VIPs' health changed.
func (d *Document) Rule(i int, health func(vip, backend string) (up bool, known bool)) flow.Rule {
	var r flow.Rule
	d.VIPs[i].rule(&r, make([]flow.Backend, len(d.VIPs[i].Backends)), d.MaglevMinTableSize, health)
	return r
}

// rule fills r from v, with backends (len(v.Backends)) as its pool and a
// table sized with minSize when v has no TableSize.
func (v *VIP) rule(r *flow.Rule, backends []flow.Backend, minSize uint32, health func(vip, backend string) (up bool, known bool)) {
	size := v.TableSize
	if size == 0 && minSize != 0 {
		size = flow.MaglevAutoSize(len(v.Backends), minSize)
	}
	*r = flow.Rule{
		Name:      v.Name,
		VIP:       flow.VIP{Addr: v.Address, Proto: v.Protocol, Port: v.Port, VNI: v.VNI},
		Mode:      v.Distribution,
		TableSize: size,
		Backends:  backends,
	}
	for j := range v.Backends {
		b := &v.Backends[j]
		state := b.State
		if health != nil {
			if up, known := health(v.Name, b.Name); known && !up {
				state = flow.BackendDown
			}
		}
		r.Backends[j] = flow.Backend{
			Name:   b.Name,
			Addr:   b.Address,
			Port:   b.Port,
			MAC:    b.MAC,
			Host:   b.Host,
			Weight: b.Weight,
			State:  state,
		}
	}
}

// Prefixes returns the host prefixes (/32, /128) of the document's VIP
// addresses, sorted and without duplicates: what a Mux announces (the
// healthy ones) and steers to its data path.
func (d *Document) Prefixes() []netip.Prefix {
	ps := make([]netip.Prefix, 0, len(d.VIPs))
	for i := range d.VIPs {
		a := d.VIPs[i].Address
		ps = append(ps, netip.PrefixFrom(a, a.BitLen()))
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return slices.Compact(ps)
}

// Host returns the host whose name is nameOrAddr, else the one whose
// address is nameOrAddr (parsed as an IP address).
func (d *Document) Host(nameOrAddr string) (*Host, bool) {
	for i := range d.Hosts {
		if d.Hosts[i].Name == nameOrAddr {
			return &d.Hosts[i], true
		}
	}
	if a, err := netip.ParseAddr(nameOrAddr); err == nil {
		for i := range d.Hosts {
			if d.Hosts[i].Address == a {
				return &d.Hosts[i], true
			}
		}
	}
	return nil, false
}

// VIP returns the VIP with the given name.
func (d *Document) VIP(name string) (*VIP, bool) {
	for i := range d.VIPs {
		if d.VIPs[i].Name == name {
			return &d.VIPs[i], true
		}
	}
	return nil, false
}
