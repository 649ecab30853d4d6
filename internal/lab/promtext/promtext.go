// Package promtext reads the Prometheus text exposition format as the
// labs need it: the samples a node's /metrics serves, keyed by the
// metric's name and labels as printed. fleetlab scrapes whole fleets
// with it, pktrate a Mux's fast-path counters.
package promtext

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Parse reads the sample lines of the Prometheus text format and returns
// the values keyed by the metric's name and labels as printed
// (`xdplb_packets_total{direction="rx"}`). Comments and blank lines are
// skipped; a sample line it cannot read is an error.
func Parse(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}
