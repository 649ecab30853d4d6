package control

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Parse parses and validates a document (see the package documentation for
// the format). On any problem it returns a nil Document and an error
// joining one *FieldError per problem found (up to MaxErrors), each
// wrapping ErrInvalid and located as "line:col: path: message".
func Parse(data []byte) (*Document, error) { return parse("", data) }

// Load reads and parses the document in the file at path. Problems in the
// document are located as "path:line:col: field: message"; a file that
// cannot be read gives the os error (not ErrInvalid).
func Load(path string) (*Document, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return parse(path, data)
}

// readFile reads at most MaxDocumentSize+1 bytes of the file at path.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxDocumentSize+1))
	if err != nil {
		return nil, err
	}
	return data, nil
}

// yamlLine finds the line number in the YAML library's syntax errors.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func parse(name string, data []byte) (*Document, error) { return parseTree(name, data, nil) }

// parseTree parses data as parse does; with root non-nil, root is data's
// YAML tree, already built (Parser's parts put together), and data is not
// decoded again.
func parseTree(name string, data []byte, tree *yaml.Node) (doc *Document, err error) {
	if len(data) > MaxDocumentSize {
		return nil, &FieldError{File: name, Msg: fmt.Sprintf("document is larger than %d bytes", MaxDocumentSize)}
	}
	defer func() {
		// The YAML library is well fuzzed, but a reloading daemon must not
		// die on a bad file: turn any panic into an error.
		if r := recover(); r != nil {
			doc, err = nil, &FieldError{File: name, Msg: fmt.Sprintf("invalid YAML: %v", r)}
		}
	}()
	sumLine, err := verifyChecksum(name, data)
	if err != nil {
		return nil, err
	}
	if tree != nil {
		d := &decoder{file: name, budget: 10*len(data) + 10000, sumLine: sumLine}
		doc = d.document(tree)
		if err := d.err(); err != nil {
			return nil, err
		}
		return doc, nil
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &FieldError{File: name, Line: 1, Column: 1, Msg: "empty document (want at least \"version: 1\")"}
		}
		return nil, yamlError(name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, yamlError(name, err)
		}
		return nil, &FieldError{File: name, Line: extra.Line, Column: extra.Column,
			Msg: "a second YAML document (after ---): put one document in a file"}
	}
	d := &decoder{file: name, budget: 10*len(data) + 10000, sumLine: sumLine}
	doc = d.document(&root)
	if err := d.err(); err != nil {
		return nil, err
	}
	return doc, nil
}

