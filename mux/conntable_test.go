package mux

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/flow"
)

// TestConnTableFleetHash: the connection table the Mux builds for its data
// path (connTable: Run and every worker's pipeline) places keys by the
// document's flow hash, the hash the balance stage computes for a 5-tuple
// rule, so the node hashes each packet once (balance.Stage.HashesOnce), as
// the benchmark's table (muxConnTable) does; the workers share one table.
func TestConnTableFleetHash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	require.NoError(t, os.WriteFile(path, []byte("version: 0\n"), 0o644))
	m, err := New(Config{Interface: "uplink0", ConfigPath: path, SourceV4: benchMuxSrc,
		Conns: flow.ConnTableConfig{Capacity: 4096}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.Nil(t, m.Conns(), "the table is built with the data path, once the seed is known")
	doc := benchDocument(t)
	require.NoError(t, m.ctl.Apply(doc))

	for range 2 { // two workers
		_, err := m.pipeline(doc.HashSeed, benchUplink, benchHops, 2)
		require.NoError(t, err)
	}
	conns := m.Conns()
	require.NotNil(t, conns)
	require.NotNil(t, conns.Hasher(), "the Mux's table hashes keys with a hash of its own")
	require.Equal(t, doc.HashSeed, conns.Hasher().Seed())
	require.Equal(t, 4096, conns.Config().Capacity, "Config.Conns")
	again, err := m.connTable(doc.HashSeed + 1)
	require.NoError(t, err)
	require.Same(t, conns, again, "one table for every worker")
	require.Len(t, m.balancers, 2)
	for i, b := range m.balancers {
		require.True(t, b.HashesOnce(), "worker %d's balance stage hashes each packet twice", i)
	}

	// The benchmark's Mux: the same construction, the same property.
	bench := muxConnTable(t, 1000)
	require.NotNil(t, bench.Hasher())
	require.Equal(t, doc.HashSeed, bench.Hasher().Seed())
	var once int
	for _, s := range ourMuxStages(t, doc, bench) {
		if f, ok := s.(*fused); ok {
			require.True(t, f.bal.HashesOnce(), "the benchmark's balance stage hashes each packet twice")
			once++
		}
	}
	require.Equal(t, 1, once)

	// A bad table configuration is refused by New, before any document.
	_, err = New(Config{Interface: "uplink0", ConfigPath: path, Conns: flow.ConnTableConfig{Capacity: -1}})
	require.ErrorIs(t, err, flow.ErrConnTableConfig)
}
