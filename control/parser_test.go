package control

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// partsDoc is a fleet-like document of vips VIPs with per backends each
// and a hosts section; weight w on backend (0, 0); items indented by
// indent spaces under their keys.
func partsDoc(version, vips, per, w int, indent string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# a comment before everything\nversion: %d\nhash_seed: 0x1234\nmux_prefixes: [198.18.0.0/24]\n\nvips: # the VIPs\n", version)
	for v := range vips {
		fmt.Fprintf(&b, "%s- name: v%d\n%s  address: 198.18.1.%d\n%s  protocol: tcp\n%s  port: 80\n%s  vni: %d\n%s  backends:\n",
			indent, v, indent, v+1, indent, indent, indent, 100+v, indent)
		for j := range per {
			weight := ""
			if v == 0 && j == 0 && w != 1 {
				weight = fmt.Sprintf(", weight: %d", w)
			}
			n := v*per + j
			fmt.Fprintf(&b, "%s    - {address: 198.19.16.%d, mac: 02:00:00:00:00:%02x, host: 198.19.0.%d%s}\n", indent, n+1, n, n%4+1, weight)
		}
		b.WriteString("\n# between VIPs\n")
	}
	b.WriteString("hosts:\n")
	for h := range 4 {
		fmt.Fprintf(&b, "%s- name: h%d\n%s  address: 198.19.0.%d\n%s  vms:\n", indent, h, indent, h+1, indent)
		for n := h; n < vips*per; n += 4 {
			v := n / per
			fmt.Fprintf(&b, "%s    - {vni: %d, address: 198.19.16.%d, mac: 02:00:00:00:00:%02x, interface: tap%d}\n", indent, 100+v, n+1, n, n)
		}
	}
	return []byte(b.String())
}

// sameResult fails unless the Parser's result for data is Parse's: the
// same Document, or the same error.
func sameResult(t *testing.T, p *Parser, data []byte) {
	t.Helper()
	want, wantErr := Parse(data)
	got, gotErr := p.Parse("", data)
	if wantErr != nil || gotErr != nil {
		require.Error(t, gotErr, "the Parser accepted what Parse refuses: %v", wantErr)
		require.Error(t, wantErr, "the Parser refused what Parse accepts: %v", gotErr)
		require.Equal(t, wantErr.Error(), gotErr.Error())
		return
	}
	require.True(t, reflect.DeepEqual(want, got), "the Parser's document differs from Parse's")
}

// sameTree fails unless the tree the Parser puts together for data is
// the YAML library's for the whole text: kinds, tags, values, lines and
// columns (comments and styles aside, which the decoder does not read).
func sameTree(t *testing.T, data []byte) {
	t.Helper()
	var whole yaml.Node
	require.NoError(t, yaml.Unmarshal(data, &whole))
	p := &Parser{PartsMin: -1}
	tree, _, ok := p.assemble(data)
	require.True(t, ok, "not parsed in parts")
	var walk func(path string, a, b *yaml.Node)
	walk = func(path string, a, b *yaml.Node) {
		require.Equal(t, []any{a.Kind, a.Tag, a.Value, a.Line, a.Column, len(a.Content)},
			[]any{b.Kind, b.Tag, b.Value, b.Line, b.Column, len(b.Content)}, "at %s", path)
		for i := range a.Content {
			walk(fmt.Sprintf("%s/%d", path, i), a.Content[i], b.Content[i])
		}
	}
	walk("", whole.Content[0], tree.Content[0])
}

