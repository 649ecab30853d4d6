package control

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

// base is a minimal valid document; the bad-document cases edit it, so
// line numbers in their messages refer to these lines:
//
//	1 version   3 VIP (mapping at column 5)   8 backend (mapping at column 9)
const base = `version: 1
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    backends:
      - name: vm-a
        address: 198.19.1.1
        mac: "02:00:00:00:01:01"
        host: 198.19.0.1
`

// edit returns base with old replaced by new (old must occur).
func edit(t testing.TB, old, new string) string {
	t.Helper()
	if !strings.Contains(base, old) {
		t.Fatalf("base has no %q", old)
	}
	return strings.Replace(base, old, new, 1)
}

// secondVIP is a second VIP, appended to base (lines 12-20).
const secondVIP = `  - name: api
    address: 198.18.100.2
    protocol: tcp
    port: 80
    backends:
      - name: vm-b
        address: 198.19.1.2
        mac: "02:00:00:00:01:02"
        host: 198.19.0.2
`

func TestParseBase(t *testing.T) {
	d, err := Parse([]byte(base))
	require.NoError(t, err)
	require.Len(t, d.VIPs, 1)
	v := d.VIPs[0]
	assert.Equal(t, "web", v.Name)
	assert.Equal(t, uint8(flow.ProtoTCP), v.Protocol)
	assert.Equal(t, flow.Tuple5, v.Distribution)
	assert.Nil(t, v.Probe)
	require.Len(t, v.Backends, 1)
	b := v.Backends[0]
	assert.Equal(t, uint32(DefaultWeight), b.Weight)
	assert.Equal(t, flow.BackendActive, b.State)
	assert.Equal(t, [6]byte{2, 0, 0, 0, 1, 1}, b.MAC)
	assert.Nil(t, d.BGP)
}

