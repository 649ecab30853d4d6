package steer

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
)

// DefaultVXLANPort is the IANA VXLAN port, used when a VXLANRule has Port 0.
const DefaultVXLANPort = 4789

// IP protocol numbers that rules name.
const (
	ProtoTCP uint8 = 6
	ProtoUDP uint8 = 17
)

// Sentinel errors. Returned errors wrap them; test with errors.Is.
var (
	// ErrInvalidRule: a rule or prefix that cannot be expressed (invalid or
	// unspecified address, a port without TCP or UDP, ...).
	ErrInvalidRule = errors.New("steer: invalid rule")
	// ErrMapFull: more rules or infrastructure prefixes than Options allow.
	ErrMapFull = errors.New("steer: map full")
)

// DstRule steers packets by destination: the Mux uplink's VIPs.
//
// Proto 0 and Port 0 match any protocol; Proto set and Port 0 match any port
// of that protocol; Port set (TCP or UDP only) matches exactly. The most
// specific entry is looked up first, but any hit steers, so overlapping
// entries for one address simply widen the match.
type DstRule struct {
	Addr  netip.Addr
	Proto uint8
	Port  uint16
}

// VXLANRule steers UDP to a local address and port: the Host Agent uplink's
// VXLAN traffic. Port 0 means DefaultVXLANPort.
type VXLANRule struct {
	Local netip.Addr
	Port  uint16
}

// SrcRule steers packets by source: a VM port's DSR return traffic from a
// DIP. Port 0 matches any source port (and packets without ports); a
// non-zero Port matches TCP and UDP from that source port. Source matches
// are vetoed when the destination is in an infrastructure prefix.
type SrcRule struct {
	Addr netip.Addr
	Port uint16
}

// Config is the complete set of map entries: the plain, checkable spec that
// Program.Sync makes live. The zero Config steers nothing.
type Config struct {
	Dst   []DstRule
	VXLAN []VXLANRule
	Src   []SrcRule
	// Infra lists "never steer" destination prefixes for source rules
	// (health probers, the host's own services).
	Infra []netip.Prefix
}

func (r DstRule) String() string {
	switch {
	case r.Proto == 0 && r.Port == 0:
		return "dst " + r.Addr.String()
	case r.Port == 0:
		return "dst " + r.Addr.String() + " " + protoName(r.Proto)
	default:
		return "dst " + netip.AddrPortFrom(r.Addr, r.Port).String() + " " + protoName(r.Proto)
	}
}

func (r VXLANRule) String() string {
	return "vxlan " + netip.AddrPortFrom(r.Local, r.Port).String()
}

func (r SrcRule) String() string {
	if r.Port == 0 {
		return "src " + r.Addr.String()
	}
	return "src " + netip.AddrPortFrom(r.Addr, r.Port).String()
}

func protoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	}
	return "proto " + strconv.Itoa(int(p))
}

// Validate reports the first rule or prefix that cannot be installed,
// wrapping ErrInvalidRule. It does not check map capacity (see Options).
func (c Config) Validate() error {
	_, _, err := c.compile()
	return err
}

// Normalize returns the config with addresses unmapped (::ffff:a.b.c.d is
// IPv4), zones dropped, VXLAN port defaults applied, prefixes masked,
// duplicates removed and every list sorted; it is what Program.Config
// reports after Sync(c). It assumes c is valid.
func (c Config) Normalize() Config {
	rules, infra, _ := c.compile()
	return configOf(rules, infra)
}

// Rule keys and classes, shared with bpf/steer.c.
const (
	kindDst4   = 1
	kindDst6   = 2
	kindVXLAN4 = 3
	kindVXLAN6 = 4
	kindSrc4   = 5
	kindSrc6   = 6

	classDstPort   = 1 << 0
	classDstProto  = 1 << 1
	classDstAddr   = 1 << 2
	classVXLAN     = 1 << 3
	classSrcPort   = 1 << 4
	classSrcAddr   = 1 << 5
	classInfra     = 1 << 6
	numClasses     = 7
	classAll       = 1 << 7 // not a rule class: SetSteerAll
	flagDropNoSock = 1 << 8 // not a rule class: SetDropNoSocket

	lpmFamilyBits = 8 // the family byte in front of the address
)

type ruleKey = steerRuleKey
type lpmKey = steerLpmKey

func normAddr(a netip.Addr) (netip.Addr, bool) {
	a = a.Unmap().WithZone("")
	return a, a.IsValid() && !a.IsUnspecified()
}

