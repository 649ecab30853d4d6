package control

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/xdplb/xdplb/flow"
)

// Marshal writes d in the document format with every value explicit
// (defaults included), so that Parse(Marshal(d)) gives back d for any
// document Parse returned. It writes what d holds even when that is
// invalid (Validate relies on it); it fails only if encoding fails.
func (d *Document) Marshal() ([]byte, error) {
	head, vips, tail := d.marshalNodes(true)
	root := head
	if len(vips.Content) > 0 {
		add(root, "vips", vips)
	}
	root.Content = append(root.Content, tail.Content...)
	return encode(root)
}

// MarshalVIPs is Marshal for a writer of many documents that share VIPs
// (package fleet writes a thousand hosts' views, each listing every VIP,
// each with only that host's backends): for each VIP i, the text vip(i)
// returns, when not nil, is written in place of VIP i's but for its
// backends, which follow it; the text must be what MarshalVIP wrote for
// a VIP equal to d.VIPs[i] but for its backends (none). The text
// differs from Marshal's (the VIPs' items are not indented under vips),
// the document it parses to does not.
func (d *Document) MarshalVIPs(vip func(i int) []byte) ([]byte, error) {
	head, _, tail := d.marshalNodes(false)
	var buf bytes.Buffer
	if err := encodeTo(&buf, head); err != nil {
		return nil, err
	}
	// Each VIP's text without backends (given, else encoded), and the
	// backends of them all encoded at once (an encoder per VIP was most
	// of a view's cost): one item per VIP, "- backends:" and its list,
	// which become "  backends:" after the VIP's text.
	texts := make([][]byte, len(d.VIPs))
	backends := sequence()
	for i := range d.VIPs {
		v := &d.VIPs[i]
		if v.InboundNAT != "" {
			continue
		}
		if texts[i] = vip(i); texts[i] == nil {
			bare := *v
			bare.Backends = nil
			var err error
			if texts[i], err = MarshalVIP(&bare); err != nil {
				return nil, err
			}
		}
		if len(v.Backends) > 0 {
			backends.Content = append(backends.Content, mappingOf("backends", marshalBackends(v.Backends)))
		}
	}
	var items [][]byte
	if len(backends.Content) > 0 {
		b, err := encode(backends)
		if err != nil {
			return nil, err
		}
		for line := range bytes.Lines(b) {
			if bytes.HasPrefix(line, []byte("- ")) {
				items = append(items, nil)
				line = append([]byte("  "), line[2:]...)
			}
			items[len(items)-1] = append(items[len(items)-1], line...)
		}
		if len(items) != len(backends.Content) {
			return nil, fmt.Errorf("control: marshal: %d lists of backends encoded as %d", len(backends.Content), len(items))
		}
	}
	listed := false
	for i := range d.VIPs {
		v := &d.VIPs[i]
		if v.InboundNAT != "" {
			continue // under inbound_nat
		}
		if !listed {
			buf.WriteString("vips:\n")
			listed = true
		}
		buf.Write(texts[i])
		if len(v.Backends) > 0 {
			buf.Write(items[0]) // the item's last key, indented as its keys are
			items = items[1:]
		}
	}
	if len(tail.Content) > 0 {
		if err := encodeTo(&buf, tail); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// MarshalVIPAddresses writes the key vip_addresses with addrs (see
// Document.VIPAddresses) as Marshal writes it: Marshal's text of a
// document with VIPAddresses is that of the document without them
// followed by this text (Marshal writes the key last), so a writer of
// many views (package fleet) stores it once for them all.
func MarshalVIPAddresses(addrs []netip.Addr) ([]byte, error) {
	n := mapping()
	add(n, "vip_addresses", vipAddressesNode(addrs))
	return encode(n)
}

func vipAddressesNode(addrs []netip.Addr) *yaml.Node {
	s := sequence()
	for _, a := range addrs {
		s.Content = append(s.Content, strNode(a.String()))
	}
	return s
}

// MarshalVIP writes v as MarshalVIPs writes an item of vips.
func MarshalVIP(v *VIP) ([]byte, error) {
	return encode(&yaml.Node{Kind: yaml.SequenceNode, Content: []*yaml.Node{marshalVIP(v)}})
}

// marshalNodes returns d's top-level keys before vips (head), the vips
// sequence (empty unless withVIPs), and the keys after it (tail), in
// Marshal's order.
func (d *Document) marshalNodes(withVIPs bool) (head, vips, tail *yaml.Node) {
	root := mapping()
	add(root, "version", uintNode(d.Version))
	if !d.Written.IsZero() {
		add(root, "written", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!timestamp", Value: d.Written.Format(time.RFC3339Nano)})
	}
	add(root, "hash_seed", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: "0x" + strconv.FormatUint(d.HashSeed, 16)})
	if d.MaglevMinTableSize != 0 {
		add(root, "maglev_min_table_size", uintNode(uint64(d.MaglevMinTableSize)))
	}
	if d.Node.Name != "" {
		n := mapping()
		add(n, "name", strNode(d.Node.Name))
		add(root, "node", n)
	}
	if len(d.InfraPrefixes) > 0 {
		s := sequence()
		for _, p := range d.InfraPrefixes {
			s.Content = append(s.Content, strNode(p.String()))
		}
		add(root, "infra_prefixes", s)
	}
	if len(d.MuxPrefixes) > 0 {
		s := sequence()
		for _, p := range d.MuxPrefixes {
			s.Content = append(s.Content, strNode(p.String()))
		}
		add(root, "mux_prefixes", s)
	}
	if b := d.BGP; b != nil {
		n := mapping()
		if b.ASN != 0 { // 0: each node of a fleet document sets its own
			add(n, "asn", uintNode(uint64(b.ASN)))
		}
		addAddr(n, "router_id", b.RouterID)
		add(n, "listen_port", intNode(int64(b.ListenPort)))
		if len(b.ListenAddresses) > 0 {
			s := sequence()
			for _, a := range b.ListenAddresses {
				s.Content = append(s.Content, strNode(a.String()))
			}
			add(n, "listen_addresses", s)
		}
		add(n, "hold_time", strNode(b.HoldTime.String()))
		add(n, "withdraw_grace", strNode(b.WithdrawGrace.String()))
		addAddr(n, "next_hop", b.NextHop)
		addAddr(n, "next_hop6", b.NextHop6)
		addPeers(n, b.Peers)
		add(root, "bgp", n)
	}
	if len(d.Nodes) > 0 {
		ns := mapping()
		for _, nc := range d.Nodes {
			cn := mapping()
			if b := nc.BGP; b != nil {
				bn := mapping()
				if b.ASN != 0 {
					add(bn, "asn", uintNode(uint64(b.ASN)))
				}
				addAddr(bn, "router_id", b.RouterID)
				addAddrs(bn, "listen_addresses", b.ListenAddresses)
				addAddr(bn, "next_hop", b.NextHop)
				addAddr(bn, "next_hop6", b.NextHop6)
				addPeers(bn, b.Peers)
				add(cn, "bgp", bn)
			}
			add(ns, nc.Name, cn)
		}
		add(root, "nodes", ns)
	}
	head, vips, tail = root, sequence(), mapping()
	for i := range d.VIPs {
		if withVIPs && d.VIPs[i].InboundNAT == "" {
			vips.Content = append(vips.Content, marshalVIP(&d.VIPs[i]))
		}
	}
	root = tail
	if len(d.InboundNAT) > 0 {
		s := sequence()
		for i := range d.InboundNAT {
			s.Content = append(s.Content, marshalInboundNAT(&d.InboundNAT[i]))
		}
		add(root, "inbound_nat", s)
	}
	if len(d.Outbound) > 0 {
		s := sequence()
		for i := range d.Outbound {
			s.Content = append(s.Content, marshalOutbound(&d.Outbound[i]))
		}
		add(root, "outbound", s)
	}
	if len(d.Hosts) > 0 {
		s := sequence()
		for i := range d.Hosts {
			h := &d.Hosts[i]
			hn := mapping()
			add(hn, "name", strNode(h.Name))
			addAddr(hn, "address", h.Address)
			add(hn, "vxlan_port", uintNode(uint64(h.VXLANPort)))
			if len(h.VMs) > 0 {
				vs := sequence()
				for _, vm := range h.VMs {
					vn := mapping()
					add(vn, "vni", uintNode(uint64(vm.VNI)))
					addAddr(vn, "address", vm.Address)
					add(vn, "mac", macNode(vm.MAC))
					add(vn, "interface", strNode(vm.Interface))
					vs.Content = append(vs.Content, vn)
				}
				add(hn, "vms", vs)
			}
			s.Content = append(s.Content, hn)
		}
		add(root, "hosts", s)
	}
	if len(d.VIPAddresses) > 0 {
		add(root, "vip_addresses", vipAddressesNode(d.VIPAddresses))
	}
	return head, vips, tail
}

// encode writes n as a YAML document, indented by 2.
func encode(n *yaml.Node) ([]byte, error) {
	var buf bytes.Buffer
	if err := encodeTo(&buf, n); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func encodeTo(buf *bytes.Buffer, n *yaml.Node) error {
	enc := yaml.NewEncoder(buf)
	enc.SetIndent(2)
	if err := enc.Encode(n); err != nil {
		return fmt.Errorf("control: marshal: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("control: marshal: %w", err)
	}
	return nil
}

func marshalVIP(v *VIP) *yaml.Node {
	n := mapping()
	add(n, "name", strNode(v.Name))
	addAddr(n, "address", v.Address)
	switch v.Protocol {
	case flow.ProtoTCP:
		add(n, "protocol", strNode("tcp"))
	case flow.ProtoUDP:
		add(n, "protocol", strNode("udp"))
	default:
		add(n, "protocol", uintNode(uint64(v.Protocol))) // invalid: Parse says so
	}
	if v.Port == 0 {
		add(n, "port", strNode("all"))
	} else {
		add(n, "port", uintNode(uint64(v.Port)))
	}
	add(n, "vni", uintNode(uint64(v.VNI)))
	add(n, "distribution", strNode(v.Distribution.String()))
	if v.TableSize != 0 {
		add(n, "table_size", uintNode(uint64(v.TableSize)))
	}
	if p := v.Probe; p != nil {
		pn := mapping()
		add(pn, "type", strNode(p.Type.String()))
		if p.Port != 0 {
			add(pn, "port", uintNode(uint64(p.Port)))
		}
		if p.Path != "" {
			add(pn, "path", strNode(p.Path))
		}
		if p.Method != "" {
			add(pn, "method", strNode(p.Method))
		}
		if p.Host != "" {
			add(pn, "host", strNode(p.Host))
		}
		if p.ExpectStatus != 0 {
			add(pn, "expect_status", intNode(int64(p.ExpectStatus)))
		}
		add(pn, "interval", strNode(p.Interval.String()))
		add(pn, "timeout", strNode(p.Timeout.String()))
		add(pn, "rise", intNode(int64(p.Rise)))
		add(pn, "fall", intNode(int64(p.Fall)))
		add(n, "probe", pn)
	}
	if len(v.Backends) > 0 {
		add(n, "backends", marshalBackends(v.Backends)) // last: MarshalVIPs appends it so
	}
	return n
}

func marshalBackends(bs []Backend) *yaml.Node {
	s := sequence()
	for j := range bs {
		b := &bs[j]
		bn := mapping()
		add(bn, "name", strNode(b.Name))
		addAddr(bn, "address", b.Address)
		if b.Port != 0 {
			add(bn, "port", uintNode(uint64(b.Port)))
		}
		add(bn, "mac", macNode(b.MAC))
		addAddr(bn, "host", b.Host)
		add(bn, "weight", uintNode(uint64(b.Weight)))
		if b.State != flow.BackendActive {
			add(bn, "state", strNode(b.State.String()))
		}
		s.Content = append(s.Content, bn)
	}
	return s
}

func mapping() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode} }

func mappingOf(key string, v *yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{strNode(key), v}}
}
func sequence() *yaml.Node { return &yaml.Node{Kind: yaml.SequenceNode} }

func add(m *yaml.Node, key string, v *yaml.Node) {
	m.Content = append(m.Content, strNode(key), v)
}

// addAddr adds an address unless it is invalid (then Parse reports the key
// missing, which is what an unset address is).
func addAddrs(m *yaml.Node, key string, as []netip.Addr) {
	if len(as) == 0 {
		return
	}
	s := sequence()
	for _, a := range as {
		s.Content = append(s.Content, strNode(a.String()))
	}
	add(m, key, s)
}

func addPeers(m *yaml.Node, peers []Peer) {
	if len(peers) == 0 {
		return
	}
	s := sequence()
	for _, p := range peers {
		pn := mapping()
		addAddr(pn, "address", p.Address)
		add(pn, "asn", uintNode(uint64(p.ASN)))
		add(pn, "port", uintNode(uint64(p.Port)))
		add(pn, "passive", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(p.Passive)})
		if p.Password != "" {
			add(pn, "password", strNode(p.Password))
		}
		add(pn, "ttl_security", uintNode(uint64(p.TTLSecurity)))
		s.Content = append(s.Content, pn)
	}
	add(m, "peers", s)
}

