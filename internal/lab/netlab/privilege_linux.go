package netlab

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
)

// SkipMessage starts the message RequireRoot skips with.
const SkipMessage = "netlab: needs root/CAP_NET_ADMIN to create network namespaces; run as root (CI does)"

// Capability bits (linux/capability.h).
const (
	capNetAdmin = 12
	capSysAdmin = 21
)

// privEnv is what RequireRoot decides from; readPrivEnv fills it from the
// running process, tests fill it by hand.
type privEnv struct {
	euid     int
	capEff   uint64 // effective capability set
	capKnown bool   // capEff was read from /proc/self/status
	netns    bool   // the kernel has network namespaces (/proc/self/ns/net)
}

// skipReason returns why tests needing namespaces cannot run in e, or ""
// when they can (and a failure to create a namespace is then a bug).
func skipReason(e privEnv) string {
	if !e.netns {
		return "kernel without network namespace support (no /proc/self/ns/net)"
	}
	if !e.capKnown {
		if e.euid == 0 {
			return ""
		}
		return fmt.Sprintf("running as uid %d", e.euid)
	}
	var missing []string
	if e.capEff&(1<<capSysAdmin) == 0 {
		missing = append(missing, "CAP_SYS_ADMIN")
	}
	if e.capEff&(1<<capNetAdmin) == 0 {
		missing = append(missing, "CAP_NET_ADMIN")
	}
	if len(missing) > 0 {
		return fmt.Sprintf("running as uid %d without %v", e.euid, missing)
	}
	return ""
}

func readPrivEnv() privEnv {
	e := privEnv{euid: os.Geteuid()}
	_, err := os.Stat("/proc/self/ns/net")
	e.netns = err == nil
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return e
	}
	e.capEff, e.capKnown = parseCapEff(b)
	return e
}

// parseCapEff finds the CapEff line of /proc/<pid>/status.
func parseCapEff(status []byte) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		v, ok := bytes.CutPrefix(sc.Bytes(), []byte("CapEff:"))
		if !ok {
			continue
		}
		c, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 16, 64)
		return c, err == nil
	}
	return 0, false
}

var (
	probeOnce sync.Once
	probeErr  error
)

// probe creates and removes one namespace, once per process.
func probe() error {
	probeOnce.Do(func() {
		l, err := NewStandalone("nlprobe")
		if err != nil {
			probeErr = err
			return
		}
		_, err = l.Namespace("probe")
		if cerr := l.Close(); err == nil {
			err = cerr
		}
		probeErr = err
	})
	return probeErr
}

// RequireRoot skips the test (with SkipMessage and the reason) unless the
// process may create network namespaces. When it has the privileges but
// creating a namespace still fails, the test fails instead: that is a broken
// environment, not a reason to skip.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if r := skipReason(readPrivEnv()); r != "" {
		tb.Skipf("%s (%s)", SkipMessage, r)
	}
	if err := probe(); err != nil {
		tb.Fatalf("netlab: privileged, but creating a network namespace failed: %v", err)
	}
}
