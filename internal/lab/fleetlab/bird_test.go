package fleetlab_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

// TestBIRDConfigParses has BIRD itself check the configurations (bird -p
// parses and exits; no root needed). It skips without BIRD.
func TestBIRDConfigParses(t *testing.T) {
	if err := fleetlab.HaveBIRD(); err != nil {
		t.Skip(err)
	}
	for _, ipv6 := range []bool{false, true} {
		c := fleetlab.FleetBIRD()
		c.IPv6 = ipv6
		text := c.Text()
		require.Equal(t, ipv6, strings.Contains(text, "kernel6"))
		require.Contains(t, text, "protocol bgp mux2 from mux { neighbor 198.18.2.2 as 65010; }")
		conf := filepath.Join(t.TempDir(), "bird.conf")
		require.NoError(t, os.WriteFile(conf, []byte(text), 0o644))
		out, err := exec.Command("bird", "-p", "-c", conf).CombinedOutput()
		require.NoError(t, err, "bird -p: %s\n%s", out, text)
	}
}
