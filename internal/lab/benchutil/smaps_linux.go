package benchutil

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// VMFlags returns the VmFlags of the calling process's mapping that holds
// address a, as /proc/self/smaps lists them ("hg": advised for
// transparent huge pages), and false when no mapping holds a. Tests use
// it to check that memory the data path touches at random was advised
// for huge pages (see THP for kernels without them).
func VMFlags(a uintptr) ([]string, bool, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if fs := strings.Fields(line); len(fs) >= 5 && !strings.HasSuffix(fs[0], ":") {
			// A mapping's first line: "lo-hi perms offset dev inode [path]".
			var lo, hi uintptr
			_, err := fmt.Sscanf(fs[0], "%x-%x", &lo, &hi)
			in = err == nil && lo <= a && a < hi
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.Fields(strings.TrimPrefix(line, "VmFlags:")), true, nil
		}
	}
	return nil, false, sc.Err()
}

// THP says the kernel has transparent huge pages
// (/sys/kernel/mm/transparent_hugepage exists): without them madvise
// MADV_HUGEPAGE fails and no mapping is flagged "hg", which the code
// advising it treats as a matter of speed only.
func THP() bool {
	_, err := os.Stat("/sys/kernel/mm/transparent_hugepage")
	return err == nil
}
