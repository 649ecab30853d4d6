package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/control"
)

// hostsDoc is a document of version v with n hosts h0..h(n-1), each with
// one VM backing the VIP web; weights[i], when given, is h<i>'s
// backend's weight; extra lines go at its top.
func hostsDoc(v uint64, n int, extra string, weights ...int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "version: %d\n%smux_prefixes: [198.18.0.0/24]\nvips:\n- name: web\n  address: 198.18.100.1\n  protocol: tcp\n  port: 80\n  vni: 100\n  backends:\n", v, extra)
	for i := range n {
		w := 1
		if i < len(weights) {
			w = weights[i]
		}
		fmt.Fprintf(&b, "  - {name: b%d, address: 198.19.1.%d, mac: \"02:00:00:00:01:%02x\", host: 198.19.0.%d, weight: %d}\n", i, i+1, i+1, i+1, w)
	}
	b.WriteString("hosts:\n")
	for i := range n {
		fmt.Fprintf(&b, "- name: h%d\n  address: 198.19.0.%d\n  vms: [{vni: 100, address: 198.19.1.%d, mac: \"02:00:00:00:01:%02x\", interface: vm%d}]\n", i, i+1, i+1, i+1, i)
	}
	return []byte(b.String())
}

// hostNode is a Host Agent's Source, with what it applied and how many
// texts it parsed.
type hostNode struct {
	*node
	parses atomic.Int64
}

func runHostSource(t *testing.T, c *clientv3.Client, host string) *hostNode {
	h := &hostNode{}
	src, err := NewSource(SourceConfig{Client: c, Retry: 100 * time.Millisecond, Host: host,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Parse: func(name string, text []byte) (*control.Document, error) {
			h.parses.Add(1)
			return control.Parse(text)
		}})
	require.NoError(t, err)
	h.node = startNode(t, src)
	return h
}

