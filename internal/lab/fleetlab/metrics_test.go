package fleetlab_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

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
