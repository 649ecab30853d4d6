package control

import (
	"bytes"
	"errors"
	"io"
	"sync"

	"go.yaml.in/yaml/v3"
)

// DefaultPartsMin is the smallest document a Parser parses in parts (see
// Parser); smaller ones it parses whole, as Parse does.
const DefaultPartsMin = 4 << 10

// A Parser parses documents as Parse does, and keeps the YAML trees of
// the parts of the last text it parsed, so that the next text, when it
// repeats most of them, is parsed only where it differs. A fleet's large
// document changes a backend here and a VIP there between versions: a
// Mux re-reading a 1.5 MB document (10,000 backends) decodes the YAML of
// the one VIP that changed, not of all of them (the YAML library is ~60%
// of a parse); the checks of the whole document run on every text, as
// in Parse.
//
// The parts are the top-level keys and, of a key whose value is a block
// sequence (vips, hosts, ...), each item; each part is decoded alone, and
// its tree is kept by its text. A text the parts cannot be put together
// for exactly — one with anchors or aliases, tabs, CRs, directives or
// document markers, a part that is not YAML alone, the same part twice,
// or any problem found in it — is parsed whole, so the result, a
// Document or an error, is always Parse's (FuzzParserParts checks it).
// Texts under PartsMin bytes are parsed whole.
//
// The kept trees cost memory (some 20 bytes per byte of text). A Parser is
// safe for concurrent use; its parses run one at a time.
type Parser struct {
	// PartsMin is the size from which texts are parsed in parts (0:
	// DefaultPartsMin; negative: every text).
	PartsMin int

	mu    sync.Mutex
	parts map[string]*part // by text: the last text's parts
	stats ParserStats
}

// ParserStats counts what a Parser did.
type ParserStats struct {
	Whole  uint64 // texts parsed whole (small, or their parts did not fit)
	Parts  uint64 // texts put together from parts
	Reused uint64 // parts whose tree was kept from the text before
	Parsed uint64 // parts decoded
}

// part is one part's tree, decoded alone, with its lines moved to where
// the part was last used.
type part struct {
	root  *yaml.Node // a DocumentNode
	shift int        // lines added to the tree's (0: as decoded)
	used  bool       // in the text being put together
}

// NewParser returns a Parser with no parts kept.
func NewParser() *Parser { return &Parser{} }

// Stats returns the Parser's counts.
func (p *Parser) Stats() ParserStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Parse parses data as Parse does; name locates problems as Load's path
// does ("" for none).
func (p *Parser) Parse(name string, data []byte) (*Document, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	min := p.PartsMin
	if min == 0 {
		min = DefaultPartsMin
	}
	if len(data) >= min && len(data) <= MaxDocumentSize {
		if tree, parts, ok := p.assemble(data); ok {
			p.parts = parts
			if doc, err := parseTree(name, data, tree); err == nil {
				p.stats.Parts++
				return doc, nil
			}
			// A problem: parse whole, for the positions and messages
			// Parse gives.
		}
	}
	p.stats.Whole++
	return parse(name, data)
}

// assemble splits data into parts, decodes those it does not keep, and
// puts their trees together into data's tree (a DocumentNode). ok is
// false when data cannot be parsed in parts (see Parser).
func (p *Parser) assemble(data []byte) (tree *yaml.Node, parts map[string]*part, ok bool) {
	if bytes.ContainsAny(data, "\t\r&*") || bytes.HasPrefix(data, []byte("\xef\xbb\xbf")) {
		return nil, nil, false
	}
	spans, ok := splitParts(data)
	if !ok {
		return nil, nil, false
	}
	built := make(map[string]*part, len(spans))
	defer func() {
		for _, pt := range built {
			pt.used = false
		}
	}()
	top := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	seq := -1 // index in top.Content of the value the items go to
	for _, sp := range spans {
		text := string(data[sp.start:sp.end])
		pt := p.parts[text]
		if pt == nil {
			pt = built[text]
		}
		switch {
		case pt != nil && pt.used:
			return nil, nil, false // the same text twice: one tree cannot be at two places
		case pt != nil:
			p.stats.Reused++
		default:
			root, err := decodePart(text)
			if err != nil {
				return nil, nil, false
			}
			pt = &part{root: root}
			p.stats.Parsed++
		}
		pt.used = true
		built[text] = pt
		if d := sp.line - pt.shift; d != 0 {
			shiftLines(pt.root, d)
			pt.shift = sp.line
		}
		n := pt.root.Content[0]
		if !sp.item {
			if n.Kind != yaml.MappingNode || n.Style != 0 || len(n.Content) == 0 {
				return nil, nil, false
			}
			if len(top.Content) == 0 {
				top.Line, top.Column = n.Line, n.Column
			}
			top.Content = append(top.Content, n.Content...)
			seq = -1
			if sp.seqNext {
				seq = len(top.Content) - 1
				if v := top.Content[seq]; v.Kind != yaml.ScalarNode || v.Tag != "!!null" || v.Value != "" {
					return nil, nil, false
				}
			}
			continue
		}
		if seq < 0 || n.Kind != yaml.SequenceNode || n.Style != 0 || len(n.Content) == 0 {
			return nil, nil, false
		}
		v := top.Content[seq]
		if v.Kind != yaml.SequenceNode {
			// The first item: the key's empty value becomes the sequence.
			v = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Line: n.Line, Column: n.Column}
			top.Content[seq] = v
		}
		v.Content = append(v.Content, n.Content...)
	}
	if len(top.Content) == 0 {
		return nil, nil, false
	}
	return &yaml.Node{Kind: yaml.DocumentNode, Line: 1, Column: 1, Content: []*yaml.Node{top}}, built, true
}