// Every line of every message is checked exactly: the messages are the
// user interface of this package.
func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string // every problem, in order
	}{
		{"empty", "",
			[]string{`1:1: empty document (want at least "version: 1")`}},
		{"comments only", "# nothing here\n",
			[]string{`1:1: empty document (want at least "version: 1")`}},
		{"not a mapping", "- version: 1\n",
			[]string{`1:1: want a mapping of version, written, hash_seed, maglev_min_table_size, node, infra_prefixes, mux_prefixes, bgp, nodes, vips, inbound_nat, outbound, hosts, vip_addresses, checksum, got a list`}},
		{"yaml syntax", "version: 1\nvips: [\n",
			[]string{`2: invalid YAML: did not find expected node content`}},
		{"two documents", base + "---\nversion: 2\n",
			[]string{`12:1: a second YAML document (after ---): put one document in a file`}},
		{"missing version", strings.Replace(base, "version: 1\n", "", 1),
			[]string{`1:1: version: missing (want an integer >= 1; bump it on every change)`}},
		{"version zero", edit(t, "version: 1", "version: 0"),
			[]string{`1:10: version: 0 is out of range (want >= 1; bump it on every change)`}},
		{"version string", edit(t, "version: 1", "version: seven"),
			[]string{`1:10: version: "seven" is not an integer (want >= 1; bump it on every change)`}},
		{"quoted port", edit(t, "port: 80", `port: "80"`),
			[]string{`6:11: vips[0].port: "80" is quoted, which makes it a string (remove the quotes; want 1..65535, or 0 or "all" for every port)`}},
		{"leading zero", edit(t, "port: 80", "port: 080"),
			[]string{`6:11: vips[0].port: 080 has a leading zero, which YAML 1.1 reads as octal (write it without the zero, or 0o... for octal)`}},
		{"leading zero octal digits", edit(t, "port: 80", "port: 017"),
			[]string{`6:11: vips[0].port: 017 has a leading zero, which YAML 1.1 reads as octal (write it without the zero, or 0o... for octal)`}},
		{"port range", edit(t, "port: 80", "port: 70000"),
			[]string{`6:11: vips[0].port: 70000 is out of range (want 1..65535, or 0 or "all" for every port)`}},
		{"negative port", edit(t, "port: 80", "port: -1"),
			[]string{`6:11: vips[0].port: -1 is out of range (want 1..65535, or 0 or "all" for every port)`}},
		{"port word", edit(t, "port: 80", "port: any"),
			[]string{`6:11: vips[0].port: "any" is not an integer (want 1..65535, or 0 or "all" for every port)`}},
		{"unknown top key", base + "vip: []\n",
			[]string{`12:1: unknown key "vip" (did you mean "vips"?)`}},
		{"unknown key abbreviation", edit(t, "protocol: tcp", "proto: tcp"),
			[]string{`5:5: vips[0]: unknown key "proto" (did you mean "protocol"?)`}},
		{"unknown key typo hides missing", edit(t, "        address: 198.19.1.1", "        adress: 198.19.1.1"),
			[]string{`9:9: vips[0].backends[0]: unknown key "adress" (did you mean "address"?)`}},
		{"unknown key far", base + "colour: red\n",
			[]string{`12:1: unknown key "colour" (want version, written, hash_seed, maglev_min_table_size, node, infra_prefixes, mux_prefixes, bgp, nodes, vips, inbound_nat, outbound, hosts, vip_addresses, checksum)`}},
		{"vip_addresses twice", base + "vip_addresses: [198.18.100.1, 198.18.100.2, 198.18.100.1]\n",
			[]string{`12:45: vip_addresses[2]: 198.18.100.1 is listed twice (first at vip_addresses[0], line 12)`}},
		{"vip_addresses not an address", base + "vip_addresses:\n  - 198.18.100.0/24\n  - ff02::1\n",
			[]string{`13:5: vip_addresses[0]: "198.18.100.0/24" is a prefix (want a VIP's address, IPv4 or IPv6, without /length)`,
				`14:5: vip_addresses[1]: "ff02::1" is not a unicast address (want a VIP's address, IPv4 or IPv6)`}},
		{"repeated key", edit(t, "    port: 80\n", "    port: 80\n    port: 81\n"),
			[]string{`7:5: vips[0].port: repeated key (first at line 6)`}},
		{"bad mac", edit(t, `"02:00:00:00:01:01"`, `"02:00:00:00:01"`),
			[]string{`10:14: vips[0].backends[0].mac: "02:00:00:00:01" is not a MAC address (want six hex pairs, e.g. 02:00:00:00:01:01)`}},
		{"multicast mac", edit(t, `"02:00:00:00:01:01"`, `"03:00:00:00:01:01"`),
			[]string{`10:14: vips[0].backends[0].mac: "03:00:00:00:01:01" is a multicast MAC (the low bit of the first octet is set); a VM needs a unicast MAC`}},
		{"bad address", edit(t, "198.18.100.1", "198.18.100.300"),
			[]string{`4:14: vips[0].address: "198.18.100.300" is not an IP address (want an IPv4 or IPv6 address)`}},
		{"address with zone", edit(t, "198.18.100.1", "fe80::1%eth0"),
			[]string{`4:14: vips[0].address: "fe80::1%eth0" has a zone; only a link-local peer address may have one (want an IPv4 or IPv6 address)`}},
		{"mapped address", edit(t, "198.18.100.1", "::ffff:198.18.100.1"),
			[]string{`4:14: vips[0].address: "::ffff:198.18.100.1" is an IPv4-mapped IPv6 address (write it as 198.18.100.1)`}},
		{"prefix as address", edit(t, "198.18.100.1", "198.18.100.1/32"),
			[]string{`4:14: vips[0].address: "198.18.100.1/32" is a prefix (want an IPv4 or IPv6 address, without /length)`}},
		{"unspecified address", edit(t, "host: 198.19.0.1", "host: 0.0.0.0"),
			[]string{`11:15: vips[0].backends[0].host: "0.0.0.0" is the unspecified address (want the physical address of the DIP's host (VXLAN destination))`}},
		{"weight range", edit(t, "        host: 198.19.0.1\n", "        host: 198.19.0.1\n        weight: 70000\n"),
			[]string{`12:17: vips[0].backends[0].weight: 70000 is out of range (want 0..65535; 0 drains)`}},
		{"vni range", edit(t, "    port: 80\n", "    port: 80\n    vni: 16777216\n"),
			[]string{`7:10: vips[0].vni: 16777216 is out of range (want 0..16777215)`}},
		{"distribution", edit(t, "    port: 80\n", "    port: 80\n    distribution: 4-tuple\n"),
			[]string{`7:19: vips[0].distribution: "4-tuple" is not a distribution (want 5-tuple, 3-tuple or 2-tuple)`}},
		{"protocol", edit(t, "protocol: tcp", "protocol: sctp"),
			[]string{`5:15: vips[0].protocol: "sctp" is not a protocol (want tcp or udp)`}},
		{"state down", edit(t, "        host: 198.19.0.1\n", "        host: 198.19.0.1\n        state: down\n"),
			[]string{`12:16: vips[0].backends[0].state: "down" is for health checks to decide (want active or draining; draining takes the backend out of new flows)`}},
		{"name with space", edit(t, "name: web", `name: "my web"`),
			[]string{`3:11: vips[0].name: "my web" is not a valid name (want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit)`}},
		{"name not a string", edit(t, "name: web", "name: 42"),
			[]string{`3:11: vips[0].name: want a name, got integer 42 (quote it: "42")`}},
		{"missing vip fields", "version: 1\nvips:\n  - name: web\n",
			[]string{
				`3:5: vips[0].address: missing (want the VIP's IPv4 or IPv6 address)`,
				`3:5: vips[0].protocol: missing (want tcp or udp)`,
				`3:5: vips[0].port: missing (want 1..65535, or 0 or "all" for every port)`,
			}},
		{"missing backend fields", edit(t, "        mac: \"02:00:00:00:01:01\"\n        host: 198.19.0.1\n", ""),
			[]string{
				`8:9: vips[0].backends[0].mac: missing (want the DIP's MAC address, e.g. "02:00:00:00:01:01")`,
				`8:9: vips[0].backends[0].host: missing (want the physical address of the DIP's host (VXLAN destination))`,
			}},
		{"empty backend", edit(t, "      - name: vm-a\n        address: 198.19.1.1\n        mac: \"02:00:00:00:01:01\"\n        host: 198.19.0.1\n", "      -\n"),
			[]string{`8:8: vips[0].backends[0]: empty backend (want a mapping of name, address, port, mac, host, weight, state)`}},
		{"vips not a list", "version: 1\nvips:\n  web: {}\n",
			[]string{`3:3: vips: want a list of VIPs (lines starting with "- "), got a mapping`}},
		{"duplicate vip name", base + strings.Replace(secondVIP, "name: api", "name: web", 1),
			[]string{`12:11: vips[1].name: VIP name "web" is used twice (first at vips[0], line 3)`}},
		{"duplicate vip key", base + strings.Replace(secondVIP, "198.18.100.2", "198.18.100.1", 1),
			[]string{`13:14: vips[1]: tcp 198.18.100.1:80 in VNI 0 is already served by vips[0] "web" (line 3): a VIP is unique by VNI, protocol, address and port`}},
		{"same address other vni", base + strings.Replace(strings.Replace(secondVIP, "198.18.100.2", "198.18.100.1", 1), "port: 80\n", "port: 80\n    vni: 7\n", 1),
			nil},
		{"duplicate backend name", base + "      - name: vm-a\n        address: 198.19.1.9\n        mac: \"02:00:00:00:01:09\"\n        host: 198.19.0.1\n",
			[]string{`12:15: vips[0].backends[1].name: backend name "vm-a" is used twice in this VIP (first at vips[0].backends[0], line 8)`}},
		{"duplicate backend address", base + "      - name: vm-z\n        address: 198.19.1.1\n        mac: \"02:00:00:00:01:01\"\n        host: 198.19.0.1\n",
			[]string{`13:18: vips[0].backends[1]: backend 198.19.1.1:0 is listed twice in this VIP (first at vips[0].backends[0], line 8)`}},
		{"mixed family", edit(t, "address: 198.19.1.1", "address: 2001:db8::1"),
			[]string{`9:18: vips[0].backends[0].address: 2001:db8::1 is IPv6 but the VIP 198.18.100.1 is IPv4: a DIP must have the VIP's family, since DSR NAT rewrites the destination in place (the host address may be of either family)`}},
		{"table size not prime", edit(t, "    port: 80\n", "    port: 80\n    table_size: 65536\n"),
			[]string{`7:17: vips[0].table_size: 65536 is not prime (Maglev needs a prime size; the nearest are 65521 and 65537)`}},
		{"table size one", edit(t, "    port: 80\n", "    port: 80\n    table_size: 1\n"),
			[]string{`7:17: vips[0].table_size: 1 is not prime (Maglev needs a prime size; the smallest is 2)`}},
		{"table size too small", edit(t, "    port: 80\n", "    port: 80\n    table_size: 2\n") + "      - name: vm-b\n        address: 198.19.1.2\n        mac: \"02:00:00:00:01:02\"\n        host: 198.19.0.1\n      - name: vm-c\n        address: 198.19.1.3\n        mac: \"02:00:00:00:01:03\"\n        host: 198.19.0.1\n",
			[]string{`7:17: vips[0].table_size: 3 backends do not fit a Maglev table of 2 slots (want a larger prime)`}},
		{"probe timeout", edit(t, "    port: 80\n", "    port: 80\n    probe:\n      type: tcp\n      interval: 1s\n      timeout: 2h\n"),
			[]string{`10:16: vips[0].probe.timeout: 2h is out of range (want 1ns..1h0m0s)`}},
		{"probe http-only key on tcp", edit(t, "    port: 80\n", "    port: 80\n    probe:\n      type: tcp\n      path: /healthz\n"),
			[]string{`9:13: vips[0].probe.path: path is only for http probes`}},
		{"probe path", edit(t, "    port: 80\n", "    port: 80\n    probe:\n      type: http\n      path: healthz\n"),
			[]string{`9:13: vips[0].probe.path: path "healthz": must start with "/"`}},
		{"probe duration without unit", edit(t, "    port: 80\n", "    port: 80\n    probe:\n      type: tcp\n      interval: 2\n"),
			[]string{`9:17: vips[0].probe.interval: want a duration with a unit, e.g. "2s" or "500ms", got integer 2 (add a unit: 2s?)`}},
		{"probe type missing", edit(t, "    port: 80\n", "    port: 80\n    probe:\n      interval: 2s\n"),
			[]string{`8:7: vips[0].probe.type: missing (want tcp or http)`}},
		{"probe rise zero", edit(t, "    port: 80\n", "    port: 80\n    probe:\n      type: tcp\n      rise: 0\n"),
			[]string{`9:13: vips[0].probe.rise: 0 is out of range (want 1..100 consecutive successes)`}},
		{"probe port needed", edit(t, "port: 80", "port: all\n    probe: {type: tcp}"),
			[]string{`7:12: vips[0].probe.port: missing: the VIP serves every port and backend "vm-a" has port 0, so there is no port to probe (want 1..65535)`}},
		{"bgp", base + "bgp:\n  asn: 0\n  router_id: 2001:db8::1\n  hold_time: 1s\n  peers:\n    - address: 198.18.0.1\n      asn: 65000\n    - address: 198.18.0.1\n      asn: 23456\n",
			[]string{
				`13:8: bgp.asn: 0 is out of range (want 1..4294967295)`,
				`14:14: bgp.router_id: "2001:db8::1" is not an IPv4 address (want an IPv4 address)`,
				`15:14: bgp.hold_time: 1s is too short (want 0, meaning no keepalives, or at least 3s: RFC 4271)`,
				`19:16: bgp.peers[1].address: peer 198.18.0.1 is listed twice (first at bgp.peers[0], line 17)`,
				`20:12: bgp.peers[1].asn: 23456 is AS_TRANS, reserved for 2-byte-only speakers (RFC 6793); use the real AS number`,
			}},
		{"bgp missing", base + "bgp:\n  hold_time: 1500ms\n",
			[]string{
				`13:3: bgp.asn: missing (want the local AS number, 1..4294967295)`,
				`13:3: bgp.router_id: missing (want an IPv4 address, usually the node's own)`,
				`13:14: bgp.hold_time: 1500ms is not a whole number of seconds (BGP carries seconds)`,
			}},
		{"infra prefixes", base + "infra_prefixes:\n  - 198.18.0.1/24\n  - 198.18.0.1\n  - 198.18.0.0/24\n  - 198.18.0.0/24\n",
			[]string{
				`13:5: infra_prefixes[0]: "198.18.0.1/24" has bits set past the prefix length (did you mean 198.18.0.0/24?)`,
				`14:5: infra_prefixes[1]: "198.18.0.1" is an address (want a prefix: 198.18.0.1/32?)`,
				`16:5: infra_prefixes[3]: prefix 198.18.0.0/24 is listed twice (first at infra_prefixes[2], line 15)`,
			}},
		{"mux prefixes", base + "mux_prefixes:\n  - 198.18.0.1/28\n  - 198.18.0.1\n",
			[]string{
				`13:5: mux_prefixes[0]: "198.18.0.1/28" has bits set past the prefix length (did you mean 198.18.0.0/28?)`,
				`14:5: mux_prefixes[1]: "198.18.0.1" is an address (want a prefix: 198.18.0.1/32?)`,
			}},
		{"written", edit(t, "version: 1\n", "version: 1\nwritten: yesterday\n"),
			[]string{`2:10: written: "yesterday" is not an RFC 3339 time (want an RFC 3339 time, e.g. 2026-11-30T10:00:00Z)`}},
		{"hosts", base + `hosts:
  - name: h1
    address: 198.19.0.1
    vms:
      - {vni: 0, address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm-a}
      - {vni: 0, address: 198.19.1.5, mac: "02:00:00:00:01:01", interface: vm-e}
      - {vni: 0, address: 198.19.1.6, mac: "02:00:00:00:01:06", interface: "vm/f"}
  - name: h1
    address: 198.19.0.1
`,
			[]string{
				`17:44: hosts[0].vms[1].mac: MAC 02:00:00:00:01:01 is already used in VNI 0 by another VM (at hosts[0].vms[0], line 16); a MAC may repeat only for the other address family of the same VM and interface`,
				`18:76: hosts[0].vms[2].interface: "vm/f" is not a Linux interface name (want 1-15 characters, no '/', ':' or spaces)`,
				`19:11: hosts[1].name: host name "h1" is used twice (first at hosts[0], line 13)`,
				`20:14: hosts[1].address: host address 198.19.0.1 is listed twice (first at hosts[0], line 14)`,
			}},
		{"backend disagrees with hosts", base + `hosts:
  - name: h2
    address: 198.19.0.2
    vms:
      - {address: 198.19.1.1, mac: "02:00:00:00:09:09", interface: vm-a}
`,
			[]string{
				`10:14: vips[0].backends[0].mac: DIP 198.19.1.1 in VNI 0 has MAC 02:00:00:00:01:01 here but 02:00:00:00:09:09 in hosts (at hosts[0].vms[0], line 16)`,
				`11:15: vips[0].backends[0].host: DIP 198.19.1.1 in VNI 0 is on host "h2" (198.19.0.2) according to hosts (at hosts[0].vms[0], line 16), not 198.19.0.1`,
			}},
		{"dip disagrees across vips", base + strings.Replace(secondVIP, "198.19.1.2", "198.19.1.1", 1),
			[]string{
				`19:14: vips[1].backends[0].mac: DIP 198.19.1.1 in VNI 0 has MAC 02:00:00:00:01:02 here but 02:00:00:00:01:01 at vips[0].backends[0], line 8`,
				`20:15: vips[1].backends[0].host: DIP 198.19.1.1 in VNI 0 is on host 198.19.0.2 here but 198.19.0.1 at vips[0].backends[0], line 8`,
			}},
		{"merge key of wrong kind", "version: 1\nnode:\n  <<: 5\n",
			[]string{`3:7: node: << merges a mapping or a list of mappings, got integer 5`}},
		{"alias of wrong kind", "version: &v 1\nnode: *v\n",
			[]string{`1:10: node: want a mapping of name, got integer 1`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := Parse([]byte(c.doc))
			if c.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err, "document:\n%s", c.doc)
			assert.Nil(t, d)
			assert.ErrorIs(t, err, ErrInvalid)
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, strings.Join(c.want, "\n"), err.Error(), "document:\n%s", c.doc)
		})
	}
}

