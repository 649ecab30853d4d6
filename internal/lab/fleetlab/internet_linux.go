package fleetlab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// InternetSubnet is the subnet of the lab's "internet": a namespace
// behind the router standing for the world outside the cloud, where the
// VMs' outbound connections go (Star.AttachInternet).
const InternetSubnet = 40

// InternetAddr is the address of the internet namespace's servers.
var InternetAddr = SubnetAddr(InternetSubnet, 2)

// AttachInternet joins the namespace "inet" to the router on
// InternetSubnet (router interface "i1").
func (s *Star) AttachInternet() (*netlab.NS, error) {
	return s.Attach("inet", "i1", InternetSubnet)
}

// InternetServer is a server in the internet namespace that tells every
// client which source address it saw (ServeInternet), and remembers the
// sources: a VM's outbound connection through source NAT must show the
// VIP, never the VM's own address.
type InternetServer struct {
	lns  []net.Listener
	udp  net.PacketConn
	mu   sync.Mutex
	srcs map[netip.Addr]int // connections and datagrams by source address
	open atomic.Int64       // TCP connections open now
	peak atomic.Int64       // the most open at once
	wg   sync.WaitGroup
}

// ServeInternet starts, in n at addr, a TCP server on each of tcpPorts
// and a UDP server on udpPort (0: none). Each line a TCP client sends is
// answered with the client's address and port as the server saw them, a
// blank and the line ("198.18.100.1:2048 hello\n"); each datagram is
// answered the same way. A TCP connection stays open until its client
// closes it.
func ServeInternet(n *netlab.NS, addr netip.Addr, tcpPorts []uint16, udpPort uint16) (*InternetServer, error) {
	s := &InternetServer{srcs: map[netip.Addr]int{}}
	for _, p := range tcpPorts {
		ln, err := n.Listen(context.Background(), network("tcp", addr), netip.AddrPortFrom(addr, p).String())
		if err != nil {
			s.Close()
			return nil, err
		}
		s.lns = append(s.lns, ln)
		s.wg.Add(1)
		go s.accept(ln)
	}
	if udpPort != 0 {
		pc, err := n.ListenPacket(context.Background(), network("udp", addr), netip.AddrPortFrom(addr, udpPort).String())
		if err != nil {
			s.Close()
			return nil, err
		}
		s.udp = pc
		s.wg.Add(1)
		go s.echo(pc)
	}
	return s, nil
}

func (s *InternetServer) saw(a netip.Addr) {
	s.mu.Lock()
	s.srcs[a.Unmap()]++
	s.mu.Unlock()
}

func (s *InternetServer) accept(ln net.Listener) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		from := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		s.saw(from.Addr())
		if o := s.open.Add(1); o > s.peak.Load() {
			s.peak.Store(o) // racy max; good enough for a report
		}
		go func() {
			defer c.Close()
			defer s.open.Add(-1)
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if _, err := fmt.Fprintf(c, "%v %s", netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), line); err != nil {
					return
				}
			}
		}()
	}
}

func (s *InternetServer) echo(pc net.PacketConn) {
	defer s.wg.Done()
	buf := make([]byte, 2048)
	for {
		k, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		ap := from.(*net.UDPAddr).AddrPort()
		s.saw(ap.Addr())
		pc.WriteTo(fmt.Appendf(nil, "%v %s", netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), buf[:k]), from)
	}
}

// Sources returns how many connections and datagrams came from each
// source address.
func (s *InternetServer) Sources() map[netip.Addr]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.srcs)
}

// Open returns how many TCP connections are open now, and the most that
// were open at once.
func (s *InternetServer) Open() (now, peak int64) { return s.open.Load(), s.peak.Load() }

// Close stops the servers (open connections end when their clients close
// them).
func (s *InternetServer) Close() error {
	var err error
	for _, ln := range s.lns {
		err = errors.Join(err, ln.Close())
	}
	if s.udp != nil {
		err = errors.Join(err, s.udp.Close())
	}
	s.wg.Wait()
	return err
}

// InternetConn is a TCP connection from a VM to an InternetServer
// (DialInternet).
type InternetConn struct {
	c  net.Conn
	br *bufio.Reader
}

// DialInternet opens a TCP connection from namespace n to to, an
// InternetServer's port.
func DialInternet(n *netlab.NS, to netip.AddrPort, timeout time.Duration) (*InternetConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := n.Dial(ctx, network("tcp", to.Addr()), to.String())
	if err != nil {
		return nil, err
	}
	// No keep-alive probes: the tests hold idle connections across a
	// Host Agent's death, while which a probe would leave the host
	// untranslated (its kernel routes what no data path takes) and draw
	// the server's RST.
	if err := c.(*net.TCPConn).SetKeepAlive(false); err != nil {
		c.Close()
		return nil, err
	}
	return &InternetConn{c: c, br: bufio.NewReader(c)}, nil
}

// Ask sends token on the connection and returns the source address and
// port the server saw; its answer must echo the token.
func (c *InternetConn) Ask(token string, timeout time.Duration) (netip.AddrPort, error) {
	if err := c.c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return netip.AddrPort{}, err
	}
	if _, err := fmt.Fprintf(c.c, "%s\n", token); err != nil {
		return netip.AddrPort{}, err
	}
	line, err := c.br.ReadString('\n')
	if err != nil {
		return netip.AddrPort{}, err
	}
	return parseSeen(line, token)
}

// Close closes the connection.
func (c *InternetConn) Close() error { return c.c.Close() }

// AskInternetUDP sends token in one datagram from namespace n to to, an
// InternetServer's UDP port, and returns the source the server saw.
func AskInternetUDP(n *netlab.NS, to netip.AddrPort, token string, timeout time.Duration) (netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := n.Dial(ctx, network("udp", to.Addr()), to.String())
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return netip.AddrPort{}, err
	}
	if _, err := c.Write([]byte(token + "\n")); err != nil {
		return netip.AddrPort{}, err
	}
	buf := make([]byte, 512)
	k, err := c.Read(buf)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return parseSeen(string(buf[:k]), token)
}

// parseSeen reads an InternetServer's answer "ADDR:PORT token\n".
func parseSeen(line, token string) (netip.AddrPort, error) {
	seen, got, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
	if !ok || got != token {
		return netip.AddrPort{}, fmt.Errorf("answer %q to token %q", line, token)
	}
	return netip.ParseAddrPort(seen)
}

// UDPRefused sends a datagram from namespace n to to, where nothing
// listens, and returns nil once the socket reports the port unreachable
// (the ICMP error came back to it); an error if no such report comes
// within timeout.
func UDPRefused(n *netlab.NS, to netip.AddrPort, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := n.Dial(ctx, network("udp", to.Addr()), to.String())
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("anyone?\n")); err != nil {
		return err
	}
	_, err = c.Read(make([]byte, 64))
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil
	case err == nil:
		return fmt.Errorf("%v answered", to)
	}
	return err
}
