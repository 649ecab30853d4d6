package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/fleetlab"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// flBig is the size of the large transfers: far above the MTU, so that a
// sender with TSO on hands its veth segments of up to 64 KiB.
const flBig = 256 << 10

// TestFleetRealTraffic runs the fleet as the kernel sets it up — clients
// and VMs with checksum offload and TSO on, VMs resolving their gateway by
// ARP — and as the lab used to shape it (checksum offload off), and sends
// through the VIP, to every VM: a 256 KiB response (the VM's segments go
// through the Host Agent's return path), a 256 KiB POST (the client's
// segments go through a Mux and the Host Agent's inbound path), and small
// requests on new connections. Every byte must arrive intact, no namespace
// may count a TCP or UDP checksum error, and the data paths must have
// completed partial checksums exactly when offloads are on.
func TestFleetRealTraffic(t *testing.T) {
	for _, tc := range []struct {
		name        string
		offloadsOff bool
	}{
		{"default-offloads", false},
		{"offloads-off", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newFleetLab(t)
			if tc.offloadsOff {
				require.NoError(t, l.fleet.DisableOffloads())
			}
			partialBefore := l.partialCompleted()
			o := l.oracle()
			want := sha256.Sum256(fleetlab.Pattern(flBig))
			for _, vm := range l.pool {
				port := l.nextPort()
				for o.pick(port) != vm.Name {
					port = l.nextPort()
				}
				name, body, err := l.request(port, "GET", fmt.Sprintf("/bytes/%d", flBig), nil)
				require.NoError(t, err, "GET %d bytes from %s", flBig, vm.Name)
				require.Equal(t, vm.Name, name)
				require.True(t, bytes.Equal(fleetlab.Pattern(flBig), body), "%s: the %d-byte response arrived changed (%d bytes)", vm.Name, flBig, len(body))

				port = l.nextPort()
				for o.pick(port) != vm.Name {
					port = l.nextPort()
				}
				_, body, err = l.request(port, "POST", "/", fleetlab.Pattern(flBig))
				require.NoError(t, err, "POST %d bytes to %s", flBig, vm.Name)
				require.Equal(t, vm.Name+" "+hex.EncodeToString(want[:]), string(body), "%s: the server saw another body", vm.Name)
			}
			for i := range 64 {
				_, err := l.oneShot(l.nextPort(), fmt.Sprintf("small%d", i), 5*time.Second)
				require.NoError(t, err, "small request %d", i)
			}

			// No receiver saw a bad checksum.
			nss := []*netlab.NS{l.client}
			for _, vm := range l.pool {
				nss = append(nss, l.fleet.VMs[vm.Name])
			}
			for _, n := range nss {
				snmp, err := fleetlab.SNMP(n)
				require.NoError(t, err)
				for _, k := range []string{"Tcp.InCsumErrors", "Udp.InCsumErrors"} {
					require.Zero(t, snmp[k], "%s in %s", k, n.Name())
				}
			}
			// The partial-checksum path ran exactly when senders offload.
			partial := l.partialCompleted()
			for node, n := range partial {
				d := n - partialBefore[node]
				if tc.offloadsOff {
					require.Zero(t, d, "%s completed partial checksums with offloads off", node)
				} else {
					require.Positive(t, d, "%s completed no partial checksum with offloads on", node)
				}
			}
		})
	}
}

// request sends one HTTP request with a body on a new connection from
// port to the VIP and returns the name of the VM that answered (X-VM, or
// the answer's first word) and the response body.
func (l *fleetLab) request(port uint16, method, path string, body []byte) (string, []byte, error) {
	c, err := l.dial(port, 5*time.Second)
	if err != nil {
		return "", nil, err
	}
	defer c.close()
	if err := c.c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return "", nil, err
	}
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", method, path, flVIP, len(body))
	if _, err := io.WriteString(c.c, req); err != nil {
		return "", nil, err
	}
	if _, err := c.c.Write(body); err != nil {
		return "", nil, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", nil, fmt.Errorf("after %d bytes: %w", len(got), err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", nil, fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	name := resp.Header.Get("X-VM")
	if name == "" {
		name, _, _ = strings.Cut(string(got), " ")
	}
	return name, got, nil
}