// netPort returns p with its bytes in network order in memory, the way the
// BPF program reads ports from the packet.
func netPort(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func makeKey(kind4 uint8, a netip.Addr, proto uint8, port uint16) ruleKey {
	k := ruleKey{Kind: kind4, Proto: proto, Port: netPort(port)}
	if a.Is4() {
		b := a.As4()
		copy(k.Addr[:], b[:])
	} else {
		k.Kind++
		k.Addr = a.As16()
	}
	return k
}

func (r DstRule) key() (ruleKey, error) {
	a, ok := normAddr(r.Addr)
	switch {
	case !ok:
		return ruleKey{}, fmt.Errorf("%w: %v: bad address", ErrInvalidRule, r)
	case r.Port != 0 && r.Proto != ProtoTCP && r.Proto != ProtoUDP:
		return ruleKey{}, fmt.Errorf("%w: %v: a port needs tcp or udp", ErrInvalidRule, r)
	}
	return makeKey(kindDst4, a, r.Proto, r.Port), nil
}

func (r VXLANRule) key() (ruleKey, error) {
	a, ok := normAddr(r.Local)
	if !ok {
		return ruleKey{}, fmt.Errorf("%w: %v: bad address", ErrInvalidRule, r)
	}
	port := r.Port
	if port == 0 {
		port = DefaultVXLANPort
	}
	return makeKey(kindVXLAN4, a, ProtoUDP, port), nil
}

func (r SrcRule) key() (ruleKey, error) {
	a, ok := normAddr(r.Addr)
	if !ok {
		return ruleKey{}, fmt.Errorf("%w: %v: bad address", ErrInvalidRule, r)
	}
	return makeKey(kindSrc4, a, 0, r.Port), nil
}

func infraKey(p netip.Prefix) (lpmKey, error) {
	if !p.IsValid() {
		return lpmKey{}, fmt.Errorf("%w: infra prefix %v", ErrInvalidRule, p)
	}
	a, bits := p.Addr().WithZone(""), p.Bits()
	if a.Is4In6() && bits >= 96 {
		a, bits = a.Unmap(), bits-96
	}
	a = netip.PrefixFrom(a, bits).Masked().Addr()
	k := lpmKey{Prefixlen: uint32(lpmFamilyBits + bits)}
	if a.Is4() {
		k.Family = 4
		b := a.As4()
		copy(k.Addr[:], b[:])
	} else {
		k.Family = 6
		k.Addr = a.As16()
	}
	return k, nil
}

func (k ruleKey) addr() netip.Addr {
	if k.Kind%2 == 1 {
		return netip.AddrFrom4([4]byte(k.Addr[:4]))
	}
	return netip.AddrFrom16(k.Addr)
}

func (k ruleKey) port() uint16 { return netPort(k.Port) }

func (k ruleKey) class() int {
	switch k.Kind {
	case kindDst4, kindDst6:
		switch {
		case k.Port != 0:
			return classDstPort
		case k.Proto != 0:
			return classDstProto
		}
		return classDstAddr
	case kindVXLAN4, kindVXLAN6:
		return classVXLAN
	}
	if k.Port != 0 {
		return classSrcPort
	}
	return classSrcAddr
}

func (k lpmKey) prefix() netip.Prefix {
	bits := int(k.Prefixlen) - lpmFamilyBits
	if k.Family == 4 {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte(k.Addr[:4])), bits)
	}
	return netip.PrefixFrom(netip.AddrFrom16(k.Addr), bits)
}

// compile validates c and turns it into the sets of map keys.
func (c Config) compile() (map[ruleKey]struct{}, map[lpmKey]struct{}, error) {
	rules := make(map[ruleKey]struct{}, len(c.Dst)+len(c.VXLAN)+len(c.Src))
	infra := make(map[lpmKey]struct{}, len(c.Infra))
	var errs []error
	add := func(k ruleKey, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		rules[k] = struct{}{}
	}
	for _, r := range c.Dst {
		add(r.key())
	}
	for _, r := range c.VXLAN {
		add(r.key())
	}
	for _, r := range c.Src {
		add(r.key())
	}
	for _, p := range c.Infra {
		k, err := infraKey(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		infra[k] = struct{}{}
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	return rules, infra, nil
}

// configOf turns key sets back into a sorted Config.
func configOf(rules map[ruleKey]struct{}, infra map[lpmKey]struct{}) Config {
	var c Config
	for k := range rules {
		a := k.addr()
		switch k.Kind {
		case kindDst4, kindDst6:
			c.Dst = append(c.Dst, DstRule{Addr: a, Proto: k.Proto, Port: k.port()})
		case kindVXLAN4, kindVXLAN6:
			c.VXLAN = append(c.VXLAN, VXLANRule{Local: a, Port: k.port()})
		default:
			c.Src = append(c.Src, SrcRule{Addr: a, Port: k.port()})
		}
	}
	for k := range infra {
		c.Infra = append(c.Infra, k.prefix())
	}
	slices.SortFunc(c.Dst, func(a, b DstRule) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port))
	})
	slices.SortFunc(c.VXLAN, func(a, b VXLANRule) int {
		return cmp.Or(a.Local.Compare(b.Local), cmp.Compare(a.Port, b.Port))
	})
	slices.SortFunc(c.Src, func(a, b SrcRule) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	slices.SortFunc(c.Infra, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	return c
}

// classCounts counts entries per class; the BPF program skips lookups of
// classes with no entry.
type classCounts [numClasses]int

func bitIndex(class int) int {
	i := 0
	for class > 1 {
		class >>= 1
		i++
	}
	return i
}

func (cc *classCounts) add(class, n int) { cc[bitIndex(class)] += n }

func (cc *classCounts) mask() uint32 {
	var m uint32
	for i, n := range cc {
		if n > 0 {
			m |= 1 << i
		}
	}
	return m
}

func countsOf(rules map[ruleKey]struct{}, infra map[lpmKey]struct{}) classCounts {
	var cc classCounts
	for k := range rules {
		cc.add(k.class(), 1)
	}
	cc.add(classInfra, len(infra))
	return cc
}
