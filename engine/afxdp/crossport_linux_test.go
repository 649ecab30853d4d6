//go:build linux

package afxdp_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

var rings = []struct {
	name string
	ring afxdp.Ring
}{
	{"own", afxdp.RingOwn},
	{"asavie", afxdp.RingAsavie},
}

// udpFrame builds an Ethernet/IPv4/UDP frame with correct checksums
// (gopacket is the independent encoder).
func udpFrame(tb testing.TB, dstMAC, srcMAC net.HardwareAddr, src, dst netip.AddrPort, pl []byte) []byte {
	tb.Helper()
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP,
		SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
	udp := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
	require.NoError(tb, udp.SetNetworkLayerForChecksum(ip))
	return gpkt.Serialize(tb, eth, ip, udp, gopacket.Payload(pl))
}

// TestCrossPortMemPort moves frames both ways between an AF_XDP port and a
// MemPort on one worker: frames the AF_XDP port receives are copied out by
// the MemPort and their chunks released back; frames injected into the
// MemPort are copied into the AF_XDP port's UMEM and reach the peer's UDP
// socket.
func TestCrossPortMemPort(t *testing.T) {
	for _, rc := range rings {
		t.Run(rc.name, func(t *testing.T) {
			r := newRig(t, 1)
			prog := redirectAll(t, r.lbLink, 1)
			port := openPort(t, r.lbLink, afxdp.Config{Ring: rc.ring})
			require.NoError(t, prog.Register(0, port.FD()))
			mem, err := engine.NewMemPort(engine.MemPortConfig{Name: "mem", Capture: true})
			require.NoError(t, err)

			toMem := engine.StageFunc(func(b *engine.Batch) {
				for _, p := range b.Packets() {
					if _, _, ok := udp4(p.Data(), echoPort); !ok {
						b.Drop(p, dropNotEcho)
						continue
					}
					p.OutPort = 1
				}
			})
			toXDP := engine.StageFunc(func(b *engine.Batch) {
				for _, p := range b.Packets() {
					p.OutPort = 0
				}
			})
			w, err := engine.NewWorker(engine.WorkerConfig{
				Ports: []engine.Port{port, mem},
				Inputs: []engine.Input{
					{Port: 0, Pipeline: engine.NewPipeline(toMem)},
					{Port: 1, Pipeline: engine.NewPipeline(toXDP)},
				},
			})
			require.NoError(t, err)
			stop := runWorker(t, w)

			conn, err := r.peer.ListenPacket(context.Background(), "udp4", peerAddr+":0")
			require.NoError(t, err)
			defer conn.Close()
			uc := conn.(*net.UDPConn)
			peerAP := netip.MustParseAddrPort(conn.LocalAddr().String())
			lbAP := netip.MustParseAddrPort(lbAddr + ":9000")
			const n, size = 1000, 300

			// MemPort -> AF_XDP (copy into the UMEM) -> peer socket.
			got := exchange(t, func(i int) {
				mem.Inject(udpFrame(t, r.peerLink.MAC, r.lbLink.MAC, lbAP, peerAP, payload(i, size)))
			}, uc, lbAP, n, 128, size)
			require.Equal(t, n, got, "datagrams from the MemPort reaching the peer")

			// Peer -> AF_XDP -> MemPort (copied out; chunks released).
			for i := 0; i < n; i++ {
				_, err := uc.WriteToUDPAddrPort(payload(i, size), lbAP)
				require.NoError(t, err)
				if i%64 == 63 {
					waitFor(t, func() bool { return mem.Stats().TXFrames >= uint64(i+1) })
				}
			}
			waitFor(t, func() bool { return mem.Stats().TXFrames >= n })

			stop()
			drain(port)
			requireNoLeak(t, port)
			require.Equal(t, 4*engine.MaxBatch, mem.FreeFrames(), "MemPort frames leaked")

			seen := map[string]bool{}
			for _, f := range mem.Transmitted() {
				pkt := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
				u, ok := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
				require.True(t, ok, "captured frame is not UDP")
				require.EqualValues(t, echoPort, u.DstPort)
				seen[string(u.Payload)] = true
			}
			for i := 0; i < n; i++ {
				require.True(t, seen[string(payload(i, size))], "datagram %d did not reach the MemPort", i)
			}
			st, err := port.Stats()
			require.NoError(t, err)
			require.EqualValues(t, n, st.TXCopied)
			require.EqualValues(t, n, st.TXFrames)
		})
	}
}