func TestParserParts(t *testing.T) {
	example, err := os.ReadFile("testdata/example.yaml")
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		data  []byte
		parts bool // parsed in parts
	}{
		{"items at column 0", partsDoc(1, 5, 4, 1, ""), true},
		{"items indented", partsDoc(1, 5, 4, 1, "  "), true},
		{"example", example, true},
		{"sealed", Seal(partsDoc(1, 3, 2, 1, "")), true},
		{"marshalled", func() []byte {
			d, err := Parse(partsDoc(1, 3, 2, 1, "  "))
			require.NoError(t, err)
			b, err := d.Marshal()
			require.NoError(t, err)
			return b
		}(), true},
		{"anchors", []byte("version: 1\nvips:\n  - &v {name: a, address: 198.18.0.1, protocol: tcp, port: 80}\n  - {<<: *v, name: b, port: 81}\n"), false},
		{"flow top level", []byte("{version: 1}\n"), false},
		{"document marker", []byte("---\nversion: 1\n"), false},
		{"quoted key", []byte("version: 1\n\"hash_seed\": 5\n"), false},
		{"invalid", []byte("version: 1\nvips:\n  - name: a\n    port: 99999\n"), true},
		{"invalid YAML in a part", []byte("version: 1\nvips: [\nhosts: []\n"), false},
		{"the same item twice", []byte("version: 1\nmux_prefixes:\n  - 198.18.0.0/24\n  - 198.18.0.0/24\n"), false},
		{"a key twice", []byte("version: 1\nversion: 2\n"), true},
		{"top-level sequence", []byte("- version: 1\n"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Parser{PartsMin: -1}
			sameResult(t, p, tc.data)
			st := p.Stats()
			if tc.parts {
				assert.NotZero(t, st.Parsed, "parts decoded")
				if _, err := Parse(tc.data); err == nil {
					assert.Equal(t, uint64(1), st.Parts, "put together from parts")
					sameTree(t, tc.data)
				}
			} else {
				assert.Zero(t, st.Parts, "put together from parts")
			}
		})
	}
}

// TestParserReuses parses a sequence of versions of a document with one
// Parser: each result is Parse's, and a version that changes one VIP
// decodes only its parts (the VIP, the version line) and reuses the rest,
// also when lines moved (a VIP inserted before them).
func TestParserReuses(t *testing.T) {
	for _, indent := range []string{"", "  "} {
		t.Run(fmt.Sprintf("indent=%d", len(indent)), func(t *testing.T) {
			p := &Parser{PartsMin: -1}
			v1 := partsDoc(1, 20, 5, 1, indent)
			sameResult(t, p, v1)
			first := p.Stats()
			require.Equal(t, uint64(1), first.Parts)

			// A backend's weight: the version and the first VIP change.
			v2 := partsDoc(2, 20, 5, 3, indent)
			sameResult(t, p, v2)
			st := p.Stats()
			assert.Equal(t, uint64(2), st.Parsed-first.Parsed, "parts decoded for a one-VIP change")
			assert.Equal(t, first.Parsed-2, st.Reused-first.Reused, "parts reused")
			sameTree(t, v2)

			// Lines move: a VIP's backend added (five more lines below it)
			// and one comment line fewer at the top.
			v3 := bytes.Replace(partsDoc(3, 20, 5, 3, indent), []byte("# a comment before everything\n"), nil, 1)
			v3 = bytes.Replace(v3, []byte("198.19.16.1, mac"), []byte("198.19.16.1, mac: 02:00:00:00:00:00, host: 198.19.0.1, weight: 3}\n"+indent+"    - {address: 198.19.17.1, mac"), 1)
			v3 = bytes.Replace(v3, []byte("02:00:00:00:00:00, host: 198.19.0.1, weight: 3}\n"+indent+"    - {address: 198.19.17.1, mac: 02:00:00:00:00:00, host: 198.19.0.1, weight: 3}"),
				[]byte("02:00:00:00:00:00, host: 198.19.0.1, weight: 3}\n"+indent+"    - {address: 198.19.17.1, mac: 02:00:00:00:99:00, host: 198.19.0.1}"), 1)
			sameResult(t, p, v3)
			sameTree(t, v3)
			// Back to v1: its parts were dropped with v2, but for those v3 kept.
			sameResult(t, p, v1)
			sameTree(t, v1)
		})
	}
}