// A typo in the hosts section is reported once even though the backend's
// address is then looked up in a hosts set that lacks it.
func TestParseCollectsEveryProblem(t *testing.T) {
	doc := edit(t, "port: 80", "port: 70000")
	doc = strings.Replace(doc, `"02:00:00:00:01:01"`, `"zz"`, 1)
	doc = strings.Replace(doc, "version: 1", "version: 0", 1)
	_, err := Parse([]byte(doc))
	require.Error(t, err)
	msgs := strings.Split(err.Error(), "\n")
	require.Len(t, msgs, 3, err.Error())
	assert.True(t, strings.HasPrefix(msgs[0], "1:10: version:"))
	assert.True(t, strings.HasPrefix(msgs[1], "6:11: vips[0].port:"))
	assert.True(t, strings.HasPrefix(msgs[2], "10:14: vips[0].backends[0].mac:"))
	// Each problem is a *FieldError wrapping ErrInvalid.
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		require.ErrorAs(t, e, &fe)
		assert.ErrorIs(t, e, ErrInvalid)
		assert.NotZero(t, fe.Line)
	}
}

func TestParseErrorLimit(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\nvips:\n")
	for i := range MaxErrors + 10 {
		fmt.Fprintf(&b, "  - {name: v%d, address: 198.18.100.%d, protocol: tcp, port: 0x10000}\n", i, i%250+1)
	}
	_, err := Parse([]byte(b.String()))
	require.Error(t, err)
	msgs := strings.Split(err.Error(), "\n")
	require.Len(t, msgs, MaxErrors+1)
	assert.Equal(t, "and 10 more problems", msgs[MaxErrors])
}

