package pktrate

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Load is an offered load: PPS packets per second, or as fast as the
// generator can send when PPS is 0 ("max").
type Load struct {
	PPS float64
}

// Max is the load "as fast as the generator can send".
var Max = Load{}

// IsMax reports whether l is "max".
func (l Load) IsMax() bool { return l.PPS == 0 }

// String returns "max" or the rate with a k/M suffix ("10k", "1.5M").
func (l Load) String() string {
	if l.IsMax() {
		return "max"
	}
	return FormatRate(l.PPS)
}

// FormatRate writes a packet rate compactly: 950, 10k, 1.5M.
func FormatRate(pps float64) string {
	switch {
	case pps >= 1e6:
		return strconv.FormatFloat(pps/1e6, 'f', -1, 64) + "M"
	case pps >= 1e3:
		return strconv.FormatFloat(pps/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(pps, 'f', -1, 64)
}

// ParseLoad parses "max" or a positive rate in packets per second with an
// optional k or M suffix ("10000", "10k", "1.5M").
func ParseLoad(s string) (Load, error) {
	if strings.EqualFold(s, "max") {
		return Max, nil
	}
	v, err := parseCount(s)
	if err != nil || v <= 0 {
		return Load{}, fmt.Errorf("pktrate: load %q: want \"max\" or a positive rate like 10k", s)
	}
	return Load{PPS: v}, nil
}

// ParseCount parses a positive whole count with an optional k (1000) or M
// (1000000) suffix, as in flow counts: "1", "1k", "1M".
func ParseCount(s string) (int, error) {
	v, err := parseCount(s)
	if err != nil || v < 1 || v != math.Trunc(v) || v > math.MaxInt32 {
		return 0, fmt.Errorf("pktrate: count %q: want a whole number like 1, 1k or 1M", s)
	}
	return int(v), nil
}

func parseCount(s string) (float64, error) {
	mult := 1.0
	switch {
	case strings.HasSuffix(s, "k") || strings.HasSuffix(s, "K"):
		mult, s = 1e3, s[:len(s)-1]
	case strings.HasSuffix(s, "M"):
		mult, s = 1e6, s[:len(s)-1]
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("bad number %q", s)
	}
	return math.Round(v*mult*1e6) / 1e6, nil
}

// Point is one measured configuration.
type Point struct {
	DUT   string
	Size  int
	Flows int
	Load  Load
}

// Result is a point's trials and their medians.
type Result struct {
	Point
	Samples []Sample
	Summary Summary
}

// Sample is what one trial of one DUT at one point measured.
//
// Window counts are taken over the measurement window (after the warm-up,
// while the generator runs); Sent, Received and Drops over the whole
// trial, warm-up included, after the generator stopped and the path
// drained, so Loss compares like with like.
type Sample struct {
	// Window is the measurement window's length.
	Window time.Duration
	// WindowSent is what the generator's kernel took during the window;
	// WindowReceived what the sink counted in it; WindowEgressDrops what
	// the DUT's egress veth could not hand to the sink in it.
	WindowSent, WindowReceived, WindowEgressDrops uint64
	// Sent and Received cover the whole trial.
	Sent, Received uint64
	// WrongMAC counts test frames the sink saw with a destination MAC that
	// is not its own (a DUT that forgot to rewrite MACs); never expected.
	WrongMAC uint64
	// WrongKind counts test frames of the kind the DUT does not deliver
	// (plain frames from a Mux that should have encapsulated them, or
	// VXLAN from a forwarder); never expected. Not in Received.
	WrongKind uint64
	// DUTCPU is the CPU time the DUT used in the window: its ingress NAPI
	// threads plus its processes (with NAPISoftirq: the machine's softirq
	// time plus its processes).
	DUTCPU time.Duration
	// GenCPU and SinkCPU are the generator thread's and the sink NAPI
	// thread's CPU time in the window: near Window means that side, not the
	// DUT, limited the rate.
	GenCPU, SinkCPU time.Duration
	// Busy counts the generator's sendto calls that the kernel refused
	// for the moment (EAGAIN and the like: the first veth pushed back).
	Busy uint64
	// Drops are the veths' drop counters over the trial: where lost
	// frames went.
	Drops Drops
	// FastPath, for a DUT whose Instance is a FastPathReader (the Mux),
	// is what its fast path counted in the window: the hits, misses and
	// naps read at the window's end minus those read at its start. Nil
	// for other DUTs.
	FastPath *FastPathCounts
}

// Drops are veth drop counters over one trial (the kernel's tx_dropped or
// rx_dropped of each interface of the path).
type Drops struct {
	// GenTX: the generator's veth could not queue the frame to the DUT
	// (the DUT's ingress ring was full). DUTInRX: the DUT's ingress veth
	// dropped it (XDP_DROP, a failed redirect such as a full AF_XDP ring).
	// Both are the DUT not taking the frame.
	GenTX, DUTInRX uint64
	// DUTOutTX: the DUT's egress veth could not hand the frame to the
	// sink (the sink's ring was full): the DUT forwarded it, the sink did
	// not keep up. SinkRX: the sink veth's receive drops (for a
	// redirected frame the same drop as DUTOutTX, counted again).
	DUTOutTX, SinkRX uint64
}

// OfferedPPS is the rate the generator achieved in the window.
func (s Sample) OfferedPPS() float64 { return perSecond(s.WindowSent, s.Window) }

// DeliveredPPS is the rate the sink counted in the window.
func (s Sample) DeliveredPPS() float64 { return perSecond(s.WindowReceived, s.Window) }

// ForwardedPPS is the rate the DUT put on its egress veth in the window:
// what the sink counted plus what the egress veth dropped because the sink
// was behind. Both are read at the egress, not claimed by the sender; the
// difference from DeliveredPPS shows when the sink, not the DUT, was the
// limit.
func (s Sample) ForwardedPPS() float64 {
	return perSecond(s.WindowReceived+s.WindowEgressDrops, s.Window)
}

// Loss is the fraction of the trial's sent frames that never reached the
// sink (0 when nothing was sent; never negative).
func (s Sample) Loss() float64 { return s.fraction(sat(s.Sent, s.Received)) }

// IngressLoss is the fraction of the trial's sent frames the DUT did not
// take (Drops.GenTX + Drops.DUTInRX).
func (s Sample) IngressLoss() float64 { return s.fraction(s.Drops.GenTX + s.Drops.DUTInRX) }

// EgressLoss is the fraction of the trial's sent frames the DUT forwarded
// but the sink had no room for (Drops.DUTOutTX).
func (s Sample) EgressLoss() float64 { return s.fraction(s.Drops.DUTOutTX) }

func (s Sample) fraction(n uint64) float64 {
	if s.Sent == 0 {
		return 0
	}
	return min(1, float64(n)/float64(s.Sent))
}

// sat returns a-b, or 0 when b > a.
func sat(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// CPUPerPacket is the DUT's CPU time per forwarded packet in the window.
func (s Sample) CPUPerPacket() time.Duration {
	n := s.WindowReceived + s.WindowEgressDrops
	if n == 0 {
		return 0
	}
	return time.Duration(float64(s.DUTCPU) / float64(n))
}

// Utilisation returns cpu as a fraction of the window (1 = one core busy).
func (s Sample) Utilisation(cpu time.Duration) float64 {
	if s.Window <= 0 {
		return 0
	}
	return float64(cpu) / float64(s.Window)
}

func perSecond(n uint64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// Summary is the median over a point's trials of each figure, with the
// spread of the delivered rate.
type Summary struct {
	Trials                     int
	OfferedPPS, DeliveredPPS   float64
	MinDelivered, MaxDelivered float64
	ForwardedPPS               float64
	Loss                       float64
	IngressLoss, EgressLoss    float64
	CPUPerPacket               time.Duration
	DUTUtil, GenUtil, SinkUtil float64
	// WrongMAC and WrongKind are totals over all trials (should be 0).
	WrongMAC, WrongKind uint64
	// FastPath is the medians of the trials' fast-path counters, nil
	// when no trial read them (every DUT but the Mux).
	FastPath *FastPathSummary
}

// Summarize takes the median of every figure over samples. Each figure's
// median is taken on its own, so the summary need not be one trial.
func Summarize(samples []Sample) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	pick := func(f func(Sample) float64) []float64 {
		v := make([]float64, len(samples))
		for i, s := range samples {
			v[i] = f(s)
		}
		return v
	}
	delivered := pick(Sample.DeliveredPPS)
	sum := Summary{
		Trials:       len(samples),
		OfferedPPS:   Median(pick(Sample.OfferedPPS)),
		DeliveredPPS: Median(delivered),
		MinDelivered: slices.Min(delivered),
		MaxDelivered: slices.Max(delivered),
		ForwardedPPS: Median(pick(Sample.ForwardedPPS)),
		Loss:         Median(pick(Sample.Loss)),
		IngressLoss:  Median(pick(Sample.IngressLoss)),
		EgressLoss:   Median(pick(Sample.EgressLoss)),
		CPUPerPacket: time.Duration(Median(pick(func(s Sample) float64 { return float64(s.CPUPerPacket()) }))),
		DUTUtil:      Median(pick(func(s Sample) float64 { return s.Utilisation(s.DUTCPU) })),
		GenUtil:      Median(pick(func(s Sample) float64 { return s.Utilisation(s.GenCPU) })),
		SinkUtil:     Median(pick(func(s Sample) float64 { return s.Utilisation(s.SinkCPU) })),
		FastPath:     summarizeFastPath(samples),
	}
	for _, s := range samples {
		sum.WrongMAC += s.WrongMAC
		sum.WrongKind += s.WrongKind
	}
	return sum
}

// Median returns the median of v (the mean of the middle two for an even
// count; 0 for none). v is not modified.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}
