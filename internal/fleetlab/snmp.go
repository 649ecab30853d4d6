package fleetlab

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ParseSNMP reads the kernel's protocol counters in the format of
// /proc/net/snmp (pairs of lines: "Tcp: Name1 Name2 ..." then "Tcp: v1
// v2 ...") and returns them keyed "Tcp.Name1", as nstat names them
// without the protocol's prefix glued on ("TcpInCsumErrors" is
// "Tcp.InCsumErrors").
func ParseSNMP(r io.Reader) (map[string]int64, error) {
	out := map[string]int64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var proto string
	var names []string
	for sc.Scan() {
		p, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if names == nil || p != proto {
			proto, names = p, fields
			continue
		}
		if len(fields) != len(names) {
			return nil, fmt.Errorf("snmp: %s: %d values for %d names", p, len(fields), len(names))
		}
		for i, f := range fields {
			v, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("snmp: %s.%s: %w", p, names[i], err)
			}
			out[p+"."+names[i]] = v
		}
		names = nil
	}
	return out, sc.Err()
}