func TestLoadNamesTheFile(t *testing.T) {
	path := t.TempDir() + "/web.yaml"
	require.NoError(t, os.WriteFile(path, []byte(edit(t, `"02:00:00:00:01:01"`, `"02:00:00:00:01"`)), 0o644))
	_, err := Load(path)
	require.Error(t, err)
	assert.Equal(t, path+`:10:14: vips[0].backends[0].mac: "02:00:00:00:01" is not a MAC address (want six hex pairs, e.g. 02:00:00:00:01:01)`, err.Error())

	_, err = Load(t.TempDir() + "/missing.yaml")
	require.ErrorIs(t, err, os.ErrNotExist)
	assert.NotErrorIs(t, err, ErrInvalid)
}

func TestParseExample(t *testing.T) {
	d, err := Load("testdata/example.yaml")
	require.NoError(t, err)

	assert.Equal(t, uint64(7), d.Version)
	assert.Equal(t, time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC), d.Written)
	assert.Equal(t, uint64(0x5eed1234), d.HashSeed)
	assert.Equal(t, "mux-1", d.Node.Name)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24"), netip.MustParsePrefix("2001:db8:ff::/64")}, d.InfraPrefixes)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("198.18.0.0/28")}, d.MuxPrefixes)

	assert.Equal(t, &BGP{
		ASN: 65010, RouterID: netip.MustParseAddr("198.18.0.10"), ListenPort: 179,
		ListenAddresses: []netip.Addr{netip.MustParseAddr("198.18.0.10")},
		HoldTime:        9 * time.Second, WithdrawGrace: 2 * time.Second, NextHop: netip.MustParseAddr("198.18.0.10"),
		Peers: []Peer{{Address: netip.MustParseAddr("198.18.0.1"), ASN: 65000, Port: 179, Password: "change me", TTLSecurity: 1}},
	}, d.BGP)

	require.Len(t, d.VIPs, 3)
	web := d.VIPs[0]
	assert.Equal(t, &health.Spec{
		Type: health.ProbeHTTP, Port: 8080, Path: "/healthz", Method: "GET", ExpectStatus: 200,
		Interval: time.Second, Timeout: 500 * time.Millisecond, Rise: 2, Fall: 3,
	}, web.Probe)
	assert.Equal(t, uint32(65537), web.TableSize)
	assert.Equal(t, []Backend{
		{Name: "vm-a", Address: netip.MustParseAddr("198.19.1.1"), Port: 8080, MAC: [6]byte{2, 0, 0, 0, 1, 1}, Host: netip.MustParseAddr("198.19.0.1"), Weight: 1},
		{Name: "vm-b", Address: netip.MustParseAddr("198.19.1.2"), Port: 8080, MAC: [6]byte{2, 0, 0, 0, 1, 2}, Host: netip.MustParseAddr("198.19.0.2"), Weight: 2},
		{Name: "vm-c", Address: netip.MustParseAddr("198.19.1.3"), Port: 8080, MAC: [6]byte{2, 0, 0, 0, 1, 3}, Host: netip.MustParseAddr("198.19.0.2"), Weight: 1, State: flow.BackendDraining},
	}, web.Backends)

	dns := d.VIPs[1]
	assert.Equal(t, uint8(flow.ProtoUDP), dns.Protocol)
	assert.Equal(t, flow.Tuple3, dns.Distribution)
	assert.Equal(t, "[2001:db8:200::1]:0", dns.Backends[0].Name, "default name is address:port")
	assert.Equal(t, health.Spec{Type: health.ProbeTCP, Port: 53, Interval: 2 * time.Second, Timeout: time.Second, Rise: 2, Fall: 3}, *dns.Probe, "defaults filled in")
	assert.Equal(t, uint16(0), d.VIPs[2].Port, `"all" is port 0`)

	require.Len(t, d.Hosts, 2)
	assert.Equal(t, uint16(DefaultVXLANPort), d.Hosts[1].VXLANPort)
	assert.Equal(t, VM{VNI: 100, Address: netip.MustParseAddr("198.19.1.3"), MAC: [6]byte{2, 0, 0, 0, 1, 3}, Interface: "vm-c"}, d.Hosts[1].VMs[1])

	// The rules build a snapshot: what Parse accepts, the data path does.
	_, err = flow.NewSnapshot(d.Version, d.Rules(nil), nil)
	require.NoError(t, err)
}