// partialCompleted returns, per node, the frames whose partial checksum
// its data path completed (xdplb_partial_checksums_total, all inputs).
func (l *fleetLab) partialCompleted() map[string]float64 {
	l.t.Helper()
	out := map[string]float64{}
	sum := func(node string, m map[string]float64, err error) {
		require.NoError(l.t, err, node)
		for k, v := range m {
			if strings.HasPrefix(k, "xdplb_partial_checksums_total") {
				out[node] += v
			}
		}
	}
	for i := range l.muxes {
		m, err := l.muxMetrics(i)
		sum(fmt.Sprintf("mux%d", i+1), m, err)
	}
	for j := range l.agents {
		m, err := l.agentMetrics(j)
		sum(fmt.Sprintf("host%d", j+1), m, err)
	}
	return out
}

// TestFleetDirectConnections: a backend's service port is reached without
// the VIP — by a neighbour VM on the same host, by a VM on another host,
// by the client straight at the DIP — beside VIP traffic to the same port.
// The VM's SYN-ACK has no NAT state, so its Host Agent passes the
// connection on untranslated instead of rewriting it to the VIP (which
// would make the other end reset it). Then a Host Agent restart: VIP
// connections kept open across it still work (the stateless fallback,
// which direct-connection recognition must not take away).
func TestFleetDirectConnections(t *testing.T) {
	l := newFleetLab(t)
	get := func(from *netlab.NS, src netip.Addr, dst netip.AddrPort) (string, error) {
		var body []byte
		err := from.Do(func() error {
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: 5 * time.Second}
			c, err := d.Dial("tcp4", dst.String())
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := fmt.Fprintf(c, "GET /?q=direct HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", dst.Addr()); err != nil {
				return err
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, err = io.ReadAll(resp.Body)
			return err
		})
		name, _, _ := strings.Cut(string(body), " ")
		return name, err
	}
	dip := func(name string) netip.AddrPort { return netip.AddrPortFrom(vmAddr(name), flDIPPort) }
	cases := []struct {
		what     string
		from     *netlab.NS
		src      netip.Addr
		to       string
		wantHost int // the host whose agent sees the direct connection
	}{
		{"vm11 to its neighbour vm12 (same host)", l.fleet.VMs["vm11"], vmAddr("vm11"), "vm12", 0},
		{"vm11 to vm21 (across hosts)", l.fleet.VMs["vm11"], vmAddr("vm11"), "vm21", 1},
		{"vm22 to vm11 (across hosts)", l.fleet.VMs["vm22"], vmAddr("vm22"), "vm11", 0},
		{"the client straight to vm22's DIP", l.client, flClient, "vm22", 1},
	}
	before := [2]float64{}
	for j := range l.agents {
		m, err := l.agentMetrics(j)
		require.NoError(t, err)
		before[j] = m[`xdplb_nat_packets_total{outcome="direct"}`]
	}
	for round := range 3 {
		for _, tc := range cases {
			name, err := get(tc.from, tc.src, dip(tc.to))
			require.NoError(t, err, "%s (round %d)", tc.what, round)
			require.Equal(t, tc.to, name, tc.what)
			// VIP traffic to the same service port, in between.
			_, err = l.oneShot(l.nextPort(), fmt.Sprintf("vip%d", round), 5*time.Second)
			require.NoError(t, err, "through the VIP after %s", tc.what)
		}
	}
	for j := range l.agents {
		m, err := l.agentMetrics(j)
		require.NoError(t, err)
		require.Positive(t, m[`xdplb_nat_packets_total{outcome="direct"}`]-before[j], "host%d passed no direct packet", j+1)
	}

	// VIP connections to every VM, kept open across a restart of both
	// Host Agents.
	o := l.oracle()
	var kept []*flConn
	for _, vm := range l.pool {
		port := l.nextPort()
		for o.pick(port) != vm.Name {
			port = l.nextPort()
		}
		c, err := l.dial(port, 5*time.Second)
		require.NoError(t, err)
		defer c.close()
		name, err := c.get("before", false, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, vm.Name, name)
		kept = append(kept, c)
	}
	for j := range l.agents {
		require.NoError(t, l.agents[j].Stop(10*time.Second), "host%d agent stop", j+1)
		l.startAgent(j)
	}
	l.waitApplied(l.version)
	for i, c := range kept {
		name, err := c.get("after", false, 15*time.Second)
		require.NoError(t, err, "kept VIP connection to %s after the agents restarted", l.pool[i].Name)
		require.Equal(t, l.pool[i].Name, name)
	}
}