func addAddr(m *yaml.Node, key string, a netip.Addr) {
	if a.IsValid() {
		add(m, key, strNode(a.String()))
	}
}

func strNode(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
}

func uintNode(u uint64) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatUint(u, 10)}
}

func intNode(i int64) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(i, 10)}
}

// macNode writes a MAC in double quotes: YAML 1.1 readers take unquoted
// colon-separated digits for a base-60 number.
func macNode(m [6]byte) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: formatMAC(m), Style: yaml.DoubleQuotedStyle}
}

// Validate checks a Document built in code (not by Parse) by the rules
// Parse applies: it marshals d and parses the result. The problems name
// field paths but no lines. Defaults are not filled in: a Document must
// hold resolved values (e.g. a backend's Weight 0 drains it; a Host's
// VXLANPort 0 is an error).
func (d *Document) Validate() error {
	data, err := d.Marshal()
	if err != nil {
		return err
	}
	_, err = parse("", data)
	if err == nil {
		return nil
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	for _, e := range errs {
		var fe *FieldError
		if errors.As(e, &fe) {
			fe.Line, fe.Column = 0, 0
		}
	}
	return err
}

// ReadVIPAddresses reads text as MarshalVIPAddresses writes it — the key
// vip_addresses alone, then one plain address a line — and returns what
// Parse decodes vip_addresses of that text to, without the YAML library
// (package fleet: a thousand Host Agents read the addresses on every VIP
// added). ok is false for a text in any other form (quoted, flow style,
// comments, another key), or one Parse refuses (an invalid address, one
// listed twice): parse the document the text belongs to, which says
// where and why.
func ReadVIPAddresses(text []byte) (addrs []netip.Addr, ok bool) {
	rest, ok := bytes.CutPrefix(text, []byte("vip_addresses:\n"))
	if !ok || len(rest) == 0 || rest[len(rest)-1] != '\n' {
		return nil, false
	}
	seen := make(map[netip.Addr]bool, bytes.Count(rest, []byte{'\n'}))
	for line := range bytes.Lines(rest) {
		s, ok := bytes.CutPrefix(line[:len(line)-1], []byte("  - "))
		if !ok || len(s) == 0 || s[len(s)-1] == ':' { // "x:" ends a YAML key
			return nil, false
		}
		for _, c := range s {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' || c == '.' || c == ':') {
				return nil, false
			}
		}
		a, err := netip.ParseAddr(string(s))
		if err != nil || !vipAddress(a) || seen[a] {
			return nil, false
		}
		seen[a] = true
		addrs = append(addrs, a)
	}
	return addrs, true
}

// vipAddress reports whether Parse takes a as a VIP's address (as the
// decoder's addr does without a family or a zone).
func vipAddress(a netip.Addr) bool {
	return a.IsValid() && !a.Is4In6() && a.Zone() == "" && !a.IsUnspecified() &&
		!a.IsMulticast() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}