// applyDoc applies text with lim.
func (e *etcd) applyDoc(text []byte, lim applyLimits) (int64, error) {
	doc, err := control.Parse(text)
	require.NoError(e.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return apply(ctx, e.client, "", text, doc, "test", lim)
}

// viewOf is host's view of text, marshalled.
func viewOf(t *testing.T, text []byte, host string) string {
	doc, err := control.Parse(text)
	require.NoError(t, err)
	v, err := HostView(doc, host)
	require.NoError(t, err)
	b, err := v.Marshal()
	require.NoError(t, err)
	return string(b)
}

func (e *etcd) modRev(key string) int64 {
	resp, err := e.client.Get(context.Background(), key)
	require.NoError(e.t, err)
	if len(resp.Kvs) == 0 {
		return 0
	}
	return resp.Kvs[0].ModRevision
}

// TestHostSourceFollowsItsView: a Host Agent's Source runs its host's
// view of each version. A version that leaves its view as it was is not
// written again and costs the host no parse and no apply — only its
// version advances — while a host whose view changed applies it; a view
// written around Apply (another host's, or its own) changes nothing until
// a commit; a commit record of a lower version is refused and the host
// keeps its version (monotonic); a document that no longer lists the
// host keeps it on its version and says why.
func TestHostSourceFollowsItsView(t *testing.T) {
	e := startEtcd(t)
	_, err := e.applyDoc(hostsDoc(1, 3, ""), applyLimits{})
	require.NoError(t, err)
	watched := &keyWatcher{Watcher: e.client.Watcher}
	h0 := runHostSource(t, &clientv3.Client{KV: e.client.KV, Watcher: watched}, "h0")
	h1 := runHostSource(t, e.client, "h1")
	<-h0.src.Ready()
	<-h1.src.Ready()
	for i, h := range []*hostNode{h0, h1} {
		got, err := h.src.Document().Marshal()
		require.NoError(t, err)
		assert.Equal(t, viewOf(t, hostsDoc(1, 3, ""), fmt.Sprint("h", i)), string(got), "h%d runs its view", i)
	}
	view0 := e.modRev(DefaultPrefix + "views/h0")

	// Only the version changes: no view is written, the hosts advance.
	p0, p1 := h0.parses.Load(), h1.parses.Load()
	rev, err := e.applyDoc(hostsDoc(2, 3, ""), applyLimits{})
	require.NoError(t, err)
	eventually(t, "both at version 2", func() bool { return h0.src.Status().Version == 2 && h1.src.Status().Version == 2 })
	assert.Equal(t, view0, e.modRev(DefaultPrefix+"views/h0"), "an unchanged view is not written again")
	assert.Equal(t, []uint64{1}, h0.versions(), "no apply of an unchanged view")
	assert.Equal(t, p0, h0.parses.Load(), "no parse of an unchanged view")
	assert.Equal(t, p1, h1.parses.Load())
	assert.Equal(t, uint64(2), h0.src.Document().Version)
	st := h0.src.Status()
	assert.Equal(t, rev, st.Revision, "the running revision is the commit's")
	assert.False(t, st.Committed.IsZero())

	// h1's backend changes: only its view is written; h0 advances.
	_, err = e.applyDoc(hostsDoc(3, 3, "", 1, 5), applyLimits{})
	require.NoError(t, err)
	eventually(t, "both at version 3", func() bool { return h0.src.Status().Version == 3 && h1.src.Status().Version == 3 })
	assert.Equal(t, view0, e.modRev(DefaultPrefix+"views/h0"), "another host's change leaves h0's view")
	assert.Equal(t, []uint64{1}, h0.versions())
	assert.Equal(t, []uint64{1, 3}, h1.versions(), "h1 applies its changed view")
	assert.EqualValues(t, 5, h1.src.Document().VIPs[0].Backends[0].Weight)
	assert.Len(t, h1.src.Document().VIPs[0].Backends, 1, "only its own backend")

	// A commit record of a lower version: refused, the version stays.
	ctx := context.Background()
	_, err = e.client.Put(ctx, DefaultPrefix+"views.commit", `{"version":2}`)
	require.NoError(t, err)
	eventually(t, "stale commit refused", func() bool {
		return h0.src.Status().Reason == control.ReasonStale && h1.src.Status().Reason == control.ReasonStale
	})
	assert.Equal(t, uint64(3), h0.src.Status().Version)
	assert.Equal(t, uint64(3), h1.src.Status().Version)

	// Views written around Apply are not read until a commit, and then
	// only as committed.
	_, err = e.client.Put(ctx, DefaultPrefix+"views/h1", string(hostsDoc(9, 3, "")))
	require.NoError(t, err)
	_, err = e.client.Put(ctx, DefaultPrefix+"views/h0", "version: 9\nvips: [\n")
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, uint64(3), h0.src.Status().Version)
	assert.Equal(t, uint64(3), h1.src.Status().Version)
	h0.src.Reload()
	h1.src.Reload()
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, uint64(3), h0.src.Status().Version, "a reread reads the view as committed")
	assert.Equal(t, control.ReasonStale, h0.src.Status().Reason, "the invalid view written since the commit is not read")
	assert.Equal(t, []uint64{1, 3}, h1.versions())

	// The next apply rewrites the views left behind, and the hosts
	// follow it.
	_, err = e.applyDoc(hostsDoc(4, 3, "hash_seed: 7\n", 1, 5), applyLimits{})
	require.NoError(t, err)
	eventually(t, "both at version 4", func() bool { return h0.src.Status().Version == 4 && h1.src.Status().Version == 4 })
	assert.Equal(t, []uint64{1, 4}, h0.versions())
	assert.Equal(t, []uint64{1, 3, 4}, h1.versions())
	for i, h := range []*hostNode{h0, h1} {
		got, err := h.src.Document().Marshal()
		require.NoError(t, err)
		assert.Equal(t, viewOf(t, hostsDoc(4, 3, "hash_seed: 7\n", 1, 5), fmt.Sprint("h", i)), string(got), "h%d runs its view", i)
	}

	watched.mu.Lock()
	assert.NotEmpty(t, watched.keys)
	for _, k := range watched.keys {
		assert.Equal(t, DefaultPrefix+"views.commit", k, "a Host Agent watches only the commit record, never the document")
	}
	watched.mu.Unlock()

	// h1 leaves the document: its view is deleted, it keeps version 4.
	_, err = e.applyDoc(hostsDoc(5, 1, "hash_seed: 7\n"), applyLimits{})
	require.NoError(t, err)
	eventually(t, "h0 at version 5", func() bool { return h0.src.Status().Version == 5 })
	eventually(t, "h1 says it has no view", func() bool { return errors.Is(h1.src.Status().LastError, ErrNoView) })
	assert.Equal(t, uint64(4), h1.src.Status().Version)
	assert.Zero(t, e.modRev(DefaultPrefix+"views/h1"), "a removed host's view is deleted")
	assert.Zero(t, e.modRev(DefaultPrefix+"views.sums/h1"))
}