func yamlError(name string, err error) error {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &FieldError{File: name, Line: line, Msg: "invalid YAML: " + m[2]}
	}
	return &FieldError{File: name, Msg: "invalid YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}

// decoder walks a YAML node tree into a Document, collecting problems.
type decoder struct {
	file   string
	errs   []*FieldError
	more   int // problems beyond MaxErrors
	budget int // node visits left (alias expansion guard)
	over   bool
	// sumLine is the line of the checksum verifyChecksum checked, 0 for
	// none: the only place a checksum key may be.
	sumLine int
}

func (d *decoder) errorf(n *yaml.Node, path, format string, args ...any) {
	if len(d.errs) >= MaxErrors {
		d.more++
		return
	}
	e := &FieldError{File: d.file, Path: path, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	d.errs = append(d.errs, e)
}

func (d *decoder) err() error {
	if len(d.errs) == 0 {
		return nil
	}
	slices.SortStableFunc(d.errs, func(a, b *FieldError) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	errs := make([]error, 0, len(d.errs)+1)
	for _, e := range d.errs {
		errs = append(errs, e)
	}
	if d.more > 0 {
		errs = append(errs, &FieldError{File: d.file, Msg: fmt.Sprintf("and %d more problems", d.more)})
	}
	return errors.Join(errs...)
}

// deref follows aliases and charges one visit to the budget; nil when the
// budget is spent (a document that expands without bound).
func (d *decoder) deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i > 64 {
			return nil
		}
		n = n.Alias
	}
	if d.budget--; d.budget < 0 {
		if !d.over {
			// Fatal, so reported even past MaxErrors.
			d.over = true
			e := &FieldError{File: d.file, Msg: "document too large after expanding aliases (*name); parsing stopped"}
			if n != nil {
				e.Line, e.Column = n.Line, n.Column
			}
			d.errs = append(d.errs, e)
		}
		return nil
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// describe names a node's type and value for "got ..." in messages.
func describe(n *yaml.Node) string {
	switch {
	case n == nil || isNull(n):
		return "nothing (null)"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind != yaml.ScalarNode:
		return "a document"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:37] + "..."
	}
	switch n.ShortTag() {
	case "!!str":
		return "string " + strconv.Quote(v)
	case "!!int":
		return "integer " + v
	case "!!float":
		return "number " + v
	case "!!bool":
		return "boolean " + v
	case "!!timestamp":
		return "time " + v
	}
	return n.ShortTag() + " " + strconv.Quote(v)
}

// object is a decoded mapping: its known keys' value nodes. Entries are
// a slice searched in order, not maps: a mapping has a few keys, and a
// fleet's document has tens of thousands of mappings (three maps each
// were a fifth of a parse).
type object struct {
	n    *yaml.Node
	path string
	ents []entry // the first of each key, in order
	// suggested holds the keys an unknown key was taken for a typo of:
	// their absence is not reported again.
	suggested []string
}

type entry struct {
	key  string
	k, v *yaml.Node
}

// val returns the value node of key (aliases not followed), nil when
// absent.
func (o *object) val(key string) *yaml.Node {
	for i := range o.ents {
		if o.ents[i].key == key {
			return o.ents[i].v
		}
	}
	return nil
}

// key returns the key node of key, nil when absent.
func (o *object) key(key string) *yaml.Node {
	for i := range o.ents {
		if o.ents[i].key == key {
			return o.ents[i].k
		}
	}
	return nil
}

// get returns the value node of key with aliases followed, or nil when the
// key is absent or null.
func (d *decoder) get(o *object, key string) *yaml.Node {
	v := o.val(key)
	if v == nil {
		return nil
	}
	v = d.deref(v)
	if isNull(v) {
		return nil
	}
	return v
}

// missing reports a required key that is absent.
func (d *decoder) missing(o *object, key, want string) {
	if slices.Contains(o.suggested, key) {
		return
	}
	d.errorf(o.n, join(o.path, key), "missing (want %s)", want)
}

// object decodes a mapping with the given known keys; unknown and repeated
// keys are problems. It returns nil for null (no error) and for a
// non-mapping (error). Merge keys (<<: *anchor) are followed; explicit
// keys win over merged ones.
func (d *decoder) object(n *yaml.Node, path string, known []string) *object {
	n = d.deref(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping of %s, got %s", keyList(known), describe(n))
		return nil
	}
	o := &object{n: n, path: path, ents: make([]entry, 0, len(n.Content)/2)}
	d.fill(o, n, known, true, 0)
	return o
}

func (d *decoder) fill(o *object, n *yaml.Node, known []string, explicit bool, depth int) {
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.deref(n.Content[i]), n.Content[i+1]
		if k == nil {
			return
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		if k.Kind != yaml.ScalarNode {
			d.errorf(k, o.path, "a key must be a plain string, got %s", describe(k))
			continue
		}
		key := k.Value
		if !slices.Contains(known, key) {
			if s := suggest(key, known); s != "" {
				d.errorf(k, o.path, "unknown key %q (did you mean %q?)", key, s)
				o.suggested = append(o.suggested, s)
			} else {
				d.errorf(k, o.path, "unknown key %q (want %s)", key, keyList(known))
			}
			continue
		}
		if first := o.key(key); first != nil {
			if explicit {
				d.errorf(k, join(o.path, key), "repeated key (first at line %d)", first.Line)
			}
			continue
		}
		o.ents = append(o.ents, entry{key, k, v})
	}
	for _, m := range merges {
		m = d.deref(m)
		if depth > 8 || m == nil {
			return
		}
		switch m.Kind {
		case yaml.MappingNode:
			d.fill(o, m, known, false, depth+1)
		case yaml.SequenceNode:
			for _, s := range m.Content {
				if s = d.deref(s); s != nil && s.Kind == yaml.MappingNode {
					d.fill(o, s, known, false, depth+1)
				} else {
					d.errorf(s, o.path, "<< merges a mapping or a list of mappings, got %s", describe(s))
				}
			}
		default:
			d.errorf(m, o.path, "<< merges a mapping or a list of mappings, got %s", describe(m))
		}
	}
}

func keyList(known []string) string {
	return strings.Join(known, ", ")
}

// list returns the items of a sequence; nil for null, and a problem for
// anything else.
func (d *decoder) list(n *yaml.Node, path, what string) []*yaml.Node {
	n = d.deref(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, path, "want a list of %s (lines starting with \"- \"), got %s", what, describe(n))
		return nil
	}
	return n.Content
}

// scalar checks that n is a scalar of the given tag.
func (d *decoder) scalar(n *yaml.Node, path, tag, want string) bool {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == tag {
		return true
	}
	hint := ""
	if n.Kind == yaml.ScalarNode && n.ShortTag() != "!!str" && tag == "!!str" {
		hint = fmt.Sprintf(" (quote it: %q)", n.Value)
	}
	d.errorf(n, path, "want %s, got %s%s", want, describe(n), hint)
	return false
}

func (d *decoder) str(n *yaml.Node, path, want string) (string, bool) {
	if !d.scalar(n, path, "!!str", want) {
		return "", false
	}
	return n.Value, true
}

// parseUint parses a YAML 1.2 integer: decimal without leading zeros
// (YAML 1.1 read those as octal, so they are refused as ambiguous), or
// 0x, 0o, 0b prefixed; '_' separators allowed.
func parseUint(s string) (uint64, error) {
	s = strings.ReplaceAll(s, "_", "")
	base := 10
	switch {
	case strings.HasPrefix(s, "0x"), strings.HasPrefix(s, "0X"):
		base, s = 16, s[2:]
	case strings.HasPrefix(s, "0o"):
		base, s = 8, s[2:]
	case strings.HasPrefix(s, "0b"):
		base, s = 2, s[2:]
	case leadingZero(s):
		return 0, strconv.ErrSyntax
	case strings.HasPrefix(s, "+"):
		s = s[1:]
	}
	if s == "" || s[0] == '+' || s[0] == '-' {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseUint(s, base, 64)
}

// leadingZero reports whether s is a decimal number with a leading zero,
// e.g. "080" (YAML 1.1 octal, or a float to a YAML 1.2 reader).
func leadingZero(s string) bool {
	s = strings.TrimLeft(s, "+-")
	if len(s) < 2 || s[0] != '0' {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '_' })
}

// uint decodes an integer in lo..hi; want describes the allowed values.
func (d *decoder) uint(n *yaml.Node, path string, lo, hi uint64, want string) (uint64, bool) {
	if t := n.ShortTag(); n.Kind == yaml.ScalarNode && (t == "!!int" || t == "!!float") && leadingZero(n.Value) {
		d.errorf(n, path, "%s has a leading zero, which YAML 1.1 reads as octal (write it without the zero, or 0o... for octal)", n.Value)
		return 0, false
	}
	if n.Kind != yaml.ScalarNode {
		d.errorf(n, path, "want an integer (%s), got %s", want, describe(n))
		return 0, false
	}
	if tag := n.ShortTag(); tag != "!!int" {
		switch _, err := parseUint(n.Value); {
		case tag == "!!str" && err == nil:
			d.errorf(n, path, "%q is quoted, which makes it a string (remove the quotes; want %s)", n.Value, want)
		case tag == "!!str":
			d.errorf(n, path, "%q is not an integer (want %s)", n.Value, want)
		default:
			d.errorf(n, path, "%s is not an integer (want %s)", n.Value, want)
		}
		return 0, false
	}
	v, err := parseUint(n.Value)
	if err != nil || v < lo || v > hi {
		d.errorf(n, path, "%s is out of range (want %s)", n.Value, want)
		return 0, false
	}
	return v, true
}

func (d *decoder) bool(n *yaml.Node, path string) (bool, bool) {
	if !d.scalar(n, path, "!!bool", "true or false") {
		return false, false
	}
	v, err := strconv.ParseBool(strings.ToLower(n.Value))
	if err != nil {
		d.errorf(n, path, "want true or false, got %s", describe(n))
		return false, false
	}
	return v, true
}

// duration decodes a Go duration ("500ms", "2s", "1m30s") in lo..hi.
func (d *decoder) duration(n *yaml.Node, path string, lo, hi time.Duration) (time.Duration, bool) {
	const want = `a duration with a unit, e.g. "2s" or "500ms"`
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") {
		d.errorf(n, path, "want %s, got %s (add a unit: %ss?)", want, describe(n), n.Value)
		return 0, false
	}
	if !d.scalar(n, path, "!!str", want) {
		return 0, false
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		d.errorf(n, path, "%q is not a duration (want %s)", n.Value, want)
		return 0, false
	}
	if v < lo || v > hi {
		d.errorf(n, path, "%s is out of range (want %v..%v)", n.Value, lo, hi)
		return 0, false
	}
	return v, true
}

