//go:build linux

package afxdp_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
)

// TestOpenAllQueues opens one port per RX queue of a two-queue veth, runs
// one reflecting worker per port, and echoes datagrams from many sockets,
// which the peer's stack spreads over its TX queues (a veth's TX queue i
// feeds its peer's RX queue i).
func TestOpenAllQueues(t *testing.T) {
	const queues = 2
	r := newRig(t, queues)
	prog := redirectAll(t, r.lbLink, queues)

	var n int
	require.NoError(t, r.lb.Do(func() (err error) {
		n, err = afxdp.QueueCount("xdp0")
		return err
	}))
	require.Equal(t, queues, n)

	var ports []*afxdp.Port
	require.NoError(t, r.lb.Do(func() (err error) {
		ports, err = afxdp.OpenAll(afxdp.Config{Interface: "xdp0", Name: "up"})
		return err
	}))
	require.Len(t, ports, queues)
	var workers []*engine.Worker
	for q, p := range ports {
		t.Cleanup(func() { p.Close() })
		require.Equal(t, q, p.Queue())
		require.Equal(t, "up:"+string(rune('0'+q)), p.Name())
		require.NoError(t, prog.Register(q, p.FD()))
		w, err := engine.NewWorker(engine.WorkerConfig{
			ID:     q,
			Ports:  []engine.Port{p},
			Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(reflect)}},
		})
		require.NoError(t, err)
		workers = append(workers, w)
	}
	eng, err := engine.New(workers...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx) }()

	const sockets, perSocket = 16, 200
	for i := 0; i < sockets; i++ {
		conn, err := r.peer.ListenPacket(context.Background(), "udp4", peerAddr+":0")
		require.NoError(t, err)
		got := echoTraffic(t, conn, netip.MustParseAddrPort(lbAddr+":9000"), perSocket, 64, 100)
		conn.Close()
		require.Equal(t, perSocket, got, "socket %d", i)
	}
	cancel()
	require.NoError(t, <-done)

	var total uint64
	for _, p := range ports {
		drain(p)
		requireNoLeak(t, p)
		st, err := p.Stats()
		require.NoError(t, err)
		t.Logf("%s: rx %d tx %d", p.Name(), st.RXFrames, st.TXFrames)
		// 16 sockets with random flow hashes all on one queue: 2^-15.
		require.NotZero(t, st.TXFrames, "queue %d got no traffic", p.Queue())
		total += st.TXFrames
	}
	require.EqualValues(t, sockets*perSocket, total)
	require.EqualValues(t, sockets*perSocket, eng.Stats().TX)
}

// TestQueueCountUnknown reports a missing interface.
func TestQueueCountUnknown(t *testing.T) {
	_, err := afxdp.QueueCount("nonexistent0")
	require.Error(t, err)
	_, err = afxdp.QueueCount("")
	require.Error(t, err)
}
