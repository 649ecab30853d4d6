package datapath

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/steer"
)

func nopPipeline(Input) (*engine.Pipeline, error) { return engine.NewPipeline(), nil }

// validSpec is a Host Agent's shape: an uplink and two VM ports.
func validSpec() Spec {
	return Spec{
		Interfaces: []Interface{
			{Name: "uplink0", Steer: steer.Config{VXLAN: []steer.VXLANRule{{Local: netip.MustParseAddr("198.18.0.1")}}}},
			{Name: "vm1", DropNoSocket: true},
			{Name: "vm2", Queues: 2},
		},
		SlowPath: true,
		Pipeline: nopPipeline,
	}
}

func TestSpecValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Spec)
		want   string // "" valid; else a part of the error
	}{
		{"valid", func(*Spec) {}, ""},
		{"one interface, no slow path", func(s *Spec) { s.Interfaces, s.SlowPath = s.Interfaces[:1], false }, ""},
		{"workers up to the fewest set queues", func(s *Spec) { s.Workers = 2 }, ""},
		{"no interfaces", func(s *Spec) { s.Interfaces = nil }, "no interfaces"},
		{"empty name", func(s *Spec) { s.Interfaces[1].Name = "" }, "interfaces[1]: no name"},
		{"name too long", func(s *Spec) { s.Interfaces[0].Name = "a-very-long-name" }, "longer than 15"},
		{"name with slash", func(s *Spec) { s.Interfaces[0].Name = "eth/0" }, "'/'"},
		{"name with colon", func(s *Spec) { s.Interfaces[0].Name = "eth0:1" }, "'/'"},
		{"name with space", func(s *Spec) { s.Interfaces[0].Name = "eth 0" }, "white space"},
		{"dot", func(s *Spec) { s.Interfaces[0].Name = ".." }, "not an interface name"},
		{"duplicate", func(s *Spec) { s.Interfaces[2].Name = "uplink0" }, "interfaces[0] and [2] are both \"uplink0\""},
		{"negative queues", func(s *Spec) { s.Interfaces[1].Queues = -1 }, "negative"},
		{"negative workers", func(s *Spec) { s.Workers = -1 }, "negative"},
		{"too many workers", func(s *Spec) { s.Workers = engine.MaxWorkers + 1 }, "at most 256"},
		{"more workers than queues", func(s *Spec) { s.Workers = 3 }, "serves only 2 queues"},
		{"negative idle spins", func(s *Spec) { s.IdleSpins = -1 }, "IdleSpins"},
		{"bad steering rule", func(s *Spec) {
			s.Interfaces[1].Steer.Src = []steer.SrcRule{{}}
		}, "interfaces[1] (vm1): steering rules"},
		{"bad port template", func(s *Spec) { s.Port = afxdp.Config{FrameSize: 1000} }, "port template"},
		{"no pipeline", func(s *Spec) { s.Pipeline = nil }, "no Pipeline"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := validSpec()
			tc.change(&s)
			err := s.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidSpec)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestLayout pins the port numbering both nodes rely on: data ports in
// spec order, the slow path right after them, receive-only sockets after
// that.
func TestLayout(t *testing.T) {
	tests := []struct {
		name      string
		ifaces    []string
		slow      bool
		str       string
		wantSlow  uint16
		wantExtra int
	}{
		{"mux", []string{"eth0"}, true, "0:eth0 1:slow", 1, 2},
		{"host agent", []string{"up", "vm1", "vm2"}, true, "0:up 1:vm1 2:vm2 3:slow", 3, 4},
		{"no slow path", []string{"a", "b"}, false, "0:a 1:b", 2, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := Spec{SlowPath: tc.slow}
			for _, n := range tc.ifaces {
				s.Interfaces = append(s.Interfaces, Interface{Name: n})
			}
			l := s.Layout()
			require.Equal(t, tc.str, l.String())
			for i, n := range tc.ifaces {
				p, ok := l.Port(n)
				require.True(t, ok, n)
				require.Equal(t, uint16(i), p, n)
			}
			_, ok := l.Port("nonesuch")
			require.False(t, ok)
			slow, ok := l.Slow()
			require.Equal(t, tc.slow, ok)
			require.Equal(t, tc.wantSlow, slow)
			require.Equal(t, tc.wantExtra, l.Extra())
		})
	}
}

func TestWorkerCount(t *testing.T) {
	tests := []struct {
		queues []int
		asked  int
		want   int
		err    string
	}{
		{[]int{4}, 0, 4, ""},
		{[]int{4, 2, 8}, 0, 2, ""},
		{[]int{4, 2}, 1, 1, ""},
		{[]int{4, 2}, 3, 0, "3 workers asked, but an interface has only 2 queues"},
		{[]int{1024}, 0, engine.MaxWorkers, ""},
		{[]int{0}, 0, 0, "no RX queue"},
	}
	for _, tc := range tests {
		got, err := workerCount(tc.queues, tc.asked)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, "%v", tc)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got, "%v", tc)
	}
}

// TestExtras: every socket on a queue at or above the worker count is read
// by exactly one worker, queue % workers; the others by their own worker.
func TestExtras(t *testing.T) {
	tests := []struct {
		queues  []int
		workers int
		want    [][]socket
	}{
		{[]int{2, 2}, 2, [][]socket{nil, nil}},
		{[]int{4, 1}, 1, [][]socket{{{0, 1}, {0, 2}, {0, 3}}}},
		{[]int{2, 5, 3}, 2, [][]socket{{{1, 2}, {1, 4}, {2, 2}}, {{1, 3}}}},
	}
	for _, tc := range tests {
		got := extras(tc.queues, tc.workers)
		require.Equal(t, tc.want, got, "%v", tc.queues)
		// Each socket once: own queue (q < workers) or one extra.
		seen := map[socket]int{}
		for w := range got {
			for _, s := range got[w] {
				require.Equal(t, w, s.Queue%tc.workers)
				seen[s]++
			}
		}
		for i, n := range tc.queues {
			for q := tc.workers; q < n; q++ {
				require.Equal(t, 1, seen[socket{i, q}], "interface %d queue %d", i, q)
			}
		}
	}
}

// TestOpenInvalidSpec: Open validates before it touches the system.
func TestOpenInvalidSpec(t *testing.T) {
	s := validSpec()
	s.Interfaces[1].Name = s.Interfaces[0].Name
	dp, err := Open(s, nil)
	require.Nil(t, dp)
	require.True(t, errors.Is(err, ErrInvalidSpec), "%v", err)
	require.True(t, strings.Contains(err.Error(), "both"), "%v", err)
}
