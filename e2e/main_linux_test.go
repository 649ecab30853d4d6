package e2e

import (
	"os"
	"testing"

	"github.com/xdplb/xdplb/internal/lab/fleetlab/fleetlabtest"
)

// TestMain removes the example binaries the tests built
// (fleetlabtest.Examples).
func TestMain(m *testing.M) { os.Exit(fleetlabtest.Main(m)) }