// addr decodes a unicast IP address; zoned says whether a zone is allowed
// (link-local addresses only, the zone naming an interface: validZone),
// and then a link-local address must have one: a peer's, which the BGP
// speaker can neither dial nor match an incoming session to without it.
// family is 4 or 6 to require one, else 0.
func (d *decoder) addr(n *yaml.Node, path, want string, family int, zoned bool) (netip.Addr, bool) {
	if !d.scalar(n, path, "!!str", want) {
		return netip.Addr{}, false
	}
	s := n.Value
	a, err := netip.ParseAddr(s)
	if err != nil {
		if _, perr := netip.ParsePrefix(s); perr == nil {
			d.errorf(n, path, "%q is a prefix (want %s, without /length)", s, want)
		} else {
			d.errorf(n, path, "%q is not an IP address (want %s)", s, want)
		}
		return netip.Addr{}, false
	}
	switch {
	case a.Is4In6():
		d.errorf(n, path, "%q is an IPv4-mapped IPv6 address (write it as %v)", s, a.Unmap().WithZone(""))
	case a.Zone() != "" && !(zoned && (a.IsLinkLocalUnicast())):
		d.errorf(n, path, "%q has a zone; only a link-local peer address may have one (want %s)", s, want)
	case a.Zone() != "" && !validZone(a.Zone()):
		d.errorf(n, path, "%q: the zone %q is not an interface name (want the interface the peer is on, e.g. fe80::1%%eth0: %s)", s, a.Zone(), wantZone)
	case zoned && a.Zone() == "" && a.IsLinkLocalUnicast():
		d.errorf(n, path, "%q is link-local: give the interface the peer is on as its zone, e.g. %s%%eth0 (without one no session can be dialled or accepted)", s, s)
	case a.IsUnspecified():
		d.errorf(n, path, "%q is the unspecified address (want %s)", s, want)
	case a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		d.errorf(n, path, "%q is not a unicast address (want %s)", s, want)
	case family == 4 && !a.Is4():
		d.errorf(n, path, "%q is not an IPv4 address (want %s)", s, want)
	default:
		return a, true
	}
	return netip.Addr{}, false
}