// TestParserErrorsAsParse: a document with problems gets Parse's errors,
// positions included, whether its parts were kept from a valid version or
// not.
func TestParserErrorsAsParse(t *testing.T) {
	p := &Parser{PartsMin: -1}
	good := partsDoc(1, 5, 4, 1, "  ")
	sameResult(t, p, good)
	for _, bad := range [][]byte{
		bytes.Replace(good, []byte("port: 80"), []byte("port: 99999"), 1),
		bytes.Replace(good, []byte("vni: 104"), []byte("vni: 100"), 1),
		bytes.Replace(good, []byte("version: 1"), []byte("version: 1\nversion: 2"), 1),
		append(append([]byte(nil), good...), "hosts: []\n"...),
		bytes.Replace(good, []byte("interface: tap3}"), []byte("interface: tap3"), 1),
	} {
		sameResult(t, p, bad)
		sameResult(t, p, good)
	}
}

func TestParserSmallWhole(t *testing.T) {
	p := NewParser()
	sameResult(t, p, partsDoc(1, 2, 2, 1, ""))
	assert.Equal(t, ParserStats{Whole: 1}, p.Stats())
}

// FuzzParserParts: a Parser's result is Parse's for every text, also for
// a text parsed after another (whose parts it keeps).
func FuzzParserParts(f *testing.F) {
	example, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	small := string(partsDoc(1, 2, 2, 1, ""))
	f.Add(string(example), small)
	f.Add(small, string(partsDoc(2, 2, 2, 5, "")))
	f.Add(string(partsDoc(1, 2, 2, 1, "  ")), string(partsDoc(2, 3, 2, 1, "  ")))
	f.Add(base, base+secondVIP)
	f.Add("version: 1\nvips:\n- name: a\n  address: 198.18.0.1\n  protocol: tcp\n  port: 80\nhosts:\n", "version: 2\nvips:\n- name: a\n  address: 198.18.0.1\n  protocol: tcp\n  port: 80\n  - x\n")
	f.Add("version: 1\nvips:\n    - a\n  - b\n", "version: 1\nvips:\n  - a\n\n    - b\n")
	f.Add("version: 1\nnode:\n  name: a\nvips:\n", "version: 1\nnode:\n- a\n")
	f.Fuzz(func(t *testing.T, a, b string) {
		p := &Parser{PartsMin: -1}
		for _, data := range []string{a, b} {
			want, wantErr := Parse([]byte(data))
			got, gotErr := p.Parse("", []byte(data))
			if (wantErr == nil) != (gotErr == nil) {
				t.Fatalf("Parse: %v; Parser: %v", wantErr, gotErr)
			}
			if wantErr != nil {
				if wantErr.Error() != gotErr.Error() {
					t.Fatalf("Parse: %v; Parser: %v", wantErr, gotErr)
				}
				continue
			}
			if !reflect.DeepEqual(want, got) {
				t.Fatalf("documents differ:\n%+v\n%+v", want, got)
			}
		}
	})
}

// TestMarshalVIPs: a document written by MarshalVIPs, with some VIPs'
// texts given (MarshalVIP's, without their backends) and the others
// encoded, parses to the document Marshal's text parses to; in parts
// too.
func TestMarshalVIPs(t *testing.T) {
	example, err := os.ReadFile("testdata/example.yaml")
	require.NoError(t, err)
	for name, text := range map[string][]byte{"example": example, "fleet": partsDoc(1, 5, 4, 2, "  "), "base": []byte(base + secondVIP)} {
		t.Run(name, func(t *testing.T) {
			d, err := Parse(text)
			require.NoError(t, err)
			for _, every := range []int{1, 2, 1 << 30} { // all VIPs given, every other, none
				out, err := d.MarshalVIPs(func(i int) []byte {
					if i%every != 0 {
						return nil
					}
					v := d.VIPs[i]
					v.Backends = nil // MarshalVIPs writes them
					b, err := MarshalVIP(&v)
					require.NoError(t, err)
					return b
				})
				require.NoError(t, err)
				got, err := Parse(out)
				require.NoError(t, err, "%s", out)
				assert.True(t, reflect.DeepEqual(d, got), "MarshalVIPs (every %d) parses to another document:\n%s", every, out)
				p := &Parser{PartsMin: -1}
				sameResult(t, p, out)
				assert.Equal(t, uint64(1), p.Stats().Parts, "parsed in parts")
			}
		})
	}
}
