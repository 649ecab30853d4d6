package mux

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
)

// A document that brings the first bgp section, whose speaker then fails
// to start (its listen port is taken), is refused whole: the watcher
// keeps reporting the running version, and the controller — what the data
// path and the announcements run — keeps it too, so the version the node
// reports is the one it runs.
func TestReloadWhoseBGPSpeakerFailsIsRefusedWhole(t *testing.T) {
	// The port the new speaker would listen on, taken.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	tests := []struct {
		name string
		bgp  string // the bgp section of version 2
	}{
		{"listen port taken", "bgp:\n  asn: 65010\n  router_id: 198.18.0.10\n  listen_port: " + strconv.Itoa(port) +
			"\n  listen_addresses: [127.0.0.1]\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "fleet.yaml")
			write := func(doc string) {
				t.Helper()
				require.NoError(t, os.WriteFile(path+".tmp", []byte(doc), 0o600))
				require.NoError(t, os.Rename(path+".tmp", path))
			}
			const vip = "vips:\n  - name: web\n    address: 198.18.7.1\n    protocol: tcp\n    port: 80\n" +
				"    backends:\n      - {name: b0, address: 198.18.8.1, host: 198.18.9.1, mac: 02:00:00:00:01:01}\n"
			write("version: 1\n")
			m, err := New(Config{Interface: "unused", ConfigPath: path, Logger: quietLog})
			require.NoError(t, err)
			defer watchFile(m)()

			rejected := m.Status().Rejected
			write("version: 2\n" + vip + tt.bgp)
			deadline := time.Now().Add(10 * time.Second) // hang guard
			m.Reload()
			for m.Status().Rejected == rejected {
				require.False(t, time.Now().After(deadline), "no refusal: status %+v", m.Status())
				time.Sleep(10 * time.Millisecond)
			}
			require.EqualValues(t, 1, m.Status().Version, "the version is refused")
			require.EqualValues(t, 1, m.ctl.Document().Version, "the controller runs the version reported")
			require.Zero(t, m.ctl.Snapshot().(*muxSnapshot).rules.Len(), "the data path runs version 1's rules")
		})
	}
}

// TestRefusedVersionKeepsOneSpeaker: a version whose first BGP speaker
// starts but which the controller then refuses (its steering sync fails)
// stops the speaker and keeps it for the next try: twenty tries of the
// refused version leave at most one GoBGP server behind, where a new
// speaker per try left one each (GoBGP cannot end a server). A later
// try the controller takes starts that same speaker.
func TestRefusedVersionKeepsOneSpeaker(t *testing.T) {
	m := newIdleMux(t)
	ctx := context.Background()
	st := &fakeSteering{}
	require.NoError(t, m.ctl.SetSteering(st))
	defer m.shutdownBGP()

	v2, err := control.Parse([]byte("version: 2\nbgp:\n  asn: 65010\n  router_id: 198.18.0.10\n  listen_port: 0\n"))
	require.NoError(t, err)
	st.fail = errors.New("steering refused (test)")
	before := runtime.NumGoroutine()
	for range 20 {
		require.ErrorIs(t, m.apply(ctx, v2), st.fail)
	}
	time.Sleep(100 * time.Millisecond) // let stopped speakers' goroutines end
	require.LessOrEqual(t, runtime.NumGoroutine()-before, 4, "goroutines left by 20 refused tries (one GoBGP server: a few)")
	st.fail = nil
	require.NoError(t, m.apply(ctx, v2))
	require.NotNil(t, m.announcer)
	require.Nil(t, m.unstarted, "the kept speaker runs now")
}

// newIdleMux returns a Mux without a data path (interface "unused") whose
// config file holds "version: 1", applied as Run applies its first
// document: for tests that drive apply themselves.
func newIdleMux(t *testing.T) *Mux {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	require.NoError(t, os.WriteFile(path, []byte("version: 1\n"), 0o600))
	m, err := New(Config{Interface: "unused", ConfigPath: path, Logger: quietLog})
	require.NoError(t, err)
	v1, err := control.Parse([]byte("version: 1\n"))
	require.NoError(t, err)
	require.NoError(t, m.apply(context.Background(), v1))
	return m
}