func TestParseDefaults(t *testing.T) {
	d, err := Parse([]byte(base + "bgp:\n  asn: 65010\n  router_id: 198.18.0.10\n  next_hop6: '2001:db8::10'\n  peers:\n    - {address: 'fe80::1%eth0', asn: 65000}\nhosts:\n  - address: 198.19.0.1\n"))
	require.NoError(t, err)
	assert.Equal(t, int32(DefaultListenPort), d.BGP.ListenPort)
	assert.Equal(t, DefaultHoldTime, d.BGP.HoldTime)
	assert.Equal(t, DefaultWithdrawGrace, d.BGP.WithdrawGrace)
	assert.False(t, d.BGP.NextHop.IsValid())
	assert.Equal(t, uint16(DefaultListenPort), d.BGP.Peers[0].Port)
	assert.Equal(t, "eth0", d.BGP.Peers[0].Address.Zone(), "a link-local peer may have a zone")
	assert.Equal(t, "198.19.0.1", d.Hosts[0].Name, "host name defaults to its address")
	assert.Equal(t, uint16(DefaultVXLANPort), d.Hosts[0].VXLANPort)

	d, err = Parse([]byte(base + "bgp:\n  asn: 65010\n  router_id: 198.18.0.10\n  listen_port: 0\n  hold_time: 0s\n"))
	require.NoError(t, err)
	assert.Equal(t, int32(0), d.BGP.ListenPort, "explicit 0: do not listen")
	assert.Equal(t, time.Duration(0), d.BGP.HoldTime)
}

