package control_test

import (
	"errors"
	"fmt"

	"github.com/xdplb/xdplb/control"
)

// Parse a document and turn it into data-path rules, with a health
// function that reports one backend down.
func ExampleParse() {
	doc := []byte(`
version: 3
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    probe: {type: http, path: /healthz}
    backends:
      - name: vm-a
        address: 198.19.1.1
        port: 8080
        mac: "02:00:00:00:01:01"
        host: 198.19.0.1
      - name: vm-b
        address: 198.19.1.2
        port: 8080
        mac: "02:00:00:00:01:02"
        host: 198.19.0.2
        weight: 2
      - name: vm-c
        address: 198.19.1.3
        port: 8080
        mac: "02:00:00:00:01:03"
        host: 198.19.0.2
        state: draining
`)
	d, err := control.Parse(doc)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("version", d.Version, "announce", d.Prefixes())
	p := d.VIPs[0].Probe
	fmt.Println("probe", p.Type, p.Method, p.Path, "every", p.Interval, "timeout", p.Timeout)

	down := func(vip, backend string) (up, known bool) {
		return backend != "vm-b", true
	}
	for _, r := range d.Rules(down) {
		fmt.Println(r.Name, r.VIP, r.Mode)
		for _, b := range r.Backends {
			fmt.Printf("  %s %v:%d via %v weight %d %v\n", b.Name, b.Addr, b.Port, b.Host, b.Weight, b.State)
		}
	}
	// Output:
	// version 3 announce [198.18.100.1/32]
	// probe http GET /healthz every 2s timeout 1s
	// web vni=100 proto=6 198.18.100.1:80 5-tuple
	//   vm-a 198.19.1.1:8080 via 198.19.0.1 weight 1 active
	//   vm-b 198.19.1.2:8080 via 198.19.0.2 weight 2 down
	//   vm-c 198.19.1.3:8080 via 198.19.0.2 weight 1 draining
}

// Every problem is reported, located by line, column and field path.
func ExampleParse_errors() {
	doc := []byte(`version: 4
vips:
  - name: web
    adress: 198.18.100.1
    protocol: tcp
    port: 80
    backends:
      - address: 198.19.1.1
        mac: "02:00:00:00:01"
        host: 198.19.0.1
        weight: 1.5
`)
	_, err := control.Parse(doc)
	fmt.Println(err)
	fmt.Println("invalid:", errors.Is(err, control.ErrInvalid))
	var fe *control.FieldError
	if errors.As(err, &fe) {
		fmt.Printf("first: line %d column %d path %s\n", fe.Line, fe.Column, fe.Path)
	}
	// Output:
	// 4:5: vips[0]: unknown key "adress" (did you mean "address"?)
	// 9:14: vips[0].backends[0].mac: "02:00:00:00:01" is not a MAC address (want six hex pairs, e.g. 02:00:00:00:01:01)
	// 11:17: vips[0].backends[0].weight: 1.5 is not an integer (want 0..65535; 0 drains)
	// invalid: true
	// first: line 4 column 5 path vips[0]
}

// A Parser parses a new version of a document decoding only the parts
// that changed since the text before (here: the version line and one
// VIP), with Parse's result.
func ExampleParser() {
	text := func(version, weight int) []byte {
		b := fmt.Appendf(nil, "version: %d\nvips:\n", version)
		for i := range 3 {
			w := 1
			if i == 1 {
				w = weight
			}
			b = fmt.Appendf(b, "  - name: v%d\n    address: 198.18.100.%d\n    protocol: tcp\n    port: 80\n    backends:\n"+
				"      - {address: 198.19.1.%d, mac: \"02:00:00:00:01:%02d\", host: 198.19.0.1, weight: %d}\n", i, i+1, i+1, i+1, w)
		}
		return b
	}
	p := &control.Parser{PartsMin: -1} // in parts whatever the size (the default: from 4 KiB)
	if _, err := p.Parse("", text(1, 1)); err != nil {
		fmt.Println(err)
		return
	}
	doc, err := p.Parse("", text(2, 5))
	if err != nil {
		fmt.Println(err)
		return
	}
	st := p.Stats()
	fmt.Println("version", doc.Version, "weight", doc.VIPs[1].Backends[0].Weight)
	fmt.Println("parts decoded:", st.Parsed, "reused:", st.Reused) // 5 for the first text; the version line and v1 for the second
	// Output:
	// version 2 weight 5
	// parts decoded: 7 reused: 3
}
