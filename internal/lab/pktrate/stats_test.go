package pktrate

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMedian(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want float64
	}{
		{"empty", nil, 0},
		{"one", []float64{7}, 7},
		{"odd unsorted", []float64{5, 1, 3}, 3},
		{"even: mean of the middle two", []float64{4, 1, 3, 2}, 2.5},
		{"outlier does not move it", []float64{1, 2, 3, 4, 1e9}, 3},
		{"duplicates", []float64{2, 2, 1, 2}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]float64(nil), tt.in...)
			assert.Equal(t, tt.want, Median(in))
			assert.Equal(t, tt.in, in, "Median must not reorder its input")
		})
	}
}

func TestSampleFigures(t *testing.T) {
	s := Sample{
		Window: 2 * time.Second, WindowSent: 2_000_000, WindowReceived: 1_000_000,
		Sent: 3_000_000, Received: 2_400_000,
		DUTCPU: 500 * time.Millisecond, GenCPU: 2 * time.Second,
	}
	assert.Equal(t, 1e6, s.OfferedPPS())
	assert.Equal(t, 5e5, s.DeliveredPPS())
	assert.InDelta(t, 0.2, s.Loss(), 1e-12)
	assert.Equal(t, 500*time.Nanosecond, s.CPUPerPacket())
	assert.Equal(t, 0.25, s.Utilisation(s.DUTCPU))
	assert.Equal(t, 1.0, s.Utilisation(s.GenCPU))

	var zero Sample
	assert.Zero(t, zero.OfferedPPS())
	assert.Zero(t, zero.Loss())
	assert.Zero(t, zero.CPUPerPacket())
	assert.Zero(t, zero.Utilisation(time.Second))

	more := Sample{Sent: 10, Received: 12} // never a negative loss
	assert.Zero(t, more.Loss())

	split := Sample{
		Window: time.Second, WindowReceived: 600, WindowEgressDrops: 200, DUTCPU: 800 * time.Microsecond,
		Sent: 1000, Received: 600, Drops: Drops{GenTX: 100, DUTInRX: 50, DUTOutTX: 200, SinkRX: 200},
	}
	assert.Equal(t, 600.0, split.DeliveredPPS())
	assert.Equal(t, 800.0, split.ForwardedPPS())
	assert.InDelta(t, 0.4, split.Loss(), 1e-12)
	assert.InDelta(t, 0.15, split.IngressLoss(), 1e-12)
	assert.InDelta(t, 0.2, split.EgressLoss(), 1e-12)
	assert.Equal(t, time.Microsecond, split.CPUPerPacket(), "per forwarded packet")
}

func TestSummarize(t *testing.T) {
	mk := func(recv uint64, dutCPU time.Duration, sent, got uint64, wrong uint64) Sample {
		return Sample{
			Window: time.Second, WindowSent: recv, WindowReceived: recv,
			Sent: sent, Received: got, DUTCPU: dutCPU, WrongMAC: wrong,
		}
	}
	samples := []Sample{
		mk(300, 300*time.Microsecond, 100, 100, 0), // 1 µs/pkt, no loss
		mk(100, 300*time.Microsecond, 100, 90, 1),  // 3 µs/pkt, 10% loss
		mk(200, 400*time.Microsecond, 100, 99, 2),  // 2 µs/pkt, 1% loss
	}
	s := Summarize(samples)
	assert.Equal(t, 3, s.Trials)
	assert.Equal(t, 200.0, s.DeliveredPPS)
	assert.Equal(t, 100.0, s.MinDelivered)
	assert.Equal(t, 300.0, s.MaxDelivered)
	assert.InDelta(t, 0.01, s.Loss, 1e-12)
	assert.Equal(t, 2*time.Microsecond, s.CPUPerPacket)
	assert.Equal(t, uint64(3), s.WrongMAC)
	assert.Equal(t, uint64(0), s.WrongKind)

	assert.Equal(t, Summary{}, Summarize(nil))
}

