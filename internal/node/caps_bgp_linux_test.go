package node

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMuxCapsStartBGP: a Mux that has dropped to MuxCaps can still start
// its BGP speaker on port 179, which it does when a document after the
// first one is the first with a bgp section. Before, MuxCaps left out
// CAP_NET_BIND_SERVICE: the speaker's listener was refused ("bind:
// permission denied"), the version was refused and retried for ever, and
// the Mux never announced a VIP.
func TestMuxCapsStartBGP(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: drops capabilities in a network namespace of its own")
	}
	dir := t.TempDir()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	// Without cgo: a cgo binary cannot drop capabilities (ErrCgo).
	build := exec.Command(goBin, "build", "-o", dir+string(filepath.Separator), "./testdata/bgpafterdrop")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	cmd := exec.Command(filepath.Join(dir, "bgpafterdrop"))
	// Its own network namespace: port 179 is free there, and nothing it
	// opens is seen outside.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
}
