//go:build linux

package afxdp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/asavie/xdp"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// Test topology: namespace "lb" holds xdp0 (the AF_XDP side), namespace
// "peer" holds eth0, the other end of the veth pair.
const (
	lbAddr   = "198.18.1.1"
	peerAddr = "198.18.1.2"
	echoPort = 9000
)

type rig struct {
	lab              *netlab.Lab
	lb, peer         *netlab.NS
	lbLink, peerLink *netlab.Link
}

// requireAFXDP skips without root and when the kernel has no AF_XDP.
func requireAFXDP(tb testing.TB) {
	tb.Helper()
	netlab.RequireRoot(tb)
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if errors.Is(err, unix.EAFNOSUPPORT) {
		tb.Skip("afxdp: the kernel has no AF_XDP (CONFIG_XDP_SOCKETS)")
	}
	require.NoError(tb, err, "socket(AF_XDP)")
	unix.Close(fd)
}

// newRig builds lb/xdp0 <-> peer/eth0 with queues RX/TX queues per end,
// addresses, and a static neighbour entry on the peer for lbAddr (the
// redirect-everything test program would swallow ARP).
func newRig(tb testing.TB, queues int) *rig {
	tb.Helper()
	return newRigWith(tb, queues, true)
}

// newRigWith is newRig, with the static neighbour entry optional (the
// steering program passes ARP to the kernel).
func newRigWith(tb testing.TB, queues int, staticNeigh bool) *rig {
	tb.Helper()
	requireAFXDP(tb)
	r := &rig{lab: netlab.New(tb, "afx")}
	var err error
	r.lb, err = r.lab.Namespace("lb")
	require.NoError(tb, err)
	r.peer, err = r.lab.Namespace("peer")
	require.NoError(tb, err)
	r.lbLink, r.peerLink, err = r.lab.VethWith(netlab.VethConfig{
		A: r.lb, AName: "xdp0", B: r.peer, BName: "eth0", Queues: queues,
	})
	require.NoError(tb, err)
	require.NoError(tb, r.lb.AddAddr("xdp0", lbAddr+"/24"))
	require.NoError(tb, r.peer.AddAddr("eth0", peerAddr+"/24"))
	if staticNeigh {
		require.NoError(tb, r.peer.Netlink().NeighAdd(&netlink.Neigh{
			LinkIndex: r.peerLink.Index, State: netlink.NUD_PERMANENT,
			IP: net.ParseIP(lbAddr), HardwareAddr: r.lbLink.MAC,
		}))
	}
	return r
}

// redirectAll attaches asavie/xdp's default program (every frame of a
// queue with a registered socket goes to that socket) in native mode to l.
func redirectAll(tb testing.TB, l *netlab.Link, queues int) *xdp.Program {
	tb.Helper()
	prog, err := xdp.NewProgram(queues)
	require.NoError(tb, err)
	tb.Cleanup(func() { prog.Close() })
	require.NoError(tb, l.NS.Do(func() error {
		xl, err := link.AttachXDP(link.XDPOptions{Program: prog.Program, Interface: l.Index, Flags: link.XDPDriverMode})
		if err != nil {
			return err
		}
		tb.Cleanup(func() { xl.Close() })
		return nil
	}))
	return prog
}

// openPort opens an AF_XDP port on l inside its namespace, closed at
// cleanup.
func openPort(tb testing.TB, l *netlab.Link, cfg afxdp.Config) *afxdp.Port {
	tb.Helper()
	cfg.Interface = l.Name
	var p *afxdp.Port
	require.NoError(tb, l.NS.Do(func() (err error) {
		p, err = afxdp.Open(cfg)
		return err
	}))
	tb.Cleanup(func() { p.Close() })
	return p
}

// runWorker runs w until the returned stop function is called.
func runWorker(tb testing.TB, w *engine.Worker) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(tb, <-done)
		})
	}
	tb.Cleanup(stop)
	return stop
}

