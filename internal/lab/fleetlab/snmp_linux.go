package fleetlab

import (
	"fmt"
	"os"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// SNMP returns the IP stack counters of namespace n (/proc/net/snmp and
// /proc/net/netstat, as nstat reads them), keyed "Proto.Name":
// "Tcp.InCsumErrors", "Udp.InCsumErrors", "Tcp.RetransSegs",
// "TcpExt.TCPDSACKRecvSegs", ...
func SNMP(n *netlab.NS) (map[string]uint64, error) {
	var snmp, netstat []byte
	err := n.Do(func() error {
		// thread-self: the namespace of this (locked) thread, not the
		// process's main thread's.
		var err error
		if snmp, err = os.ReadFile("/proc/thread-self/net/snmp"); err != nil {
			return err
		}
		netstat, err = os.ReadFile("/proc/thread-self/net/netstat")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fleetlab: %s: snmp: %w", n.Name(), err)
	}
	m, err := ParseSNMP(string(snmp))
	if err != nil {
		return nil, err
	}
	ext, err := ParseSNMP(string(netstat))
	if err != nil {
		return nil, err
	}
	for k, v := range ext {
		m[k] = v
	}
	return m, nil
}
