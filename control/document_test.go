package control

import (
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

func loadExample(t testing.TB) *Document {
	t.Helper()
	d, err := Load("testdata/example.yaml")
	require.NoError(t, err)
	return d
}

func TestRules(t *testing.T) {
	d := loadExample(t)

	rules := d.Rules(nil)
	require.Len(t, rules, 3)
	web := rules[0]
	assert.Equal(t, "web", web.Name)
	assert.Equal(t, flow.VIP{Addr: netip.MustParseAddr("198.18.100.1"), Proto: flow.ProtoTCP, Port: 80, VNI: 100}, web.VIP)
	assert.Equal(t, flow.Tuple5, web.Mode)
	assert.Equal(t, uint32(65537), web.TableSize)
	assert.Equal(t, flow.Backend{
		Name: "vm-b", Addr: netip.MustParseAddr("198.19.1.2"), Port: 8080,
		MAC: [6]byte{2, 0, 0, 0, 1, 2}, Host: netip.MustParseAddr("198.19.0.2"), Weight: 2, State: flow.BackendActive,
	}, web.Backends[1])
	assert.Equal(t, flow.BackendDraining, web.Backends[2].State, "draining comes from the document")
	assert.Equal(t, flow.Tuple3, rules[1].Mode)
	assert.Equal(t, uint8(flow.ProtoUDP), rules[1].VIP.Proto)
	assert.Equal(t, uint16(0), rules[2].VIP.Port)

	// Health: down wins over the document's state, unknown keeps it.
	asked := map[string]bool{}
	rules = d.Rules(func(vip, backend string) (bool, bool) {
		asked[vip+"/"+backend] = true
		switch vip + "/" + backend {
		case "web/vm-a":
			return false, true // down
		case "web/vm-b":
			return true, true // up
		case "web/vm-c":
			return false, true // down and draining: down
		}
		return false, false // unknown
	})
	assert.Equal(t, flow.BackendDown, rules[0].Backends[0].State)
	assert.Equal(t, flow.BackendActive, rules[0].Backends[1].State)
	assert.Equal(t, flow.BackendDown, rules[0].Backends[2].State)
	assert.Equal(t, flow.BackendActive, rules[1].Backends[0].State, "unknown health keeps the document's state")
	assert.True(t, asked["dns/[2001:db8:200::1]:0"], "health is asked by VIP name and backend name")

	// Rules are the caller's: changing them leaves the document alone.
	rules[0].Backends[0].Weight = 99
	assert.Equal(t, uint32(1), d.VIPs[0].Backends[0].Weight)

	rs := flow.NewRules()
	s, err := rs.Update(d.Version, rules)
	require.NoError(t, err)
	assert.Equal(t, 3, s.Len())
}

func TestPrefixes(t *testing.T) {
	d := loadExample(t)
	d.VIPs = append(d.VIPs, d.VIPs[0]) // the same address twice
	assert.Equal(t, []netip.Prefix{
		netip.MustParsePrefix("198.18.100.1/32"),
		netip.MustParsePrefix("198.18.100.2/32"),
		netip.MustParsePrefix("2001:db8:100::53/128"),
	}, d.Prefixes())
	assert.Empty(t, (&Document{}).Prefixes())
}

func TestHostAndVIPLookup(t *testing.T) {
	d := loadExample(t)
	h, ok := d.Host("host-2")
	require.True(t, ok)
	assert.Equal(t, netip.MustParseAddr("198.19.0.2"), h.Address)
	h, ok = d.Host("198.19.0.1")
	require.True(t, ok)
	assert.Equal(t, "host-1", h.Name)
	_, ok = d.Host("host-3")
	assert.False(t, ok)
	_, ok = d.Host("198.19.0.9")
	assert.False(t, ok)

	v, ok := d.VIP("dns")
	require.True(t, ok)
	assert.Equal(t, uint32(200), v.VNI)
	_, ok = d.VIP("nope")
	assert.False(t, ok)
}

func TestMarshalRoundTrip(t *testing.T) {
	for _, name := range []string{"example", "base", "view"} {
		t.Run(name, func(t *testing.T) {
			var d *Document
			switch name {
			case "example":
				d = loadExample(t)
			case "base":
				var err error
				d, err = Parse([]byte(base))
				require.NoError(t, err)
			case "view":
				var err error
				d, err = Parse([]byte(base + "vip_addresses: [198.18.100.1, 2001:db8::1]\n"))
				require.NoError(t, err)
				require.Equal(t, []netip.Addr{netip.MustParseAddr("198.18.100.1"), netip.MustParseAddr("2001:db8::1")}, d.VIPAddresses)
				// Marshal writes vip_addresses last, as MarshalVIPAddresses
				// writes it alone.
				bare := *d
				bare.VIPAddresses = nil
				text, err := bare.Marshal()
				require.NoError(t, err)
				tail, err := MarshalVIPAddresses(d.VIPAddresses)
				require.NoError(t, err)
				whole, err := d.Marshal()
				require.NoError(t, err)
				require.Equal(t, string(text)+string(tail), string(whole))
			}
			out, err := d.Marshal()
			require.NoError(t, err)
			d2, err := Parse(out)
			require.NoError(t, err, "marshalled:\n%s", out)
			assert.Equal(t, d, d2)
			// Marshal is a fixed point: writing the re-read document
			// gives the same bytes.
			out2, err := d2.Marshal()
			require.NoError(t, err)
			assert.Equal(t, string(out), string(out2))
		})
	}
}

// Marshal keeps what YAML could misread as another type a string.
func TestMarshalQuotesAmbiguousStrings(t *testing.T) {
	d, err := Parse([]byte(edit(t, "name: vm-a", `name: "true"`)))
	require.NoError(t, err)
	d.Node.Name = "123"
	out, err := d.Marshal()
	require.NoError(t, err)
	d2, err := Parse(out)
	require.NoError(t, err, "marshalled:\n%s", out)
	assert.Equal(t, d, d2)
	assert.Contains(t, string(out), `mac: "02:00:00:00:01:01"`)
}

func TestValidateBuiltDocument(t *testing.T) {
	d := &Document{
		Version: 3,
		VIPs: []VIP{{
			Name: "web", Address: netip.MustParseAddr("198.18.100.1"), Protocol: flow.ProtoTCP, Port: 80,
			Probe: &health.Spec{Type: health.ProbeTCP, Interval: time.Second, Timeout: -2 * time.Second, Rise: 1, Fall: 1},
			Backends: []Backend{
				{Name: "a", Address: netip.MustParseAddr("198.19.1.1"), MAC: [6]byte{2, 0, 0, 0, 0, 1}, Host: netip.MustParseAddr("198.19.0.1"), Weight: 1},
				{Name: "b", Address: netip.MustParseAddr("2001:db8::1"), MAC: [6]byte{2, 0, 0, 0, 0, 2}, Weight: MaxWeight + 1},
			},
		}},
		Hosts: []Host{{Name: "h", Address: netip.MustParseAddr("198.19.0.1")}},
	}
	err := d.Validate()
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Equal(t, strings.Join([]string{
		"vips[0].probe.timeout: -2s is out of range (want 1ns..1h0m0s)",
		"vips[0].backends[1].host: missing (want the physical address of the DIP's host (VXLAN destination))",
		"vips[0].backends[1].address: 2001:db8::1 is IPv6 but the VIP 198.18.100.1 is IPv4: a DIP must have the VIP's family, since DSR NAT rewrites the destination in place (the host address may be of either family)",
		"vips[0].backends[1].weight: 65536 is out of range (want 0..65535; 0 drains)",
		"hosts[0].vxlan_port: 0 is out of range (want 1..65535)",
	}, "\n"), err.Error())

	ok := loadExample(t)
	require.NoError(t, ok.Validate())
}

func TestExampleFileIsInDocComment(t *testing.T) {
	// The copy-ready document in doc.go parses.
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	text := string(src)
	start := strings.Index(text, "//\tversion: 1\n")
	require.Positive(t, start)
	var doc strings.Builder
	for _, line := range strings.Split(text[start:], "\n") {
		if !strings.HasPrefix(line, "//\t") {
			break
		}
		doc.WriteString(strings.TrimPrefix(line, "//\t"))
		doc.WriteByte('\n')
	}
	d, err := Parse([]byte(doc.String()))
	require.NoError(t, err, doc.String())
	assert.Len(t, d.VIPs[0].Backends, 2)
}

// TestRuleMatchesRules: converting one VIP gives what Rules gives for it,
// with and without health, and the pools do not share memory.
func TestRuleMatchesRules(t *testing.T) {
	d := loadExample(t)
	down := func(vip, backend string) (bool, bool) { return backend != "vm-a", true }
	for _, h := range []func(vip, backend string) (bool, bool){nil, down} {
		rules := d.Rules(h)
		for i := range d.VIPs {
			r := d.Rule(i, h)
			require.Equal(t, rules[i], r, "VIP %d", i)
		}
	}
	rules := d.Rules(nil)
	rules[0].Backends = append(rules[0].Backends, flow.Backend{Name: "extra"})
	assert.NotEqual(t, "extra", rules[1].Backends[0].Name, "appending to one pool leaves the next alone")
}

// TestMaglevMinTableSize: maglev_min_table_size sizes the tables of VIPs
// without table_size (rounded up to the ladder), leaves explicit sizes
// alone, and survives Marshal.
func TestMaglevMinTableSize(t *testing.T) {
	src := `
version: 1
maglev_min_table_size: 20000
vips:
  - name: auto
    address: 198.18.100.1
    protocol: tcp
    port: 80
    backends:
      - {address: 198.19.1.1, mac: "02:00:00:00:01:01", host: 198.19.0.1}
  - name: pinned
    address: 198.18.100.2
    protocol: tcp
    port: 80
    table_size: 251
    backends:
      - {address: 198.19.1.2, mac: "02:00:00:00:01:02", host: 198.19.0.1}
`
	d, err := Parse([]byte(src))
	require.NoError(t, err)
	require.EqualValues(t, 20000, d.MaglevMinTableSize)
	rules := d.Rules(nil)
	assert.EqualValues(t, 32749, rules[0].TableSize, "the rung at or above 20000")
	assert.EqualValues(t, 251, rules[1].TableSize)
	assert.Equal(t, rules[0], d.Rule(0, nil))
	out, err := d.Marshal()
	require.NoError(t, err)
	again, err := Parse(out)
	require.NoError(t, err)
	assert.Equal(t, d.MaglevMinTableSize, again.MaglevMinTableSize)

	d.MaglevMinTableSize = 0
	assert.Zero(t, d.Rules(nil)[0].TableSize, "no minimum: the flow package sizes it")
	_, err = Parse([]byte("version: 1\nmaglev_min_table_size: 16777214\n"))
	require.Error(t, err)
}
