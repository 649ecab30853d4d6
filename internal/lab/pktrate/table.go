package pktrate

import (
	"fmt"
	"io"
	"strings"
)

// WriteTable writes results as a Markdown table, one row per DUT and
// point, with every figure a median over the trials:
//
//   - offered: the rate the generator achieved (Mpps)
//   - delivered: the rate the sink counted (Mpps), min–max over trials
//   - forwarded: delivered plus what the DUT's egress veth dropped because
//     the sink was behind (Mpps); above delivered means the sink limited
//   - fwd vs <ref>: forwarded relative to the first DUT at the same point
//   - loss: frames sent but never counted by the sink, over the trial,
//     and how much of it the DUT did not take (in) or the sink had no
//     room for (out)
//   - DUT ns/pkt: the DUT's CPU time per forwarded packet
//   - DUT, gen, sink CPU: CPU time over the window (1.00 = one core)
//
// Rows whose trials saw frames with a wrong destination MAC, or of the
// wrong kind (plain instead of VXLAN or the reverse), are marked.
//
// When some rows have fast-path counters (Summary.FastPath: the Mux), a
// list under the table gives, for each of them, the median share of the
// fast path's lookups in the window that hit, the median lookups and the
// median naps; the table itself is the same with or without them.
func WriteTable(w io.Writer, results []Result) error {
	ref := map[Point]float64{}
	refName := ""
	for _, r := range results {
		p := r.Point
		p.DUT = ""
		if _, ok := ref[p]; !ok {
			ref[p] = r.Summary.ForwardedPPS
			if refName == "" {
				refName = r.DUT
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| DUT | frame | flows | load | offered Mpps | delivered Mpps (min–max) | forwarded Mpps | fwd vs %s | loss (in / out) | DUT ns/pkt | DUT CPU | gen CPU | sink CPU |\n", refName)
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range results {
		s := r.Summary
		p := r.Point
		p.DUT = ""
		ratio := "–"
		if base := ref[p]; base > 0 {
			ratio = fmt.Sprintf("%.2f", s.ForwardedPPS/base)
		}
		name := r.DUT
		if s.WrongMAC > 0 {
			name += fmt.Sprintf(" (%d wrong MAC!)", s.WrongMAC)
		}
		if s.WrongKind > 0 {
			name += fmt.Sprintf(" (%d of the wrong kind!)", s.WrongKind)
		}
		loss := formatLoss(s.Loss)
		if s.Loss > 0 {
			loss += " (" + formatLoss(s.IngressLoss) + " / " + formatLoss(s.EgressLoss) + ")"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %.3f | %.3f (%.3f–%.3f) | %.3f | %s | %s | %s | %.2f | %.2f | %.2f |\n",
			name, r.Size, formatCount(r.Flows), r.Load,
			s.OfferedPPS/1e6, s.DeliveredPPS/1e6, s.MinDelivered/1e6, s.MaxDelivered/1e6, s.ForwardedPPS/1e6,
			ratio, loss, formatNs(s), s.DUTUtil, s.GenUtil, s.SinkUtil)
	}
	writeFastPath(&b, results)
	_, err := io.WriteString(w, b.String())
	return err
}

func formatCount(n int) string {
	switch {
	case n >= 1e6 && n%1e6 == 0:
		return fmt.Sprintf("%dM", n/1e6)
	case n >= 1e3 && n%1e3 == 0:
		return fmt.Sprintf("%dk", n/1e3)
	}
	return fmt.Sprint(n)
}

func formatLoss(l float64) string {
	switch {
	case l == 0:
		return "0"
	case l < 0.0001:
		return "<0.01%"
	}
	return fmt.Sprintf("%.2f%%", l*100)
}

func formatNs(s Summary) string {
	if s.CPUPerPacket == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", float64(s.CPUPerPacket.Nanoseconds()))
}

// writeFastPath writes the list of the rows with fast-path counters, if
// any, after a blank line.
func writeFastPath(b *strings.Builder, results []Result) {
	header := false
	for _, r := range results {
		f := r.Summary.FastPath
		if f == nil {
			continue
		}
		if !header {
			b.WriteString("\nFast path (medians over the trials; hits: share of the lookups in the window that hit):\n\n")
			header = true
		}
		trials := ""
		if f.Trials != r.Summary.Trials {
			trials = fmt.Sprintf(" (%d of %d trials)", f.Trials, r.Summary.Trials)
		}
		fmt.Fprintf(b, "- %s, %d B, %s flows, load %s: %s hits, %s lookups, %s naps%s\n",
			r.DUT, r.Size, formatCount(r.Flows), r.Load, formatShare(f.HitShare), formatAmount(f.Lookups), formatAmount(f.Naps), trials)
	}
}

// formatShare writes a share as a percentage, never rounding a share
// short of 1 up to 100% or one above 0 down to 0%.
func formatShare(v float64) string {
	switch {
	case v >= 1:
		return "100%"
	case v <= 0:
		return "0%"
	case v > 0.9999:
		return ">99.99%"
	case v < 0.0001:
		return "<0.01%"
	}
	return fmt.Sprintf("%.2f%%", v*100)
}

// formatAmount writes a count compactly: 950, 12.3k, 2.41M.
func formatAmount(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}
