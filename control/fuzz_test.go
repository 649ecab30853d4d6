package control

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// FuzzParse: Parse never panics; it either returns a document or problems
// that are all located *FieldErrors; a document it returns survives
// Marshal and Parse unchanged, and Seal: sealed it is the same document,
// and its prefixes are refused.
func FuzzParse(f *testing.F) {
	example, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		string(example),
		string(Seal(example)),
		base,
		"checksum: sha256:" + strings.Repeat("0", 64) + "\nversion: 1\n",
		base + secondVIP,
		"",
		"version: 1\n",
		"version: 0x10\nhash_seed: 0xffffffffffffffff\n",
		"version: 1\nnode: {name: n}\ninfra_prefixes: [198.18.0.0/15, '2001:db8::/32']\n",
		"version: 1\nbgp: {asn: 65000, router_id: 198.18.0.1, hold_time: 0s, next_hop6: '2001:db8::10', peers: [{address: 'fe80::1%eth0', asn: 1, passive: true}]}\n",
		"version: 1\nvips:\n  - {name: a, address: 198.18.100.1, protocol: udp, port: all, vni: 5, distribution: 2-tuple, table_size: 251, probe: {type: tcp, port: 9}}\n",
		"version: 1\nvips:\n  - &v {name: a, address: '2001:db8::1', protocol: tcp, port: 443, probe: {type: http, path: /h, method: HEAD, host: x, expect_status: 204, interval: 3s, timeout: 1s, rise: 1, fall: 1}}\n  - {<<: *v, name: b, port: 8443}\n",
		"version: 1\nhosts:\n  - address: 198.19.0.1\n    vms: [{vni: 1, address: 198.19.1.1, mac: '02-00-00-00-00-01', interface: tap0}]\n",
		"version: 1\nvips: [\n",
		"version: 1\n---\nversion: 2\n",
		"version: 1\nnode: &a {name: *a}\n",
		"version: 1\nnode:\n  <<: [{name: a}, {name: b}]\n",
		"version: 080\n",
		"? [a]\n: b\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse(data)
		if err != nil {
			if d != nil {
				t.Fatal("document and error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Msg == "" {
				t.Fatalf("error is not a *FieldError: %v", err)
			}
			return
		}
		out, err := d.Marshal()
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		d2, err := Parse(out)
		if err != nil {
			t.Fatalf("marshalled document does not parse: %v\ninput:\n%s\nmarshalled:\n%s", err, data, out)
		}
		out2, err := d2.Marshal()
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		if string(out) != string(out2) {
			t.Fatalf("marshal is not a fixed point:\n%s\n---\n%s", out, out2)
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("Validate refuses a parsed document: %v", err)
		}
		sealed := Seal(out)
		ds, err := Parse(sealed)
		if err != nil {
			t.Fatalf("sealed document does not parse: %v\n%s", err, sealed)
		}
		if outS, _ := ds.Marshal(); string(outS) != string(out) {
			t.Fatalf("sealing changed the document:\n%s\n---\n%s", out, outS)
		}
		for _, n := range []int{0, len(sealed) / 2, len(sealed) - 1} {
			if _, err := Parse(sealed[:n]); err == nil {
				t.Fatalf("a prefix of %d bytes of a sealed document parses:\n%s", n, sealed[:n])
			}
		}
		if d3, err := Parse(Seal(data)); err == nil {
			if out3, _ := d3.Marshal(); string(out3) != string(out) {
				t.Fatalf("sealing changed the input document:\n%s\n---\n%s", out, out3)
			}
		}
	})
}