func TestParseAliasesAndMerge(t *testing.T) {
	doc := `version: 1
x-probe: &probe {type: http, path: /ready}
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    probe: *probe
    backends:
      - &vm
        address: 198.19.1.1
        port: 8080
        mac: "02:00:00:00:01:01"
        host: 198.19.0.1
      - <<: *vm
        address: 198.19.1.2
        mac: "02:00:00:00:01:02"
`
	_, err := Parse([]byte(doc))
	// Extension keys are not allowed at the top level either.
	require.EqualError(t, err, `2:1: unknown key "x-probe" (want version, written, hash_seed, maglev_min_table_size, node, infra_prefixes, mux_prefixes, bgp, nodes, vips, inbound_nat, outbound, hosts, vip_addresses, checksum)`)

	doc = strings.Replace(doc, "x-probe: &probe {type: http, path: /ready}\n", "", 1)
	doc = strings.Replace(doc, "    probe: *probe\n", "    probe: &probe {type: http, path: /ready}\n", 1)
	doc += "  - name: api\n    address: 198.18.100.2\n    protocol: tcp\n    port: 80\n    probe: *probe\n"
	d, err := Parse([]byte(doc))
	require.NoError(t, err)
	assert.Equal(t, d.VIPs[0].Probe, d.VIPs[1].Probe)
	assert.Equal(t, "/ready", d.VIPs[1].Probe.Path)
	b := d.VIPs[0].Backends
	require.Len(t, b, 2)
	assert.Equal(t, "198.19.1.2:8080", b[1].Name)
	assert.Equal(t, uint16(8080), b[1].Port, "merged from the anchor")
	assert.Equal(t, [6]byte{2, 0, 0, 0, 1, 2}, b[1].MAC, "explicit key wins over the merge")
}