// wantZone describes the zones validZone accepts.
const wantZone = "a Linux interface name, 1-15 characters, no '/', ':' or spaces, not all digits"

// validZone reports whether zone can name the interface of a link-local
// peer, as the bgp package accepts it: a Linux interface name
// (validIfName) that is not all digits, since the BGP speaker looks the
// interface up by name, never by index.
func validZone(zone string) bool {
	return validIfName(zone) && strings.ContainsFunc(zone, func(r rune) bool { return r < '0' || r > '9' })
}

// mac decodes a unicast MAC address written as six hex pairs separated by
// ':' (or '-').
func (d *decoder) mac(n *yaml.Node, path string) ([6]byte, bool) {
	const want = "want six hex pairs, e.g. 02:00:00:00:01:01"
	if !d.scalar(n, path, "!!str", `a MAC address in quotes, e.g. "02:00:00:00:01:01"`) {
		return [6]byte{}, false
	}
	m, ok := parseMAC(n.Value)
	switch {
	case !ok:
		d.errorf(n, path, "%q is not a MAC address (%s)", n.Value, want)
	case m[0]&1 != 0:
		d.errorf(n, path, "%q is a multicast MAC (the low bit of the first octet is set); a VM needs a unicast MAC", n.Value)
	case m == [6]byte{}:
		d.errorf(n, path, "%q is the zero MAC; a VM needs a unicast MAC", n.Value)
	default:
		return m, true
	}
	return [6]byte{}, false
}

func parseMAC(s string) (m [6]byte, ok bool) {
	if len(s) != 17 {
		return m, false
	}
	sep := s[2]
	if sep != ':' && sep != '-' {
		return m, false
	}
	for i := range 6 {
		if i > 0 && s[3*i-1] != sep {
			return m, false
		}
		v, err := strconv.ParseUint(s[3*i:3*i+2], 16, 8)
		if err != nil {
			return m, false
		}
		m[i] = byte(v)
	}
	return m, true
}

func formatMAC(m [6]byte) string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5])
}

// name decodes a name: 1..max printable ASCII characters without spaces;
// strict names are letters, digits, '.', '_', '-' starting with a letter
// or digit.
func (d *decoder) name(n *yaml.Node, path string, max int, strict bool) (string, bool) {
	s, ok := d.str(n, path, "a name")
	if !ok {
		return "", false
	}
	if validName(s, max, strict) {
		return s, true
	}
	if strict {
		d.errorf(n, path, "%q is not a valid name (want 1-%d letters, digits, '.', '_' or '-', starting with a letter or digit)", s, max)
	} else {
		d.errorf(n, path, "%q is not a valid name (want 1-%d printable characters, no spaces)", s, max)
	}
	return "", false
}

func validName(s string, max int, strict bool) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		switch {
		case strict && i == 0 && !alnum:
			return false
		case strict && !alnum && c != '.' && c != '_' && c != '-':
			return false
		case c <= ' ' || c >= 0x7f:
			return false
		}
	}
	return true
}

// isPrime reports whether n (below 2^32) is prime.
func isPrime(n uint64) bool {
	if n < 2 {
		return false
	}
	for p := uint64(2); p*p <= n; p++ {
		if n%p == 0 {
			return false
		}
	}
	return true
}

// primesAround returns the largest prime below n (0 if none) and the
// smallest above it.
func primesAround(n uint64) (lo, hi uint64) {
	if n > 2 {
		for lo = n - 1; lo >= 2 && !isPrime(lo); lo-- {
		}
	}
	for hi = n + 1; !isPrime(hi); hi++ {
	}
	return lo, hi
}