// drain flushes ports until no chunk is in flight on a TX side.
func drain(ports ...*afxdp.Port) {
	for i := 0; i < 1000; i++ {
		busy := false
		for _, p := range ports {
			_ = p.Flush()
			if p.Frames().TX > 0 {
				busy = true
			}
		}
		if !busy {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// requireNoLeak checks every chunk is either free or on the fill ring.
func requireNoLeak(tb testing.TB, p *afxdp.Port) {
	tb.Helper()
	f := p.Frames()
	require.Zero(tb, f.Held, "%s: chunks held after the worker stopped: %+v", p.Name(), f)
	require.Zero(tb, f.TX, "%s: chunks still on the TX side: %+v", p.Name(), f)
	require.Equal(tb, p.Config().NumFrames, f.Free+f.Kernel, "%s: chunks leaked: %+v", p.Name(), f)
}

var dropNotEcho = engine.RegisterDropReason("afxdp_test_not_echo")

// udp4 returns the offsets of the IPv4 and UDP headers of an Ethernet
// frame carrying IPv4/UDP to dport, or ok false.
func udp4(f []byte, dport uint16) (ip, udp int, ok bool) {
	if len(f) < 14+20+8 || binary.BigEndian.Uint16(f[12:]) != unix.ETH_P_IP {
		return 0, 0, false
	}
	ihl := int(f[14]&0xf) * 4
	if f[14]>>4 != 4 || ihl < 20 || f[14+9] != unix.IPPROTO_UDP || len(f) < 14+ihl+8 {
		return 0, 0, false
	}
	if binary.BigEndian.Uint16(f[14+ihl+2:]) != dport {
		return 0, 0, false
	}
	return 14, 14 + ihl, true
}

// csum folds the one's complement sum of b into sum.
func csum(sum uint32, b []byte) uint32 {
	for len(b) >= 2 {
		sum += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	return sum
}

// setUDPChecksum recomputes the UDP checksum of an IPv4 datagram (the
// kernel may have left a partial one, veth offloads it).
func setUDPChecksum(f []byte, ip, udp int) {
	ulen := int(binary.BigEndian.Uint16(f[udp+4:]))
	seg := f[udp : udp+ulen]
	seg[6], seg[7] = 0, 0
	sum := csum(0, f[ip+12:ip+20])
	sum += unix.IPPROTO_UDP + uint32(ulen)
	sum = csum(sum, seg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	c := ^uint16(sum)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(seg[6:], c)
}

// reflect is the echo pipeline: UDP to echoPort goes back where it came
// from (MACs, addresses and ports swapped); everything else is dropped.
var reflect = engine.StageFunc(func(b *engine.Batch) {
	for _, p := range b.Packets() {
		f := p.Data()
		ip, udp, ok := udp4(f, echoPort)
		if !ok {
			b.Drop(p, dropNotEcho)
			continue
		}
		var mac [6]byte
		copy(mac[:], f[0:6])
		copy(f[0:6], f[6:12])
		copy(f[6:12], mac[:])
		var a [4]byte
		copy(a[:], f[ip+12:ip+16])
		copy(f[ip+12:ip+16], f[ip+16:ip+20])
		copy(f[ip+16:ip+20], a[:])
		sp := binary.BigEndian.Uint16(f[udp:])
		binary.BigEndian.PutUint16(f[udp:], binary.BigEndian.Uint16(f[udp+2:]))
		binary.BigEndian.PutUint16(f[udp+2:], sp)
		setUDPChecksum(f, ip, udp)
	}
})

// payload is the i-th test datagram.
func payload(i, size int) []byte {
	b := make([]byte, size)
	copy(b, fmt.Sprintf("afxdp-%08d-", i))
	for j := 16; j < size; j++ {
		b[j] = byte(i + j)
	}
	return b
}

// echoTraffic sends n datagrams from conn to dst, at most window of them
// unanswered, and returns how many distinct expected replies came back from
// dst.
func echoTraffic(tb testing.TB, conn net.PacketConn, dst netip.AddrPort, n, window, size int) int {
	tb.Helper()
	uc := conn.(*net.UDPConn)
	return exchange(tb, func(i int) {
		_, err := uc.WriteToUDPAddrPort(payload(i, size), dst)
		require.NoError(tb, err)
	}, uc, dst, n, window, size)
}

// exchange calls send(i) for i in [0, n), with at most window datagrams
// sent and not yet received on recv, and returns how many distinct expected
// datagrams (payload(i, size), from from) recv got. It gives up when
// nothing arrives for 5 s; a datagram that is not expected fails the test.
func exchange(tb testing.TB, send func(i int), recv *net.UDPConn, from netip.AddrPort, n, window, size int) int {
	tb.Helper()
	require.NoError(tb, recv.SetReadBuffer(4<<20))
	var mu sync.Mutex
	seen := make(map[int]bool, n)
	var bad []string
	progress := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			_ = recv.SetReadDeadline(time.Now().Add(5 * time.Second))
			k, src, err := recv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			i := -1
			ok := src == from && k == size
			if ok {
				_, err := fmt.Sscanf(string(buf[:16]), "afxdp-%08d-", &i)
				ok = err == nil && i >= 0 && i < n && string(buf[:k]) == string(payload(i, size))
			}
			mu.Lock()
			if ok {
				seen[i] = true
			} else {
				bad = append(bad, fmt.Sprintf("%d bytes from %v: %q", k, src, buf[:min(k, 16)]))
			}
			all := len(seen) == n
			mu.Unlock()
			select {
			case progress <- struct{}{}:
			default:
			}
			if all {
				return
			}
		}
	}()
	unanswered := func(i int) int {
		mu.Lock()
		defer mu.Unlock()
		return i - len(seen)
	}
send:
	for i := 0; i < n; i++ {
		for unanswered(i) >= window {
			select {
			case <-progress:
			case <-done:
				break send // the reader gave up
			}
		}
		send(i)
	}
	<-done
	mu.Lock()
	defer mu.Unlock()
	require.Empty(tb, bad, "unexpected or corrupted datagrams")
	return len(seen)
}
