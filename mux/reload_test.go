package mux

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/bgp"
	"github.com/xdplb/xdplb/control"
)

// A reload whose BGP change needs a restart of the speaker (asn,
// router_id, listen_port, listen_addresses, the bgp section removed) is
// refused whole: the version is not reported as applied, the controller
// keeps the running document, and the refusal is counted. A later
// document that changes nothing of the sort is applied. No listener is
// opened (listen_port 0), so no privileges are needed.
func TestReloadNeedingBGPRestartIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "fleet.yaml")
	write := func(version int, bgpSection string) {
		t.Helper()
		doc := "version: " + strconv.Itoa(version) + "\n" + bgpSection
		require.NoError(t, os.WriteFile(path+".tmp", []byte(doc), 0o600))
		require.NoError(t, os.Rename(path+".tmp", path))
	}
	const speaker = "bgp:\n  asn: 65010\n  router_id: 198.18.0.10\n  listen_port: 0\n"
	write(1, speaker)

	m, err := New(Config{Interface: "unused", ConfigPath: path})
	require.NoError(t, err)
	defer watchFile(m)()
	require.EqualValues(t, 1, m.Status().Version)

	waitStatus := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second) // hang guard
		m.Reload()                                   // the watcher settles the file before it reads it
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: status %+v", what, m.Status())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for i, change := range []string{
		"bgp:\n  asn: 65011\n  router_id: 198.18.0.10\n  listen_port: 0\n",
		"bgp:\n  asn: 65010\n  router_id: 198.18.0.11\n  listen_port: 0\n",
		"bgp:\n  asn: 65010\n  router_id: 198.18.0.10\n  listen_port: 1179\n",
		"",
	} {
		rejected := m.Status().Rejected
		write(2+i, change)
		waitStatus("refusal", func() bool { return m.Status().Rejected > rejected })
		st := m.Status()
		require.EqualValues(t, 1, st.Version, "change %d: the running version stays", i)
		require.ErrorIs(t, st.LastError, bgp.ErrRestartRequired, "change %d", i)
		require.EqualValues(t, 1, m.ctl.Document().Version, "change %d: the controller keeps the running document", i)
	}
	// A change the running speaker takes (a peer) is applied.
	write(10, speaker+"  peers: [{address: 198.18.0.1, asn: 65000, password: x, ttl_security: 1}]\n")
	waitStatus("apply", func() bool { return m.Status().Version == 10 })
	require.EqualValues(t, 10, m.ctl.Document().Version)
}

// watchFile runs m's file watcher, applying with m.apply as Run does,
// until the function it returns is called, which also shuts m's BGP
// speaker down; it returns once the first document was applied or
// refused.
func watchFile(m *Mux) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.watcher.Run(ctx, func(d *control.Document) error { return m.apply(ctx, d) }) }()
	<-m.watcher.Ready()
	return func() {
		cancel()
		<-done
		m.shutdownBGP()
	}
}