// withAPI is text with a second VIP, api, whose one backend is h1's VM.
func withAPI(text []byte) []byte {
	return []byte(strings.Replace(string(text), "hosts:\n", "- name: api\n  address: 198.18.100.2\n  protocol: tcp\n  port: 443\n  vni: 100\n  backends:\n"+
		"  - {name: a1, address: 198.19.1.2, mac: \"02:00:00:00:01:02\", host: 198.19.0.2}\nhosts:\n", 1))
}

// TestHostSourceVIPAdded: a VIP added rewrites the views of its backends'
// hosts and the VIP addresses every view shares (views.vips), not the
// other hosts' views: those run their view with the new addresses (their
// client filters drop the new VIP) without a parse; a VIP address list
// written since the commit is not read; one in another form than Apply's
// is parsed with the view; removing the VIP takes its address out of
// every host's document.
func TestHostSourceVIPAdded(t *testing.T) {
	e := startEtcd(t)
	_, err := e.applyDoc(hostsDoc(1, 3, ""), applyLimits{})
	require.NoError(t, err)
	h0 := runHostSource(t, e.client, "h0")
	h1 := runHostSource(t, e.client, "h1")
	<-h0.src.Ready()
	<-h1.src.Ready()
	addrs := func(h *hostNode) []string {
		var out []string
		for _, a := range h.src.Document().VIPAddresses {
			out = append(out, a.String())
		}
		return out
	}
	vips := func(h *hostNode) []string {
		var out []string
		for _, v := range h.src.Document().VIPs {
			out = append(out, v.Name)
		}
		return out
	}
	assert.Equal(t, []string{"198.18.100.1"}, addrs(h0))
	view0 := e.modRev(DefaultPrefix + "views/h0")
	vipsRev := e.modRev(DefaultPrefix + "views.vips")
	require.NotZero(t, vipsRev)

	p0 := h0.parses.Load()
	v2 := withAPI(hostsDoc(2, 3, ""))
	_, err = e.applyDoc(v2, applyLimits{})
	require.NoError(t, err)
	eventually(t, "both at version 2", func() bool { return h0.src.Status().Version == 2 && h1.src.Status().Version == 2 })
	assert.Equal(t, view0, e.modRev(DefaultPrefix+"views/h0"), "h0 backs no api: its view is not written")
	assert.Greater(t, e.modRev(DefaultPrefix+"views.vips"), vipsRev, "the shared addresses are")
	assert.Equal(t, []string{"198.18.100.1", "198.18.100.2"}, addrs(h0), "h0 knows api's address")
	assert.Equal(t, []string{"web"}, vips(h0), "and not api")
	assert.Equal(t, []string{"198.18.100.1", "198.18.100.2"}, addrs(h1))
	assert.Equal(t, []string{"web", "api"}, vips(h1), "h1 serves api")
	assert.Equal(t, p0, h0.parses.Load(), "no parse: the running view with the new addresses")
	assert.Equal(t, []uint64{1, 2}, h0.versions())
	for i, h := range []*hostNode{h0, h1} {
		got, err := h.src.Document().Marshal()
		require.NoError(t, err)
		assert.Equal(t, viewOf(t, v2, fmt.Sprint("h", i)), string(got), "h%d runs its view", i)
	}

	// Addresses written since the commit are not read.
	ctx := context.Background()
	_, err = e.client.Put(ctx, DefaultPrefix+"views.vips", "vip_addresses: [198.18.100.9]\n")
	require.NoError(t, err)
	h0.src.Reload()
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, []string{"198.18.100.1", "198.18.100.2"}, addrs(h0), "a reread reads the addresses as committed")
	assert.Equal(t, []uint64{1, 2}, h0.versions())

	// Addresses in a form Apply does not write (quoted), committed: the
	// view is parsed with them.
	_, err = e.client.Put(ctx, DefaultPrefix+"views.vips", "vip_addresses:\n  - 198.18.100.1\n  - '2001:db8::'\n")
	require.NoError(t, err)
	_, err = e.client.Put(ctx, DefaultPrefix+"views.commit", `{"version":3}`)
	require.NoError(t, err)
	eventually(t, "h0 at version 3", func() bool { return h0.src.Status().Version == 3 })
	assert.Equal(t, []string{"198.18.100.1", "2001:db8::"}, addrs(h0))
	assert.Equal(t, p0+1, h0.parses.Load(), "parsed")

	// The VIP removed: every host's addresses lose it.
	_, err = e.applyDoc(hostsDoc(4, 3, ""), applyLimits{})
	require.NoError(t, err)
	eventually(t, "both at version 4", func() bool { return h0.src.Status().Version == 4 && h1.src.Status().Version == 4 })
	assert.Equal(t, []string{"198.18.100.1"}, addrs(h0))
	assert.Equal(t, []string{"198.18.100.1"}, addrs(h1))
	assert.Equal(t, []string{"web"}, vips(h1))
	// (Every view was written again: the commit record written by hand
	// above was not Apply's, so Apply trusted none of the stored views.)
}

