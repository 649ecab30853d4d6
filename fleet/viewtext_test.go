package fleet

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
)

// TestViewText: the text Apply writes for each host's view (views.text,
// with the VIPs' texts encoded once), followed by the VIP addresses it
// stores once for every view (views.addrsText), is the text Marshal
// writes for HostView's document, parsed; a VIP added leaves the views of
// hosts without its backends as they were (same sum), as does a VIP's
// setting changed; a control.Parser reading a host's views of two
// versions in turn decodes only the parts that changed.
func TestViewText(t *testing.T) {
	doc, err := control.Load("testdata/two-tenants.yaml")
	require.NoError(t, err)
	vs := newViews(doc)
	addrs, err := vs.addrsText()
	require.NoError(t, err)
	for hi := range doc.Hosts {
		host := doc.Hosts[hi].Name
		view, err := HostView(doc, host)
		require.NoError(t, err)
		whole, err := view.Marshal()
		require.NoError(t, err)
		want, err := control.Parse(whole)
		require.NoError(t, err)
		text, err := vs.text(hi)
		require.NoError(t, err)
		got, err := control.Parse(append(text, addrs...))
		require.NoError(t, err, "%s%s", text, addrs)
		assert.True(t, reflect.DeepEqual(want, got), "host %s: the view's text parses to another document:\n%s%s\nwant:\n%s", host, text, addrs, whole)
	}

	// A VIP added, backed by h1 (doc.Hosts[0]): h1's view gains it, and
	// its parse in parts decodes the new VIP, the top (version) and the
	// addresses only; h4's (no backend of it) keeps its sum.
	next := *doc
	next.Version++
	next.VIPs = append(append([]control.VIP(nil), doc.VIPs...), doc.VIPs[0])
	added := &next.VIPs[len(next.VIPs)-1]
	added.Name, added.Address = "added", added.Address.Next().Next()
	added.Backends = added.Backends[:1]
	require.Equal(t, "h1", doc.Hosts[0].Name)
	require.Equal(t, doc.Hosts[0].Address, added.Backends[0].Host, "the added VIP's backend is on h1")
	require.NoError(t, next.Validate())
	nvs := newViews(&next)
	naddrs, err := nvs.addrsText()
	require.NoError(t, err)
	assert.NotEqual(t, string(addrs), string(naddrs), "the addresses gained the VIP's")
	h4 := 3
	require.Equal(t, "h4", doc.Hosts[h4].Name)
	for hi := range doc.Hosts {
		assert.Equal(t, hi != 0, vs.sum(hi) == nvs.sum(hi), "host %s: its view's sum changes only if it backs the VIP", doc.Hosts[hi].Name)
	}
	p := &control.Parser{PartsMin: -1}
	t1, err := vs.text(0)
	require.NoError(t, err)
	_, err = p.Parse("", append(t1, addrs...))
	require.NoError(t, err)
	st := p.Stats()
	t2, err := nvs.text(0)
	require.NoError(t, err)
	_, err = p.Parse("", append(t2, naddrs...))
	require.NoError(t, err)
	after := p.Stats()
	assert.Equal(t, uint64(2), after.Parts, "both parsed in parts")
	assert.Equal(t, uint64(3), after.Parsed-st.Parsed, "parts decoded for a VIP added (the version's, the VIP's, the new address's)")

	// A VIP's own setting changed (web's port): the views of its
	// backends' hosts change, the others' do not.
	moved := *doc
	moved.Version++
	moved.VIPs = append([]control.VIP(nil), doc.VIPs...)
	moved.VIPs[0].Port++
	require.Equal(t, "web", moved.VIPs[0].Name)
	require.NoError(t, moved.Validate())
	mvs := newViews(&moved)
	for hi := range doc.Hosts {
		assert.Equal(t, hi == h4, vs.sum(hi) == mvs.sum(hi), "host %s: its view's sum changes only if it backs web", doc.Hosts[hi].Name)
	}
}
