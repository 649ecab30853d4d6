package mux

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The Mux's data path hashes flows with the hash_seed of the document it
// started with: its connection table places keys by it and every
// pipeline's balance stage picks backends by it (Mux.connTable). A reload
// that changes hash_seed cannot be run without a restart, so it is
// refused whole, as a BGP change that needs a restart is: reported as
// applied, the node would claim a version whose flows it does not place
// as the other Muxes running it do. A later version with the running
// seed applies.
func TestReloadChangingHashSeedIsRefused(t *testing.T) {
	tests := []struct {
		name       string
		from, to   string // hash_seed lines of versions 1 and 2
		wantRefuse bool
	}{
		{"seed changed", "hash_seed: 0x1\n", "hash_seed: 0x2\n", true},
		{"seed set", "", "hash_seed: 0x2\n", true},
		{"seed removed", "hash_seed: 0x1\n", "", true},
		{"seed kept", "hash_seed: 0x1\n", "hash_seed: 0x1\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fleet.yaml")
			write := func(version int, seed string) {
				t.Helper()
				doc := "version: " + strconv.Itoa(version) + "\n" + seed
				require.NoError(t, os.WriteFile(path+".tmp", []byte(doc), 0o600))
				require.NoError(t, os.Rename(path+".tmp", path))
			}
			write(1, tt.from)
			m, err := New(Config{Interface: "unused", ConfigPath: path, Logger: quietLog})
			require.NoError(t, err)
			defer watchFile(m)()
			// What Run does once the first document is applied.
			_, err = m.connTable(m.ctl.Document().HashSeed)
			require.NoError(t, err)

			st := m.Status()
			write(2, tt.to)
			deadline := time.Now().Add(10 * time.Second) // hang guard
			m.Reload()
			for m.Status().Rejected == st.Rejected && m.Status().Version == st.Version {
				require.False(t, time.Now().After(deadline), "nothing happened: status %+v", m.Status())
				time.Sleep(10 * time.Millisecond)
			}
			if !tt.wantRefuse {
				require.EqualValues(t, 2, m.Status().Version)
				require.EqualValues(t, 2, m.ctl.Document().Version)
				return
			}
			require.EqualValues(t, 1, m.Status().Version, "a version whose flows the data path would not hash by its seed")
			require.EqualValues(t, 1, m.ctl.Document().Version, "the controller keeps the running document")
			require.ErrorIs(t, m.Status().LastError, ErrRestartRequired)
		})
	}
}