// TestApplyNeverHalfApplied: an apply whose changed views do not fit one
// transaction writes them in several within the limits, the commit last:
// between them, every running host still runs the last version and a
// host that (re)starts reads its view as of the last commit; an apply
// that dies half way leaves the hosts on the last version and the next
// apply whole; a second apply while one writes its views is refused.
func TestApplyNeverHalfApplied(t *testing.T) {
	const hosts = 7
	lim := applyLimits{ops: 4} // two views (view and sum) a transaction
	e := startEtcd(t)
	_, err := e.applyDoc(hostsDoc(1, hosts, ""), lim)
	require.NoError(t, err)
	var nodes []*hostNode
	for i := range hosts {
		nodes = append(nodes, runHostSource(t, e.client, fmt.Sprint("h", i)))
		<-nodes[i].src.Ready()
	}
	all := func(v uint64) bool {
		for _, n := range nodes {
			if n.src.Status().Version != v {
				return false
			}
		}
		return true
	}

	// Version 2 changes every view (hash_seed); the apply dies after
	// its second transaction of views.
	v2 := hostsDoc(2, hosts, "hash_seed: 7\n")
	died := errors.New("applier killed")
	var txns int
	lim.afterViews = func(n int) error {
		txns++
		time.Sleep(200 * time.Millisecond) // a watch event would have arrived
		assert.True(t, all(1), "after %d transactions of views every host runs version 1", n+1)
		// h0's view was written in the first transaction: a restarted
		// h0 reads the committed one.
		r := runHostSource(t, e.client, "h0")
		<-r.src.Ready()
		assert.Equal(t, uint64(1), r.src.Status().Version, "a restarted host reads the committed view")
		got, err := r.src.Document().Marshal()
		require.NoError(t, err)
		assert.Equal(t, viewOf(t, hostsDoc(1, hosts, ""), "h0"), string(got))
		r.cancel()
		if n == 0 {
			// Another apply now is refused.
			_, err := e.applyDoc(hostsDoc(3, hosts, "hash_seed: 8\n"), applyLimits{})
			assert.ErrorIs(t, err, ErrApplyInProgress)
		}
		if n == 1 {
			return died
		}
		return nil
	}
	_, err = e.applyDoc(v2, lim)
	require.ErrorIs(t, err, died)
	assert.Equal(t, 2, txns)
	assert.Zero(t, e.modRev(DefaultPrefix+"apply.claim"), "the claim is released")
	time.Sleep(200 * time.Millisecond)
	assert.True(t, all(1), "a failed apply leaves every host on version 1")

	// The next apply writes every view, in four transactions of at most
	// two, then commits.
	lim.afterViews = nil
	rev, err := e.applyDoc(v2, lim)
	require.NoError(t, err)
	eventually(t, "every host at version 2", func() bool { return all(2) })
	byRev := map[int64]int{}
	for i, n := range nodes {
		vr := e.modRev(DefaultPrefix + fmt.Sprint("views/h", i))
		assert.Less(t, vr, rev, "views are written before the commit")
		byRev[vr]++
		got, err := n.src.Document().Marshal()
		require.NoError(t, err)
		assert.Equal(t, viewOf(t, v2, fmt.Sprint("h", i)), string(got))
		assert.Equal(t, []uint64{1, 2}, n.versions())
	}
	assert.Len(t, byRev, 4, "seven views in transactions of two")
	for r, k := range byRev {
		assert.LessOrEqual(t, k, 2, "views written at revision %d", r)
	}
	assert.Equal(t, rev, e.modRev(DefaultPrefix+"document"), "the document goes with the commit")
}

// keyWatcher records the keys watched through it.
type keyWatcher struct {
	clientv3.Watcher
	mu   sync.Mutex
	keys []string
}

func (w *keyWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.mu.Lock()
	w.keys = append(w.keys, key)
	w.mu.Unlock()
	return w.Watcher.Watch(ctx, key, opts...)
}

