package fleetlab

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSNMP reads the pairs of lines of /proc/net/snmp: "Proto: names..."
// then "Proto: values...".
func ParseSNMP(text string) (map[string]uint64, error) {
	m := map[string]uint64{}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) != len(values) || len(names) == 0 || names[0] != values[0] {
			return nil, fmt.Errorf("fleetlab: snmp: unexpected lines %q / %q", lines[i], lines[i+1])
		}
		proto := strings.TrimSuffix(names[0], ":")
		for k := 1; k < len(names); k++ {
			v, err := strconv.ParseInt(values[k], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("fleetlab: snmp: %s.%s: %w", proto, names[k], err)
			}
			m[proto+"."+names[k]] = uint64(v) // MaxConn is -1: kept as its bits
		}
	}
	return m, nil
}
