package fleetlab

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// EchoWatch records the sources of the ICMP echo requests that reach a
// namespace (WatchEchoRequests): the kernel answers them as usual, the
// watch only reads copies through a raw socket.
type EchoWatch struct {
	c    *icmp.PacketConn
	mu   sync.Mutex
	srcs map[netip.Addr]int
	done chan struct{}
}

// WatchEchoRequests starts an EchoWatch in n (IPv4).
func WatchEchoRequests(n *netlab.NS) (*EchoWatch, error) {
	var c *icmp.PacketConn
	if err := n.Do(func() (err error) {
		c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}); err != nil {
		return nil, err
	}
	w := &EchoWatch{c: c, srcs: map[netip.Addr]int{}, done: make(chan struct{})}
	go w.read()
	return w, nil
}

func (w *EchoWatch) read() {
	defer close(w.done)
	buf := make([]byte, 1500)
	for {
		k, from, err := w.c.ReadFrom(buf)
		if err != nil {
			return
		}
		m, err := icmp.ParseMessage(1, buf[:k])
		if err != nil || m.Type != ipv4.ICMPTypeEcho {
			continue
		}
		if a, ok := netip.AddrFromSlice(from.(*net.IPAddr).IP); ok {
			w.mu.Lock()
			w.srcs[a.Unmap()]++
			w.mu.Unlock()
		}
	}
}

// Sources returns how many echo requests came from each source.
func (w *EchoWatch) Sources() map[netip.Addr]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.srcs)
}

// Close stops the watch.
func (w *EchoWatch) Close() error {
	err := w.c.Close()
	<-w.done
	return err
}

// Ping sends count ICMP echo requests with identifier id from n to dst
// (IPv4), one at a time, and waits up to timeout for each reply: an echo
// reply from dst with the same identifier, sequence number and payload.
func Ping(n *netlab.NS, dst netip.Addr, id, count int, timeout time.Duration) error {
	var c *icmp.PacketConn
	if err := n.Do(func() (err error) {
		c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	to := &net.IPAddr{IP: dst.AsSlice()}
	buf := make([]byte, 1500)
	for seq := range count {
		payload := fmt.Appendf(nil, "xdplb ping %d %d", id, seq)
		req, err := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq, Data: payload}}).Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(req, to); err != nil {
			return err
		}
		if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		for answered := false; !answered; {
			k, from, err := c.ReadFrom(buf)
			if err != nil {
				return fmt.Errorf("echo %d (id %d) to %v: %w", seq, id, dst, err)
			}
			m, err := icmp.ParseMessage(1, buf[:k])
			if err != nil || m.Type != ipv4.ICMPTypeEchoReply || !from.(*net.IPAddr).IP.Equal(to.IP) {
				continue
			}
			e, ok := m.Body.(*icmp.Echo)
			if !ok || e.ID != id || e.Seq != seq {
				continue
			}
			if string(e.Data) != string(payload) {
				return errors.New("echo reply with another payload")
			}
			answered = true
		}
	}
	return nil
}
