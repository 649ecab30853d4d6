package fleetlab

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/internal/lab/netlab"
	"github.com/xdplb/xdplb/internal/lab/promtext"
)

// HTTPClient returns an HTTP client whose connections are made from
// inside n (literal lab addresses only, either family), one per request (no
// keep-alive), each request bounded by timeout.
func HTTPClient(n *netlab.NS, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			return n.Dial(ctx, network, address)
		},
		DisableKeepAlives: true,
	}}
}

// Get fetches url with hc and returns the body; a status other than 200
// is an error.
func Get(hc *http.Client, url string) (string, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// Scrape reads the Prometheus endpoint http://addr/metrics from inside n
// and returns its samples (promtext.Parse).
func Scrape(n *netlab.NS, addr netip.AddrPort) (map[string]float64, error) {
	resp, err := HTTPClient(n, 5*time.Second).Get("http://" + addr.String() + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return promtext.Parse(resp.Body)
}

// UDPEcho sends msg to to from a new connected socket in n (a new flow
// each time) and returns the answer, waiting at most timeout for it. A
// connected socket accepts answers from to only.
func UDPEcho(n *netlab.NS, to netip.AddrPort, msg string, timeout time.Duration) (string, error) {
	c, err := n.Dial(context.Background(), network("udp", to.Addr()), to.String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	buf := make([]byte, 2048)
	k, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	return string(buf[:k]), nil
}

// network returns "tcp4" or "tcp6" ("udp4", "udp6") for a's family.
func network(proto string, a netip.Addr) string {
	if a.Is6() && !a.Is4In6() {
		return proto + "6"
	}
	return proto + "4"
}

// NextHops returns the gateways of n's main-table kernel route to p
// (one, or several for an ECMP route), sorted; nil when there is no such
// route.
func NextHops(n *netlab.NS, p netip.Prefix) ([]netip.Addr, error) {
	family := netlink.FAMILY_V4
	if p.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	routes, err := n.Netlink().RouteListFiltered(family, &netlink.Route{Table: syscall.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	var gws []netip.Addr
	add := func(ip net.IP) {
		if g, ok := netip.AddrFromSlice(ip); ok {
			gws = append(gws, g.Unmap())
		}
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		a, _ := netip.AddrFromSlice(r.Dst.IP)
		if netip.PrefixFrom(a.Unmap(), ones) != p {
			continue
		}
		if r.Gw != nil {
			add(r.Gw)
		}
		for _, nh := range r.MultiPath {
			add(nh.Gw)
		}
	}
	slices.SortFunc(gws, netip.Addr.Compare)
	return gws, nil
}

// LinkStats returns the kernel's counters of interface ifname in n.
func LinkStats(n *netlab.NS, ifname string) (netlink.LinkStatistics, error) {
	lk, err := n.Link(ifname)
	if err != nil {
		return netlink.LinkStatistics{}, err
	}
	if lk.Attrs().Statistics == nil {
		return netlink.LinkStatistics{}, fmt.Errorf("%s: no statistics", ifname)
	}
	return *lk.Attrs().Statistics, nil
}

// Pattern returns n bytes that change with their offset (no run repeats
// within 251 bytes), so a lost, duplicated or reordered segment shows.
func Pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

// VMServer is a VM's servers (ServeVM).
type VMServer struct {
	http *http.Server
	echo net.PacketConn
}

// ServeVM starts, in the VM namespace n, the servers of the VM called
// name at addr:
//
//   - HTTP on httpPort: every request is answered with the VM's name,
//     followed by a blank and the query parameter q when the request has
//     one (GET /?q=TOKEN answers "NAME TOKEN"), so a client learns which
//     VM served which request; GET /bytes/N answers N bytes of Pattern
//     (header X-VM: NAME); a POST answers "NAME SHA256" with the hex
//     SHA-256 of its body; connections are kept alive as long as the
//     client wants;
//   - UDP echo on echoPort (0: none): every datagram is answered with
//     "NAME: " and its payload.
func ServeVM(n *netlab.NS, name string, addr netip.Addr, httpPort, echoPort uint16) (*VMServer, error) {
	ln, err := n.Listen(context.Background(), network("tcp", addr), netip.AddrPortFrom(addr, httpPort).String())
	if err != nil {
		return nil, err
	}
	s := &VMServer{http: &http.Server{ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				// POST: "NAME SHA256-OF-BODY".
				h := sha256.New()
				if _, err := io.Copy(h, r.Body); err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				io.WriteString(w, name+" "+hex.EncodeToString(h.Sum(nil)))
				return
			}
			if rest, ok := strings.CutPrefix(r.URL.Path, "/bytes/"); ok {
				// GET /bytes/N: N bytes of Pattern, served by NAME.
				n, err := strconv.Atoi(rest)
				if err != nil || n < 0 || n > 64<<20 {
					http.Error(w, "bad size", http.StatusBadRequest)
					return
				}
				w.Header().Set("X-VM", name)
				w.Write(Pattern(n))
				return
			}
			answer := name
			if q := r.URL.Query().Get("q"); q != "" {
				answer += " " + q
			}
			io.WriteString(w, answer)
		})}}
	go s.http.Serve(ln)
	if echoPort == 0 {
		return s, nil
	}
	s.echo, err = n.ListenPacket(context.Background(), network("udp", addr), netip.AddrPortFrom(addr, echoPort).String())
	if err != nil {
		s.http.Close()
		return nil, err
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			k, from, err := s.echo.ReadFrom(buf)
			if err != nil {
				return
			}
			s.echo.WriteTo(append([]byte(name+": "), buf[:k]...), from)
		}
	}()
	return s, nil
}

// Close stops the servers and closes their sockets (a socket left open
// keeps its namespace alive).
func (s *VMServer) Close() error {
	err := s.http.Close()
	if s.echo != nil {
		err = errors.Join(err, s.echo.Close())
	}
	return err
}