// TestContentSum: texts that differ only in their version line have one
// sum; any other difference, a version line that is not the parsed
// version's, none or two such lines give another sum or none.
func TestContentSum(t *testing.T) {
	base := "version: 3\nvips: []\n"
	sum := contentSum([]byte(base), 3)
	require.NotEmpty(t, sum)
	for _, tc := range []struct {
		name    string
		text    string
		version uint64
		same    bool // the sum is base's; else another, or none
		none    bool
	}{
		{"another version", "version: 4\nvips: []\n", 4, true, false},
		{"spaces and CR", "version:   12 \r\nvips: []\n", 12, true, false},
		{"sealed", "checksum: sha256:00ff\nversion: 5\nvips: []\n", 5, true, false},
		{"a change", "version: 4\nvips: [ ]\n", 4, false, false},
		{"a comment", "version: 4\n# note\nvips: []\n", 4, false, false},
		{"not the parsed version", "version: 4\nvips: []\n", 5, false, true},
		{"no version line", "{version: 4, vips: []}\n", 4, false, true},
		{"two version lines", "version: 4\nversion: 4\nvips: []\n", 4, false, true},
		{"a comment after the version", "version: 4 # four\nvips: []\n", 4, false, true},
	} {
		got := contentSum([]byte(tc.text), tc.version)
		switch {
		case tc.none:
			assert.Empty(t, got, tc.name)
		case tc.same:
			assert.Equal(t, sum, got, tc.name)
		default:
			assert.NotEmpty(t, got, tc.name)
			assert.NotEqual(t, sum, got, tc.name)
		}
	}
}

// TestMuxSourceSkipsVersionOnlyChanges: a Mux's Source (the whole
// document) that sees a version whose commit record gives the running
// document's content sum — only the version changed — advances to it
// without a parse or an apply; any other change is parsed and applied,
// and a document written around Apply (no commit record) is parsed.
func TestMuxSourceSkipsVersionOnlyChanges(t *testing.T) {
	e := startEtcd(t)
	var parses atomic.Int64
	src, err := NewSource(SourceConfig{Client: e.client, Retry: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Parse: func(name string, text []byte) (*control.Document, error) {
			parses.Add(1)
			return control.Parse(text)
		}})
	require.NoError(t, err)
	_, err = e.apply(docV(1, ""))
	require.NoError(t, err)
	n := startNode(t, src)
	<-src.Ready()
	require.EqualValues(t, 1, parses.Load())

	rev, err := e.apply(docV(2, ""))
	require.NoError(t, err)
	eventually(t, "version 2", func() bool { return src.Status().Version == 2 })
	assert.EqualValues(t, 1, parses.Load(), "a version-only change is not parsed")
	assert.Equal(t, []uint64{1}, n.versions(), "nor applied")
	assert.Equal(t, rev, src.Status().Revision)
	assert.Equal(t, uint64(2), src.Document().Version)

	_, err = e.apply(docV(3, "hash_seed: 7\n"))
	require.NoError(t, err)
	eventually(t, "version 3", func() bool { return src.Status().Version == 3 })
	assert.Equal(t, []uint64{1, 3}, n.versions(), "a change is applied")
	_, err = e.apply(docV(4, "hash_seed: 7\n"))
	require.NoError(t, err)
	eventually(t, "version 4", func() bool { return src.Status().Version == 4 })
	assert.Equal(t, []uint64{1, 3}, n.versions())
	assert.EqualValues(t, 2, parses.Load())

	// Around Apply: no commit record at the document's revision.
	_, err = e.client.Put(context.Background(), DefaultPrefix+"document", string(docV(5, "hash_seed: 7\n")))
	require.NoError(t, err)
	eventually(t, "version 5", func() bool { return src.Status().Version == 5 })
	assert.Equal(t, []uint64{1, 3, 5}, n.versions())
	assert.EqualValues(t, 3, parses.Load())
}

// TestApplyRefusesView: a Host Agent's view (it has vip_addresses) is not
// a fleet's document: Apply refuses it and writes nothing.
func TestApplyRefusesView(t *testing.T) {
	e := startEtcd(t)
	_, err := e.applyDoc(hostsDoc(1, 2, ""), applyLimits{})
	require.NoError(t, err)
	rev := e.modRev(DefaultPrefix + "document")
	view := []byte(strings.Replace(viewOf(t, hostsDoc(2, 2, ""), "h0"), "version: 2", "version: 3", 1))
	_, err = e.applyDoc(view, applyLimits{})
	require.ErrorIs(t, err, ErrViewApplied)
	assert.Equal(t, rev, e.modRev(DefaultPrefix+"document"), "nothing written")
}