func TestParseLoad(t *testing.T) {
	tests := []struct {
		in   string
		want Load
		ok   bool
	}{
		{"max", Max, true},
		{"MAX", Max, true},
		{"10000", Load{PPS: 10000}, true},
		{"10k", Load{PPS: 10000}, true},
		{"1.5M", Load{PPS: 1.5e6}, true},
		{"250K", Load{PPS: 250000}, true},
		{"0", Load{}, false},
		{"-5k", Load{}, false},
		{"fast", Load{}, false},
		{"", Load{}, false},
		{"NaN", Load{}, false},
		{"Infk", Load{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseLoad(tt.in)
			if !tt.ok {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseCount(t *testing.T) {
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"1", 1, true},
		{"1k", 1000, true},
		{"1M", 1_000_000, true},
		{"2.5k", 2500, true},
		{"0", 0, false},
		{"1.5", 0, false},
		{"x", 0, false},
		{"3000M", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseCount(tt.in)
			if !tt.ok {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// FuzzParseLoad: whatever parses is max or a finite positive rate, and its
// String form parses back to the same load.
func FuzzParseLoad(f *testing.F) {
	for _, s := range []string{"max", "10k", "1.5M", "100", "0.001", "1e3", "-1", "k", "M", "1e400"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLoad(s)
		if err != nil {
			return
		}
		if !l.IsMax() && (l.PPS <= 0 || math.IsInf(l.PPS, 0) || math.IsNaN(l.PPS)) {
			t.Fatalf("%q parsed to %v", s, l.PPS)
		}
		back, err := ParseLoad(l.String())
		if err != nil {
			t.Fatalf("%q -> %q does not parse: %v", s, l.String(), err)
		}
		if back != l && math.Abs(back.PPS-l.PPS) > 1e-6*l.PPS {
			t.Fatalf("%q -> %v -> %v", s, l, back)
		}
	})
}

func TestWriteTable(t *testing.T) {
	p := Point{Size: 64, Flows: 1000, Load: Max}
	results := []Result{
		{Point: withDUT(p, "xdp-redirect"), Summary: Summary{Trials: 3, OfferedPPS: 2e6, DeliveredPPS: 2e6, MinDelivered: 1.9e6, MaxDelivered: 2.1e6, ForwardedPPS: 2e6, CPUPerPacket: 250 * time.Nanosecond, DUTUtil: 0.5, GenUtil: 1, SinkUtil: 0.2}},
		{Point: withDUT(p, "kernel"), Summary: Summary{Trials: 3, OfferedPPS: 2e6, DeliveredPPS: 1e6, MinDelivered: 1e6, MaxDelivered: 1e6, ForwardedPPS: 1.1e6, Loss: 0.5, IngressLoss: 0.45, EgressLoss: 0.05, CPUPerPacket: time.Microsecond, DUTUtil: 1}},
		{Point: withDUT(p, "broken"), Summary: Summary{Trials: 3, OfferedPPS: 2e6, WrongMAC: 7}},
		{Point: withDUT(p, "unencapsulated"), Summary: Summary{Trials: 3, OfferedPPS: 2e6, WrongKind: 9}},
	}
	var b bytes.Buffer
	require.NoError(t, WriteTable(&b, results))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 6)
	assert.Contains(t, lines[0], "| fwd vs xdp-redirect |")
	assert.Equal(t, "| xdp-redirect | 64 | 1k | max | 2.000 | 2.000 (1.900–2.100) | 2.000 | 1.00 | 0 | 250 | 0.50 | 1.00 | 0.20 |", lines[2])
	assert.Equal(t, "| kernel | 64 | 1k | max | 2.000 | 1.000 (1.000–1.000) | 1.100 | 0.55 | 50.00% (45.00% / 5.00%) | 1000 | 1.00 | 0.00 | 0.00 |", lines[3])
	assert.Contains(t, lines[4], "broken (7 wrong MAC!)")
	assert.Contains(t, lines[5], "unencapsulated (9 of the wrong kind!)")
}

func withDUT(p Point, name string) Point {
	p.DUT = name
	return p
}
