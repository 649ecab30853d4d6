package fleetlab

import (
	"fmt"
	"os"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// SNMP returns the IP stack counters of namespace n (/proc/net/snmp, as
// nstat reads them), keyed "Proto.Name": "Tcp.InCsumErrors",
// "Udp.InCsumErrors", "Tcp.RetransSegs", ...
func SNMP(n *netlab.NS) (map[string]uint64, error) {
	var text []byte
	err := n.Do(func() error {
		// thread-self: the namespace of this (locked) thread, not the
		// process's main thread's.
		var err error
		text, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fleetlab: %s: snmp: %w", n.Name(), err)
	}
	return ParseSNMP(string(text))
}