// TestCrossPortAFXDP forwards between two AF_XDP ports with separate UMEMs:
// peer -> xdp0 (port 0) -> copied into xdp1's UMEM (port 1) -> peer2.
func TestCrossPortAFXDP(t *testing.T) {
	for _, rc := range rings {
		t.Run(rc.name, func(t *testing.T) {
			r := newRig(t, 1)
			peer2, err := r.lab.Namespace("peer2")
			require.NoError(t, err)
			x1, p2, err := r.lab.Veth(r.lb, "xdp1", peer2, "eth0")
			require.NoError(t, err)
			require.NoError(t, r.lb.AddAddr("xdp1", "198.18.2.1/24"))
			require.NoError(t, peer2.AddAddr("eth0", "198.18.2.2/24"))
			require.NoError(t, r.peer.AddRoute("198.18.2.0/24", lbAddr))
			require.NoError(t, peer2.AddRoute("198.18.1.0/24", "198.18.2.1"))

			prog := redirectAll(t, r.lbLink, 1)
			in := openPort(t, r.lbLink, afxdp.Config{Ring: rc.ring})
			out := openPort(t, x1, afxdp.Config{Ring: rc.ring})
			require.NoError(t, prog.Register(0, in.FD()))

			forward := engine.StageFunc(func(b *engine.Batch) {
				for _, p := range b.Packets() {
					f := p.Data()
					ip, udp, ok := udp4(f, echoPort)
					if !ok {
						b.Drop(p, dropNotEcho)
						continue
					}
					// The peer's stack offloads the UDP checksum to veth,
					// which hands XDP the frame with only the pseudo-header
					// sum in place: complete it.
					setUDPChecksum(f, ip, udp)
					copy(f[0:6], p2.MAC)
					copy(f[6:12], x1.MAC)
					p.OutPort = 1
				}
			})
			w, err := engine.NewWorker(engine.WorkerConfig{
				Ports:  []engine.Port{in, out},
				Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(forward)}},
			})
			require.NoError(t, err)
			stop := runWorker(t, w)

			sender, err := r.peer.ListenPacket(context.Background(), "udp4", peerAddr+":0")
			require.NoError(t, err)
			defer sender.Close()
			sink, err := peer2.ListenPacket(context.Background(), "udp4", "198.18.2.2:9000")
			require.NoError(t, err)
			defer sink.Close()
			dst := netip.MustParseAddrPort("198.18.2.2:9000")
			from := netip.MustParseAddrPort(sender.LocalAddr().String())
			su := sender.(*net.UDPConn)
			const n, size = 2000, 500
			got := exchange(t, func(i int) {
				_, err := su.WriteToUDPAddrPort(payload(i, size), dst)
				require.NoError(t, err)
			}, sink.(*net.UDPConn), from, n, 128, size)
			sin, _ := in.Stats()
			sout, _ := out.Stats()
			var es engine.Stats
			w.Counters().Snapshot(&es)
			require.Equal(t, n, got, "datagrams forwarded; in %+v out %+v worker %+v", sin, sout, es.DropsByName())

			stop()
			drain(in, out)
			requireNoLeak(t, in)
			requireNoLeak(t, out)
			sin, err = in.Stats()
			require.NoError(t, err)
			sout, err = out.Stats()
			require.NoError(t, err)
			require.Zero(t, sin.TXFrames)
			require.EqualValues(t, n, sout.TXCopied)
			require.EqualValues(t, n, sout.Completed)
		})
	}
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(tb testing.TB, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatal("condition not met in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}
