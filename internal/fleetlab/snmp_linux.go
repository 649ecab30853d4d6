package fleetlab

import (
	"bytes"
	"os"

	"github.com/xdplb/xdplb/internal/netlab"
)

// SNMP returns the kernel's protocol counters in namespace n
// (/proc/net/snmp there, ParseSNMP), e.g. "Tcp.InCsumErrors",
// "Udp.InCsumErrors", "Tcp.OutSegs".
func SNMP(n *netlab.NS) (map[string]int64, error) {
	var b []byte
	// /proc/net is the namespace of the reading process's main thread;
	// /proc/thread-self/net is the calling thread's, the one n.Do moved.
	err := n.Do(func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
	if err != nil {
		return nil, err
	}
	return ParseSNMP(bytes.NewReader(b))
}
