package fleetlab_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

func TestParseMetrics(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]float64
		err      bool
	}{
		{"empty", "", map[string]float64{}, false},
		{"samples and comments", "# HELP x y\n# TYPE x counter\n" +
			`xdplb_packets_total{direction="rx"} 12` + "\n" +
			"xdplb_datapath_up 1\n\nxdplb_nat_table_entries 3.5e+06\n",
			map[string]float64{`xdplb_packets_total{direction="rx"}`: 12, "xdplb_datapath_up": 1, "xdplb_nat_table_entries": 3.5e6}, false},
		{"label value with a blank", `m{l="a b"} 2` + "\n", map[string]float64{`m{l="a b"}`: 2}, false},
		{"no value", "lonely\n", nil, true},
		{"bad value", "m x\n", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fleetlab.ParseMetrics(strings.NewReader(tc.in))
			if tc.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestPoll(t *testing.T) {
	n := 0
	require.NoError(t, fleetlab.Poll(context.Background(), "three calls", time.Minute, func() bool { n++; return n == 3 }))
	require.Equal(t, 3, n)

	err := fleetlab.Poll(context.Background(), "never", 0, func() bool { return false })
	require.ErrorContains(t, err, "gave up waiting for never")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = fleetlab.Poll(ctx, "never", time.Minute, func() bool { return false })
	require.True(t, errors.Is(err, context.Canceled), "%v", err)
}

func TestLockedBuffer(t *testing.T) {
	var b fleetlab.LockedBuffer
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				b.Write([]byte("x"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	require.Len(t, b.String(), 800)
}

func TestParseSNMP(t *testing.T) {
	m, err := fleetlab.ParseSNMP("Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm MaxConn InCsumErrors\nTcp: 1 -1 3\n")
	require.NoError(t, err)
	require.EqualValues(t, 3, m["Tcp.InCsumErrors"])
	require.EqualValues(t, 64, m["Ip.DefaultTTL"])
	_, err = fleetlab.ParseSNMP("Tcp: A B\nUdp: 1 2\n")
	require.Error(t, err)
}
