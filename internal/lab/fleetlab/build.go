package fleetlab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Import paths of the example binaries the labs run.
const (
	MuxPackage       = "github.com/xdplb/xdplb/examples/mux"
	HostAgentPackage = "github.com/xdplb/xdplb/examples/hostagent"
	XdplbctlPackage  = "github.com/xdplb/xdplb/examples/xdplbctl"
)

// GoBuild builds the main packages pkgs (import paths, or "." for the
// current directory's) into dir, each binary named after the last element
// of its path, with the go command of the toolchain running this program
// (GOROOT/bin/go; "go" from PATH when that is missing), with cgo off.
func GoBuild(dir string, pkgs ...string) error {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	args := append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)
	cmd := exec.Command(goBin, args...)
	// Without cgo: the binaries drop capabilities on every thread
	// (internal/node.DropCapabilities), which a cgo binary cannot.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %v: %w\n%s", pkgs, err, out)
	}
	return nil
}
