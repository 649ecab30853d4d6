package fleet

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
)

// TestViewText: the text Apply writes for each host's view (views.text,
// with the VIPs every view shares encoded once) parses to the document
// HostView's marshalled text parses to, and a control.Parser reading the
// views of two versions in turn decodes only the parts that changed.
func TestViewText(t *testing.T) {
	doc, err := control.Load("testdata/two-tenants.yaml")
	require.NoError(t, err)
	vs := newViews(doc)
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
		got, err := control.Parse(text)
		require.NoError(t, err, "%s", text)
		assert.True(t, reflect.DeepEqual(want, got), "host %s: the view's text parses to another document:\n%s\nwant:\n%s", host, text, whole)
	}

	// A VIP added: a host's view gains it; its parse in parts decodes
	// the new VIP and the top (version) only.
	next := *doc
	next.Version++
	next.VIPs = append(append([]control.VIP(nil), doc.VIPs...), doc.VIPs[0])
	next.VIPs[len(next.VIPs)-1].Name = "added"
	next.VIPs[len(next.VIPs)-1].Address = next.VIPs[len(next.VIPs)-1].Address.Next().Next()
	require.NoError(t, next.Validate())
	p := &control.Parser{PartsMin: -1}
	t1, err := vs.text(0)
	require.NoError(t, err)
	_, err = p.Parse("", t1)
	require.NoError(t, err)
	st := p.Stats()
	t2, err := newViews(&next).text(0)
	require.NoError(t, err)
	_, err = p.Parse("", t2)
	require.NoError(t, err)
	after := p.Stats()
	assert.Equal(t, uint64(2), after.Parts, "both parsed in parts")
	assert.Equal(t, uint64(2), after.Parsed-st.Parsed, "parts decoded for a VIP added (the version's, the VIP's)")
}