// decodePart decodes one part's text: one YAML document.
func decodePart(text string) (root *yaml.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			root, err = nil, errPart
		}
	}()
	var n yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader([]byte(text)))
	if err := dec.Decode(&n); err != nil {
		return nil, err
	}
	if n.Kind != yaml.DocumentNode || len(n.Content) != 1 {
		return nil, errPart
	}
	// Nothing after it: a line indented less than the part's context
	// (an item's, a key's) ends the part's tree where, in the whole
	// text, it would be an error.
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errPart
	}
	return &n, nil
}

var errPart = &FieldError{Msg: "not a part"}

// shiftLines adds d to the line of every node of the tree at n.
func shiftLines(n *yaml.Node, d int) {
	n.Line += d
	for _, c := range n.Content {
		shiftLines(c, d)
	}
}

// span is one part of a text: lines [line, ...) at bytes [start, end).
type span struct {
	start, end int
	line       int  // 0-based line of start
	item       bool // an item of the block sequence of the key before
	seqNext    bool // a key part whose last key's items follow as parts
}

// splitParts finds the parts of data: a part starts at a line that starts
// a top-level key (a plain key at column 0) or an item ("- " at the
// indentation of the first item) of the block sequence that is the value
// of a top-level key written alone on its line ("vips:"); comments and
// blank lines go with the part before them (the first part starts at the
// text's start). ok is false when data has a line starting a directive or
// a document marker, or no part.
func splitParts(data []byte) (spans []span, ok bool) {
	cur := span{}
	started := false // cur holds a key or an item
	itemIndent := -1 // the item indentation of the current key's sequence; -1 none
	wantItems := false
	line := 0
	for off := 0; off < len(data); line++ {
		end := bytes.IndexByte(data[off:], '\n')
		next := len(data)
		if end >= 0 {
			next = off + end + 1
		}
		l := data[off:next]
		l = bytes.TrimSuffix(l, []byte("\n"))
		if bytes.HasPrefix(l, []byte("---")) || bytes.HasPrefix(l, []byte("...")) || bytes.HasPrefix(l, []byte("%")) {
			return nil, false
		}
		indent := len(l) - len(bytes.TrimLeft(l, " "))
		rest := l[indent:]
		blank := len(rest) == 0 || rest[0] == '#'
		switch {
		case blank:
		case indent == 0 && topKey(l):
			if started {
				cur.end = off
				spans = append(spans, cur)
				cur = span{start: off, line: line}
			}
			started = true
			empty := emptyValue(l)
			cur.seqNext = empty
			wantItems, itemIndent = empty, -1
		case wantItems && itemIndent < 0 && isItem(rest):
			itemIndent = indent
			fallthrough
		case wantItems && indent == itemIndent && isItem(rest):
			cur.end = off
			spans = append(spans, cur)
			cur = span{start: off, line: line, item: true}
		case indent == 0:
			// Not a plain top-level key nor an item (a quoted key, a
			// flow mapping, a sequence at the top): no parts.
			return nil, false
		default:
			if wantItems && itemIndent < 0 {
				// The key's value is not a block sequence.
				wantItems, cur.seqNext = false, false
			}
		}
		off = next
	}
	if !started {
		return nil, false
	}
	cur.end = len(data)
	spans = append(spans, cur)
	return spans, true
}

// topKey reports whether l (at column 0) starts with a plain key and its
// colon: letters, digits, '_' and '-', starting with a letter or '_'.
func topKey(l []byte) bool {
	if len(l) == 0 || !(l[0] == '_' || l[0] >= 'a' && l[0] <= 'z' || l[0] >= 'A' && l[0] <= 'Z') {
		return false
	}
	for i := 1; i < len(l); i++ {
		c := l[i]
		switch {
		case c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9':
		case c == ':':
			return i+1 == len(l) || l[i+1] == ' '
		default:
			return false
		}
	}
	return false
}

// emptyValue reports whether the top-level key line l has nothing after
// its colon but spaces and a comment.
func emptyValue(l []byte) bool {
	i := bytes.IndexByte(l, ':')
	rest := bytes.TrimLeft(l[i+1:], " ")
	return len(rest) == 0 || rest[0] == '#'
}

// isItem reports whether rest (a line after its indentation) starts a
// block sequence item.
func isItem(rest []byte) bool {
	return len(rest) > 0 && rest[0] == '-' && (len(rest) == 1 || rest[1] == ' ')
}
