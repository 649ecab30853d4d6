//go:build linux

package afxdp_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/steer"
)

// TestSteered combines the port with the steering program: UDP to
// lbAddr:9000 is redirected to the AF_XDP socket and echoed by the worker,
// while everything else (ARP, a TCP connection to the node's own address on
// the same interface, IPv6 neighbour discovery) still goes through the
// kernel. The peer resolves lbAddr by ARP, through the kernel too. The
// worker must see only steered frames.
func TestSteered(t *testing.T) {
	for _, rc := range rings {
		t.Run(rc.name, func(t *testing.T) {
			r := newRigWith(t, 1, false) // ARP must work through the kernel
			prog, err := steer.Load(steer.Options{MaxQueues: 4})
			require.NoError(t, err)
			t.Cleanup(func() { prog.Close() })
			require.NoError(t, r.lb.Do(func() error { return prog.Attach(r.lbLink.Index, steer.AttachDriver) }))

			port := openPort(t, r.lbLink, afxdp.Config{Ring: rc.ring})
			require.NoError(t, prog.RegisterSocket(port.Queue(), port.FD()))
			require.NoError(t, prog.SteerDst(netip.MustParseAddr(lbAddr), unix.IPPROTO_UDP, echoPort))

			w, err := engine.NewWorker(engine.WorkerConfig{
				Ports:  []engine.Port{port},
				Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(reflect)}},
			})
			require.NoError(t, err)
			stop := runWorker(t, w)

			// The kernel keeps serving TCP on the same address.
			ln, err := r.lb.Listen(context.Background(), "tcp4", lbAddr+":8080")
			require.NoError(t, err)
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
			c, err := r.peer.Dial(context.Background(), "tcp4", lbAddr+":8080")
			require.NoError(t, err)
			defer c.Close()

			conn, err := r.peer.ListenPacket(context.Background(), "udp4", peerAddr+":0")
			require.NoError(t, err)
			defer conn.Close()
			const n = 2000
			got := echoTraffic(t, conn, netip.MustParseAddrPort(lbAddr+":9000"), n, 128, 200)
			require.Equal(t, n, got, "steered datagrams echoed")

			// Interleave TCP after the UDP burst too.
			rd := bufio.NewReader(c)
			for i := 0; i < 100; i++ {
				line := string(payload(i, 40)[:16]) + "\n"
				_, err := io.WriteString(c, line)
				require.NoError(t, err)
				back, err := rd.ReadString('\n')
				require.NoError(t, err)
				require.Equal(t, line, back)
			}
			_ = c.(*net.TCPConn).CloseWrite()

			stop()
			drain(port)
			requireNoLeak(t, port)
			var es engine.Stats
			w.Counters().Snapshot(&es)
			require.Zero(t, es.Drops[dropNotEcho], "non-steered frames reached the socket")
			require.EqualValues(t, n, es.TX)
			ss, err := prog.Stats()
			require.NoError(t, err)
			require.GreaterOrEqual(t, ss.Redirected, uint64(n))
			require.NotZero(t, ss.NoMatch, "TCP should have passed to the kernel")
			require.NotZero(t, ss.NotIP, "ARP should have passed to the kernel")
			t.Logf("steer %+v", ss)
		})
	}
}