// A document that expands far beyond its size through aliases (every host
// listing the same long VM list) is refused, not walked.
func TestParseAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\nhosts:\n  - address: 198.19.0.1\n    vms: &v\n")
	for i := range 500 {
		fmt.Fprintf(&b, "      - {vni: %d, address: 198.19.1.1, mac: \"02:00:00:00:00:01\", interface: v}\n", i)
	}
	for i := range 500 {
		fmt.Fprintf(&b, "  - {address: 198.20.%d.%d, vms: *v}\n", i/250, i%250+1)
	}
	_, err := Parse([]byte(b.String()))
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "document too large after expanding aliases (*name)")
}

func TestParseDualStackVM(t *testing.T) {
	_, err := Parse([]byte(base + `hosts:
  - address: 198.19.0.1
    vms:
      - {address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm-a}
      - {address: "2001:db8::1", mac: "02:00:00:00:01:01", interface: vm-a}
`))
	require.NoError(t, err)
}

// A backend on a host that runs no Host Agent (a plain kernel vxlan
// device: the README's "Backends without a Host Agent") is listed in its
// VIP only: its host is not in the hosts section, which lists the Host
// Agents' hosts, and its DIP is the host's own address with port 0 (the
// packet's port: nothing on the host translates it).
func TestParseBackendWithoutHostAgent(t *testing.T) {
	d, err := Parse([]byte(base + `      - name: kvx-3
        address: 198.19.0.3
        mac: "02:00:00:00:03:00"
        host: 198.19.0.3
hosts:
  - address: 198.19.0.1
    vms:
      - {address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm-a}
`))
	require.NoError(t, err)
	require.Len(t, d.Hosts, 1)
	_, listed := d.Host("198.19.0.3")
	require.False(t, listed)
	b := d.VIPs[0].Backends[1]
	require.Equal(t, Backend{Name: "kvx-3", Address: netip.MustParseAddr("198.19.0.3"), MAC: [6]byte{2, 0, 0, 0, 3, 0},
		Host: netip.MustParseAddr("198.19.0.3"), Weight: DefaultWeight, State: flow.BackendActive}, b)
	rules := d.Rules(nil)
	require.Len(t, rules[0].Backends, 2)
	require.Equal(t, netip.MustParseAddr("198.19.0.3"), rules[0].Backends[1].Host, "the Muxes send its VXLAN to its host")
}

func TestSuggest(t *testing.T) {
	for _, c := range []struct{ key, want string }{
		{"adress", "address"},
		{"addr", "address"},
		{"Address", "address"},
		{"tablesize", "table_size"},
		{"backend", "backends"},
		{"proto", "protocol"},
		{"hots", "host"},
		{"weigth", "weight"},
		{"colour", ""},
		{"x", ""},
	} {
		known := append(append([]string{}, vipKeys...), backendKeys...)
		assert.Equal(t, c.want, suggest(c.key, known), c.key)
	}
}

func TestFieldErrorFormat(t *testing.T) {
	assert.Equal(t, "f.yaml:3:7: a.b: bad", (&FieldError{File: "f.yaml", Line: 3, Column: 7, Path: "a.b", Msg: "bad"}).Error())
	assert.Equal(t, "3: bad", (&FieldError{Line: 3, Msg: "bad"}).Error())
	assert.Equal(t, "f.yaml: bad", (&FieldError{File: "f.yaml", Msg: "bad"}).Error())
	assert.Equal(t, "a: bad", (&FieldError{Path: "a", Msg: "bad"}).Error())
	assert.True(t, errors.Is(&FieldError{}, ErrInvalid))
}
