package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/netlab"
)

// TestLabRuns builds the lab and runs it briefly, as a user would: it
// must exit 0 with every request answered, every DIP serving and nothing
// left behind.
func TestLabRuns(t *testing.T) {
	netlab.RequireRoot(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "lab")
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	out, err = exec.Command(bin, "-duration", "2s", "-conns", "8").CombinedOutput()
	t.Logf("lab output:\n%s", out)
	require.NoError(t, err)
	require.Regexp(t, `HTTP: [1-9][0-9]* requests .* 0 errors`, string(out))
	for _, vm := range vms {
		m := regexp.MustCompile(vm.name + ` ` + regexp.QuoteMeta(vm.addr) + `\s+host\d\s+\d+\s+[\d.]+%\s+(\d+)`).FindStringSubmatch(string(out))
		require.NotNil(t, m, "%s in the report", vm.name)
		n, _ := strconv.Atoi(m[1])
		require.Positive(t, n, "%s served connections", vm.name)
	}
	require.Empty(t, netlab.Leftovers(labPrefix), "namespaces left behind")
}
