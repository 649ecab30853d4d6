package control

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadVIPAddresses: what MarshalVIPAddresses writes, ReadVIPAddresses
// reads back as Parse decodes it; any other form, and what Parse refuses,
// it leaves to Parse (ok false).
func TestReadVIPAddresses(t *testing.T) {
	var addrs []netip.Addr
	for _, s := range []string{"198.18.0.1", "2001:db8::1", "1:2:3:4:5:6:7:8", "::1", "64:ff9b::c612:1", "0.0.0.1", "fe80::1"} {
		addrs = append(addrs, netip.MustParseAddr(s))
	}
	text, err := MarshalVIPAddresses(addrs)
	require.NoError(t, err)
	got, ok := ReadVIPAddresses(text)
	require.True(t, ok, "%s", text)
	assert.Equal(t, addrs, got)
	d, err := Parse(append([]byte("version: 1\n"), text...))
	require.NoError(t, err)
	assert.Equal(t, d.VIPAddresses, got, "as Parse decodes it")

	for _, tc := range []struct{ name, text string }{
		{"flow style", "vip_addresses: [198.18.0.1]\n"},
		{"ends with a colon (a key to YAML)", "vip_addresses:\n  - 2001:db8::\n"},
		{"as the writer quotes it", "vip_addresses:\n  - '2001:db8::'\n"},
		{"quoted", "vip_addresses:\n  - \"198.18.0.1\"\n"},
		{"comment", "vip_addresses:\n  - 198.18.0.1 # a\n"},
		{"another key", "version: 1\nvip_addresses:\n  - 198.18.0.1\n"},
		{"other indent", "vip_addresses:\n- 198.18.0.1\n"},
		{"no end of line", "vip_addresses:\n  - 198.18.0.1"},
		{"empty", "vip_addresses:\n"},
		{"twice", "vip_addresses:\n  - 198.18.0.1\n  - 198.18.0.1\n"},
		{"mapped", "vip_addresses:\n  - ::ffff:198.18.0.1\n"},
		{"unspecified", "vip_addresses:\n  - ::\n"},
		{"multicast", "vip_addresses:\n  - ff02::1\n"},
		{"broadcast", "vip_addresses:\n  - 255.255.255.255\n"},
		{"a prefix", "vip_addresses:\n  - 198.18.0.0/24\n"},
		{"zone", "vip_addresses:\n  - fe80::1%eth0\n"},
		{"not an address", "vip_addresses:\n  - 198.18.0\n"},
	} {
		_, ok := ReadVIPAddresses([]byte(tc.text))
		assert.False(t, ok, tc.name)
	}
}

// FuzzReadVIPAddresses: whatever ReadVIPAddresses reads, Parse reads the
// same from the same text (in a document); what it does not read, Parse
// may or may not.
func FuzzReadVIPAddresses(f *testing.F) {
	for _, s := range []string{"vip_addresses:\n  - 198.18.0.1\n  - 2001:db8::1\n", "vip_addresses:\n  - ::1\n", "vip_addresses:\n  - 1:2::\n  - 0.0.0.1\n",
		"vip_addresses:\n  - 1.2.3.4\n  - 1.2.3.4\n", "vip_addresses:\n  - 10:20\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		addrs, ok := ReadVIPAddresses(text)
		if !ok {
			return
		}
		d, err := Parse(append([]byte("version: 1\n"), text...))
		if err != nil {
			t.Fatalf("ReadVIPAddresses read %q as %v, Parse refuses it: %v", text, addrs, err)
		}
		if len(d.VIPAddresses) != len(addrs) {
			t.Fatalf("%q: ReadVIPAddresses %v, Parse %v", text, addrs, d.VIPAddresses)
		}
		for i := range addrs {
			if addrs[i] != d.VIPAddresses[i] {
				t.Fatalf("%q: ReadVIPAddresses %v, Parse %v", text, addrs, d.VIPAddresses)
			}
		}
	})
}
